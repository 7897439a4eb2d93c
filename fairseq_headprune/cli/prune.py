"""`fairseq-headprune prune`: pruning curves by importance, oracle or random order (Michel et al. §4)."""
from __future__ import annotations

from fairseq_headprune.cli.common import ResultsDir, options_from, output_checkpoint, results_folder
from fairseq_headprune.fairseq_io.loading import load
from fairseq_headprune.options import add_arguments
from fairseq_headprune.studies import pruning


def add_args(parser) -> None:
    g = parser.add_argument_group("prune")
    add_arguments(g, ResultsDir)
    add_arguments(g, pruning.PruneOptions)


def run(cfg, args) -> None:
    options = options_from(pruning.PruneOptions, args, subset=cfg.dataset.gen_subset)
    options.check()
    if options.save_pruned:
        output_checkpoint("--save-pruned", options.save_pruned, cfg.common_eval.path or "")
    with results_folder(args.results_dir):
        outputs = pruning.run(load(cfg), options, args.results_dir)
    for out in outputs:
        print(f"wrote {out}")
