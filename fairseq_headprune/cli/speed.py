"""`fairseq-headprune speed --heads SPEC`: generation speed of unpruned, masked and pruned models (Table 4)."""
from __future__ import annotations

from fairseq_headprune.cli.common import options_from, results_folder
from fairseq_headprune.loading import load
from fairseq_headprune.studies import speed


def add_args(parser) -> None:
    g = parser.add_argument_group("speed")
    g.add_argument("--results-dir", required=True)
    g.add_argument("--heads", required=True, help="heads to prune: TYPE:LAYER:HEADS,... or @file.json")
    g.add_argument("--batch-sizes", default="1,4,16,64")
    g.add_argument("--runs", type=int, default=3)
    g.add_argument("--num-sentences", type=int, default=128, help="sentences decoded per run and batch size")


def run(cfg, args) -> None:
    options = options_from(speed.SpeedOptions, args, subset=cfg.dataset.gen_subset)
    options.check()
    with results_folder(args.results_dir):
        out = speed.run(load(cfg), options, args.results_dir)
    print(f"wrote {out}")
