"""`fairseq-headprune compare --gated A.pt ... --importance I.json`: Michel's I_h pruning vs Voita's L0 gates."""
from __future__ import annotations

from fairseq_headprune.cli.common import ResultsDir, options_from, results_folder
from fairseq_headprune.options import add_arguments
from fairseq_headprune.fairseq_io.loading import load
from fairseq_headprune.studies import compare


def add_args(parser) -> None:
    g = parser.add_argument_group("compare")
    add_arguments(g, ResultsDir)
    add_arguments(g, compare.CompareOptions)


def run(cfg, args) -> None:
    options = options_from(compare.CompareOptions, args, subset=cfg.dataset.gen_subset)
    options.check()
    with results_folder(args.results_dir):
        outputs = compare.run(load(cfg), options, args.results_dir)
    for out in outputs:
        print(f"wrote {out}")
