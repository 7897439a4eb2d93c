"""The one exception type whose message is shown to the user as a one-line error (exit code 2)."""
import os
import sys


class UserError(Exception):
    """Bad input: a missing file, a spec that does not fit the model, a results file from another run."""


def report_user_errors() -> None:
    """Make an uncaught UserError in fairseq's own commands (fairseq-train, fairseq-generate with --user-dir) one
    line on stderr and exit code 2, as fairseq-headprune shows it: fairseq's CLIs have no error handling of their
    own, and a bad flag of this module is a usage error, not a crash. Other exceptions keep their traceback."""
    previous = sys.excepthook
    if getattr(previous, "_headprune", False):
        return

    def hook(kind, error, traceback):
        if issubclass(kind, UserError):
            print(f"error: {error}", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(2)  # the interpreter would exit with 1 after any excepthook
        previous(kind, error, traceback)

    hook._headprune = True
    sys.excepthook = hook
