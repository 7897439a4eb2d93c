"""`fairseq-headprune speed --heads SPEC [--engine ct2 --compute-type int8]`: generation speed of unpruned, masked
and pruned models (Table 4), in fairseq or in CTranslate2."""
from __future__ import annotations

from fairseq_headprune.cli.common import options_from, results_folder
from fairseq_headprune.fairseq_io.loading import load
from fairseq_headprune.studies import speed, speed_ct2
from fairseq_headprune.errors import UserError
from fairseq_headprune.studies.deploy import PLAIN_TASKS


def add_args(parser) -> None:
    g = parser.add_argument_group("speed")
    g.add_argument("--results-dir", required=True)
    g.add_argument("--heads", required=True, help="heads to prune: TYPE:LAYER:HEADS,... or @file.json")
    g.add_argument("--batch-sizes", default="1,4,16,64")
    g.add_argument("--runs", type=int, default=3)
    g.add_argument("--num-sentences", type=int, default=128, help="sentences decoded per run and batch size")
    g.add_argument("--engine", default="fairseq",
                   help="fairseq (fairseq's generator) or ct2 (both models exported to CTranslate2, one thread and "
                        "all threads)")
    g.add_argument("--compute-type", help="with --engine ct2: CTranslate2's compute type (float32, int8, "
                                          "int8_float32, ...; default float32)")


def check_ct2_task(task_cfg) -> None:
    """--engine ct2 decodes from the source tokens alone: under a task that puts language tokens in the decoder
    (multilingual, mBART) it would time other translations than the model's, so it is refused in one line."""
    name = task_cfg.get("_name") if hasattr(task_cfg, "get") else getattr(task_cfg, "_name", None)
    if name not in PLAIN_TASKS:
        raise UserError(f"--engine ct2 times CTranslate2 on the translation task only, not {name}: its language "
                        "tokens are not passed to CTranslate2 (time it with --engine fairseq)")


def run(cfg, args) -> None:
    options = options_from(speed.SpeedOptions, args, subset=cfg.dataset.gen_subset)
    options.check()
    study = speed_ct2 if options.engine == "ct2" else speed
    if options.engine == "ct2":  # refused before the model is loaded
        speed_ct2.check_compute_type(options.compute_type)
        speed_ct2.ct2_decoding(cfg.generation)
        check_ct2_task(cfg.task)
    with results_folder(args.results_dir):
        out = study.run(load(cfg), options, args.results_dir)
    print(f"wrote {out}")
