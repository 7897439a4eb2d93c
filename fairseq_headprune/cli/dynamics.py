"""`fairseq-headprune dynamics DATA --checkpoint-dir DIR`: pruning curves of every epoch of a training run."""
from __future__ import annotations

from fairseq_headprune.cli.common import ResultsDir, options_from, results_folder
from fairseq_headprune.options import add_arguments
from fairseq_headprune.studies import dynamics


def add_args(parser) -> None:
    g = parser.add_argument_group("dynamics")
    add_arguments(g, ResultsDir)
    add_arguments(g, dynamics.DynamicsOptions)


def run(cfg, args) -> None:
    options = options_from(dynamics.DynamicsOptions, args, subset=cfg.dataset.gen_subset)
    options.check()
    with results_folder(args.results_dir):
        outputs = dynamics.run(cfg, options, args.results_dir)
    for out in outputs:
        print(f"wrote {out}")
