"""`fairseq-headprune score`: Michel et al.'s head importance from one forward+backward pass over a subset."""
from __future__ import annotations

from fairseq_headprune.cli.common import options_from, results_folder
from fairseq_headprune.fairseq_io.loading import load, progress_for
from fairseq_headprune.studies import scoring


def add_args(parser) -> None:
    group = parser.add_argument_group("score")
    group.add_argument("--results-dir", required=True, help="folder for importance.json")
    group.add_argument(
        "--no-normalize-by-layer", action="store_true", help="keep raw scores instead of l2-normalising each layer"
    )
    group.add_argument("--per-position", action="store_true",
                       help="|dl_t/dxi_h| per target token, as Michel et al.'s code (default: per sentence, as the "
                            "paper's expectation over examples)")


def run(cfg, args) -> None:
    options = options_from(scoring.ScoreOptions, args, subset=cfg.dataset.gen_subset,
                           normalize_by_layer=not args.no_normalize_by_layer)
    with results_folder(args.results_dir):
        loaded = load(cfg)
        out = scoring.run(loaded, options, args.results_dir, progress_for(cfg, f"score {options.subset}"))
    print(f"wrote {out}")
