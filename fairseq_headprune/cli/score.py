"""`fairseq-headprune score`: Michel et al.'s head importance from one forward+backward pass over a subset."""
from __future__ import annotations

from fairseq_headprune.cli.common import ResultsDir, options_from, results_folder
from fairseq_headprune.options import add_arguments
from fairseq_headprune.fairseq_io.loading import load, progress_for
from fairseq_headprune.studies import scoring


def add_args(parser) -> None:
    group = parser.add_argument_group("score")
    add_arguments(group, ResultsDir)
    add_arguments(group, scoring.ScoreOptions)


def run(cfg, args) -> None:
    options = options_from(scoring.ScoreOptions, args, subset=cfg.dataset.gen_subset)
    with results_folder(args.results_dir):
        loaded = load(cfg)
        out = scoring.run(loaded, options, args.results_dir, progress_for(cfg, f"score {options.subset}"))
    print(f"wrote {out}")
