"""`fairseq-headprune translate DIR < raw.src > out.tgt`: raw sentences on stdin, detokenised translations on stdout,
with the deployable folder `export-ct2` or `compress` wrote (prune.translate).

  fairseq-headprune translate DIR [--beam N] [--batch-size N] [--compute-type float32]

DIR: the folder export-ct2 wrote, a compress output folder or its ct2/, wherever it was copied to. Every input line
gives one output line, in order; a line not translated as given is named by a warning on stderr.
"""
from __future__ import annotations

import sys

from fairseq_headprune.prune.translate import UNTRANSLATED_EXIT, TranslateOptions, run as translate
from fairseq_headprune.options import add_arguments, from_arguments

USES_FAIRSEQ_OPTIONS = False

EXIT_CODES = (f"exit codes: 0 every line translated; 2 nothing translated (a bad folder or option, one line on "
              f"stderr); {UNTRANSLATED_EXIT} every line answered, but some not as given, each named by a warning on "
              "stderr (bytes that are not UTF-8 read as U+FFFD, a source longer than the model's positions "
              "truncated, a line the tokenizer cannot encode answered empty). An empty line is answered with an "
              "empty line.")


def add_args(parser) -> None:
    add_arguments(parser, TranslateOptions)  # declared once, on TranslateOptions (DIR too)
    parser.epilog = EXIT_CODES


def warn(number: int, notes) -> None:
    print(f"fairseq-headprune translate: warning: line {number}: {'; '.join(notes)}", file=sys.stderr, flush=True)


def line_writer(stream):
    """Write one line to `stream` in UTF-8 whatever the locale's encoding (as text where it has no byte buffer)."""
    binary = getattr(stream, "buffer", None)
    if binary is None:
        return lambda text: stream.write(text + "\n")
    return lambda text: binary.write(text.encode("utf-8") + b"\n")


def run(cfg, args) -> int:
    """Translate stdin to stdout; the exit code (UNTRANSLATED_EXIT when a warning named a line)."""
    options = from_arguments(TranslateOptions, args)
    lines, warned = translate(options, sys.stdin.buffer, line_writer(sys.stdout), warn)
    sys.stdout.flush()
    getattr(sys.stdout, "buffer", sys.stdout).flush()
    if not warned:
        return 0
    print(f"fairseq-headprune translate: {warned} of {lines} lines not translated as given (named above): exit code "
          f"{UNTRANSLATED_EXIT}", file=sys.stderr, flush=True)
    return UNTRANSLATED_EXIT
