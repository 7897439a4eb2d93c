"""`fairseq-headprune speed --heads SPEC [--engine ct2 --compute-type int8]`: generation speed of unpruned, masked
and pruned models (Table 4), in fairseq or in CTranslate2."""
from __future__ import annotations

from fairseq_headprune.cli.common import ResultsDir, options_from, results_folder
from fairseq_headprune.options import add_arguments
from fairseq_headprune.fairseq_io.loading import load
from fairseq_headprune.engines.ct2 import check_compute_type, check_task, ct2_decoding
from fairseq_headprune.studies import speed, speed_ct2


def add_args(parser) -> None:
    g = parser.add_argument_group("speed")
    add_arguments(g, ResultsDir)
    add_arguments(g, speed.SpeedOptions)


def check_ct2_task(task_cfg) -> None:
    """--engine ct2 decodes as fairseq does under translation and the multilingual task (its target language token
    as CTranslate2's target prefix); mBART's task is refused in one line (engines.ct2.check_task)."""
    check_task(task_cfg, "speed --engine ct2")


def run(cfg, args) -> None:
    options = options_from(speed.SpeedOptions, args, subset=cfg.dataset.gen_subset)
    options.check()
    study = speed_ct2 if options.engine == "ct2" else speed
    if options.engine == "ct2":  # refused before the model is loaded
        check_compute_type(options.compute_type)
        ct2_decoding(cfg.generation)
        check_ct2_task(cfg.task)
    with results_folder(args.results_dir):
        out = study.run(load(cfg), options, args.results_dir)
    print(f"wrote {out}")
