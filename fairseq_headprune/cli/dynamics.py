"""`fairseq-headprune dynamics DATA --checkpoint-dir DIR`: pruning curves of every epoch of a training run."""
from __future__ import annotations

from fairseq_headprune.cli.common import options_from, results_folder
from fairseq_headprune.studies import dynamics


def add_args(parser) -> None:
    g = parser.add_argument_group("dynamics")
    g.add_argument("--checkpoint-dir", required=True, help="folder of epoch checkpoints (checkpointN.pt)")
    g.add_argument("--results-dir", required=True)
    g.add_argument("--epochs", help="comma-separated epochs to analyse (default: all)")
    g.add_argument("--step", type=float, default=0.1)
    g.add_argument("--importance-subset", default="valid")
    g.add_argument("--references", help="raw reference file of --gen-subset")
    g.add_argument("--watch", action="store_true", help="keep waiting for new epochs while training runs")
    g.add_argument("--watch-until-epoch", type=int, default=0, help="with --watch, stop after this epoch")
    g.add_argument("--poll-seconds", type=float, default=60.0)


def run(cfg, args) -> None:
    options = options_from(dynamics.DynamicsOptions, args, subset=cfg.dataset.gen_subset)
    options.check()
    with results_folder(args.results_dir):
        outputs = dynamics.run(cfg, options, args.results_dir)
    for out in outputs:
        print(f"wrote {out}")
