"""The `report` command: one loaded model through every study, its claims checked, rendered as markdown and HTML."""
