"""`fairseq-headprune prune`: pruning curves by importance, oracle or random order (Michel et al. §4)."""
from __future__ import annotations

from fairseq_headprune.cli.common import add_sweep_options, options_from, output_checkpoint, results_folder
from fairseq_headprune.core.heads import ATTENTION_TYPES
from fairseq_headprune.fairseq_io.loading import load
from fairseq_headprune.studies import pruning


def add_args(parser) -> None:
    g = parser.add_argument_group("prune")
    g.add_argument("--results-dir", required=True)
    g.add_argument("--order", default="importance", help=f"comma-separated, from {', '.join(pruning.ORDERS)}")
    g.add_argument("--types", default=",".join(ATTENTION_TYPES), help="attention types to prune, comma-separated")
    g.add_argument("--step", type=float, default=0.1, help="share of the heads masked at each step")
    g.add_argument("--importance", help="importance.json of `score` (default: computed on --importance-subset)")
    g.add_argument("--importance-subset", default="valid")
    g.add_argument("--reestimate", action="store_true", help="re-score I_h on the remaining heads after each step")
    g.add_argument("--ablation", help="ablation-single.jsonl of `ablate`, for --order oracle")
    g.add_argument("--random-seed", type=int, default=1)
    g.add_argument("--references", help="raw reference file of the subset (default: its decoded targets)")
    add_sweep_options(g, masks="pruning steps")
    g.add_argument("--save-percent", type=float, default=50.0,
                   help="write DIR/heads-ORDER[-TYPES]-PCT.json, the heads each order prunes at this percent")
    g.add_argument("--save-pruned", metavar="OUT.pt",
                   help="also write a checkpoint with those heads (of the first order) physically removed")


def run(cfg, args) -> None:
    options = options_from(pruning.PruneOptions, args, subset=cfg.dataset.gen_subset)
    options.check()
    if options.save_pruned:
        output_checkpoint("--save-pruned", options.save_pruned, cfg.common_eval.path or "")
    with results_folder(args.results_dir):
        outputs = pruning.run(load(cfg), options, args.results_dir)
    for out in outputs:
        print(f"wrote {out}")
