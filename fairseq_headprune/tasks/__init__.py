"""fairseq tasks registered by name: NAME_headprune twins of every task, installing masks and gates at load."""
