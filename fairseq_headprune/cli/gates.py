"""`fairseq-headprune gates CHECKPOINT --results-dir DIR [--fold-out OUT.pt]`: heads kept by L0 gates (Voita)."""
from __future__ import annotations

from fairseq_headprune.cli.common import output_checkpoint, results_folder
from fairseq_headprune.studies import gating

USES_FAIRSEQ_OPTIONS = False


def add_args(parser) -> None:
    parser.add_argument("checkpoint", help="a checkpoint fine-tuned with --gated-types")
    parser.add_argument("--results-dir", required=True)
    parser.add_argument("--fold-out", metavar="OUT.pt", help="also write the gates folded into a stock checkpoint")


def run(cfg, args) -> None:
    if args.fold_out:
        output_checkpoint("--fold-out", args.fold_out, args.checkpoint)
    with results_folder(args.results_dir):
        outputs = gating.run(args.checkpoint, args.results_dir, args.fold_out)
    for out in outputs:
        print(f"wrote {out}")
