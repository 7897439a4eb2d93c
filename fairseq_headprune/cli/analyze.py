"""`fairseq-headprune analyze`: confidence, LRP relevance and function of each head (Voita et al.)."""
from __future__ import annotations

from fairseq_headprune.cli.common import ResultsDir, options_from, results_folder
from fairseq_headprune.options import add_arguments
from fairseq_headprune.fairseq_io.loading import load, progress_for
from fairseq_headprune.studies import analysis


def add_args(parser) -> None:
    g = parser.add_argument_group("analyze")
    add_arguments(g, ResultsDir)
    add_arguments(g, analysis.AnalyzeOptions)


def run(cfg, args) -> None:
    options = options_from(analysis.AnalyzeOptions, args, subset=cfg.dataset.gen_subset)
    options.check()
    with results_folder(args.results_dir):
        outputs = analysis.run(load(cfg), options, args.results_dir, progress_for(cfg, f"analyze {options.subset}"))
    for out in outputs:
        print(f"wrote {out}")
