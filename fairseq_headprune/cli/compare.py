"""`fairseq-headprune compare --gated A.pt ... --importance I.json`: Michel's I_h pruning vs Voita's L0 gates."""
from __future__ import annotations

from fairseq_headprune.cli.common import add_sweep_options, options_from, results_folder
from fairseq_headprune.fairseq_io.loading import load
from fairseq_headprune.studies import compare


def add_args(parser) -> None:
    g = parser.add_argument_group("compare")
    g.add_argument("--results-dir", required=True)
    g.add_argument("--importance", required=True, help="importance.json of `fairseq-headprune score` (Michel's I_h)")
    g.add_argument("--gated", nargs="+", required=True, metavar="CHECKPOINT",
                   help="checkpoints fine-tuned with --gated-types (Voita's L0 gates)")
    g.add_argument("--references", help="raw reference file of the subset (default: its decoded targets)")
    add_sweep_options(g, masks="Michel masks")


def run(cfg, args) -> None:
    options = options_from(compare.CompareOptions, args, subset=cfg.dataset.gen_subset)
    options.check()
    with results_folder(args.results_dir):
        outputs = compare.run(load(cfg), options, args.results_dir)
    for out in outputs:
        print(f"wrote {out}")
