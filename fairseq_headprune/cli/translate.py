"""`fairseq-headprune translate DIR < raw.src > out.tgt`: raw sentences on stdin, detokenised translations on stdout,
with the deployable folder `export-ct2` or `compress` wrote (compress.translate).

  fairseq-headprune translate DIR [--beam N] [--batch-size N] [--compute-type float32]

DIR: the folder export-ct2 wrote, a compress output folder or its ct2/, wherever it was copied to.
"""
from __future__ import annotations

import sys

from fairseq_headprune.prune.translate import TranslateOptions, run as translate
from fairseq_headprune.options import add_arguments, from_arguments

USES_FAIRSEQ_OPTIONS = False


def add_args(parser) -> None:
    add_arguments(parser, TranslateOptions)  # declared once, on TranslateOptions (DIR too)


def run(cfg, args) -> None:
    options = from_arguments(TranslateOptions, args)
    translate(options, sys.stdin, lambda text: sys.stdout.write(text + "\n"))
    sys.stdout.flush()
