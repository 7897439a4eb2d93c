"""`fairseq-headprune ablate`: single-head and keep-one-head ablations with significance (Michel et al. §3).

--num-shards/--shard-id are fairseq's own options; here they split the masks (never the data: BLEU is a corpus
score). Under torchrun, RANK and WORLD_SIZE set them and rank 0 gathers one file.
"""
from __future__ import annotations

from fairseq_headprune.cli.common import ResultsDir, options_from, readable_file, results_folder
from fairseq_headprune.fairseq_io.loading import load, progress_for
from fairseq_headprune.options import add_arguments
from fairseq_headprune.studies import ablation


def add_args(parser) -> None:
    g = parser.add_argument_group("ablate")
    add_arguments(g, ResultsDir)
    add_arguments(g, ablation.AblationOptions)


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
