"""The one exception type whose message is shown to the user as a one-line error (exit code 2)."""


class UserError(Exception):
    """Bad input: a missing file, a spec that does not fit the model, a results file from another run."""
