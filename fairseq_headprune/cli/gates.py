"""`fairseq-headprune gates CHECKPOINT --results-dir DIR [--fold-out OUT.pt]`: heads kept by L0 gates (Voita)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from fairseq_headprune.cli.common import output_checkpoint, results_dir, results_folder
from fairseq_headprune.options import add_arguments, from_arguments, option
from fairseq_headprune.studies import gating

USES_FAIRSEQ_OPTIONS = False


@dataclass
class GatesArgs:
    """gates' options."""

    checkpoint: str = option(flag="checkpoint", help="a checkpoint fine-tuned with --gated-types")
    results_dir: str = results_dir()
    fold_out: Optional[str] = option(None, flag="--fold-out", metavar="OUT.pt",
                                     help="also write the gates folded into a stock checkpoint")


def add_args(parser) -> None:
    add_arguments(parser, GatesArgs)


def run(cfg, args) -> None:
    a = from_arguments(GatesArgs, args)
    if a.fold_out:
        output_checkpoint("--fold-out", a.fold_out, a.checkpoint)
    with results_folder(a.results_dir):
        outputs = gating.run(a.checkpoint, a.results_dir, a.fold_out)
    for out in outputs:
        print(f"wrote {out}")
