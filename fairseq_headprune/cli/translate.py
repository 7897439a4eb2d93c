"""`fairseq-headprune translate DIR < raw.src > out.tgt`: raw sentences on stdin, detokenised translations on stdout,
with the deployable folder `export-ct2` or `compress` wrote (compress.translate).

  fairseq-headprune translate DIR [--beam N] [--batch-size N] [--compute-type float32]

DIR: the folder export-ct2 wrote, a compress output folder or its ct2/, wherever it was copied to.
"""
from __future__ import annotations

import sys

from fairseq_headprune.compress.translate import TranslateOptions, run as translate
from fairseq_headprune.options import add_arguments, from_arguments

USES_FAIRSEQ_OPTIONS = False


def add_args(parser) -> None:
    parser.add_argument("folder", metavar="DIR", help="the deployable model folder (a compress output or its ct2/)")
    add_arguments(parser, TranslateOptions)  # declared once, on TranslateOptions


def run(cfg, args) -> None:
    options = from_arguments(TranslateOptions, args)
    translate(options, sys.stdin, lambda text: sys.stdout.write(text + "\n"))
    sys.stdout.flush()
