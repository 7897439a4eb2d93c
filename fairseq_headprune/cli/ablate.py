"""`fairseq-headprune ablate`: single-head and keep-one-head ablations with significance (Michel et al. §3).

--num-shards/--shard-id are fairseq's own options; here they split the masks (never the data: BLEU is a corpus
score). Under torchrun, RANK and WORLD_SIZE set them and rank 0 gathers one file.
"""
from __future__ import annotations

from fairseq_headprune.cli.common import add_sweep_options, options_from, readable_file, results_folder
from fairseq_headprune.core.heads import ATTENTION_TYPES
from fairseq_headprune.fairseq_io.loading import load, progress_for
from fairseq_headprune.studies import ablation


def add_args(parser) -> None:
    g = parser.add_argument_group("ablate")
    g.add_argument("--results-dir", required=True)
    g.add_argument("--mode", choices=["single", "keep-one"], default="single")
    g.add_argument("--metric", choices=["bleu", "loss"], default="bleu")
    g.add_argument("--types", default=",".join(ATTENTION_TYPES), help="attention types to sweep, comma-separated")
    g.add_argument("--references", help="raw reference file of the subset (default: its decoded targets)")
    g.add_argument("--select-subset", help="keep-one: choose each layer's head on this subset (default --gen-subset)")
    g.add_argument("--report-subset", help="keep-one: report the chosen heads on this subset")
    g.add_argument("--report-references", help="raw reference file of --report-subset")
    g.add_argument("--report-metric", choices=["bleu", "loss"],
                   help="keep-one: metric of the --report-subset sweep (default --metric)")
    g.add_argument("--bootstrap-samples", type=int, default=1000)
    g.add_argument("--bootstrap-sample-ratio", type=float, default=1.0,
                   help="size of each bootstrap resample as a share of the set (compare-mt's default is 0.5)")
    g.add_argument("--significance", type=float, default=0.01, help="p-value threshold")
    g.add_argument("--bootstrap-seed", type=int, default=1)
    add_sweep_options(g)


def run(cfg, args) -> None:
    options = options_from(ablation.AblationOptions, args, subset=cfg.dataset.gen_subset)
    options.check()
    readable_file("--references", options.references)
    readable_file("--report-references", options.report_references)
    shard = ablation.shard_of(cfg.dataset.num_shards, cfg.dataset.shard_id)
    with results_folder(args.results_dir, shard):
        loaded = load(cfg)
        distributed = ablation.init_distributed()
        outputs = ablation.run(loaded, options, args.results_dir, shard, distributed,
                               progress_for(cfg, f"ablate {options.mode}"))
    for out in outputs:
        print(f"wrote {out}")
