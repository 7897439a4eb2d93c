"""`fairseq-headprune compress DATA --path CKPT --out DIR --speedup 1.5`: from a checkpoint to a deployable model at a
stated speed (or the fastest within a stated BLEU loss), in one staged, resumable run (compress.pipeline).

  fairseq-headprune compress DATA --path CKPT --out DIR --speedup 1.5 [--engine ct2-int8|ct2-float32|fairseq] \\
      [--budget-epochs 4] [--gen-subset test] [fairseq decoding options: --beam 5 --max-tokens 4000 ...]
  fairseq-headprune compress DATA --path CKPT --out DIR --max-bleu-loss 0.3 ...

Writes DIR/ct2/ (the CTranslate2 model, ct2 engines), DIR/model.pt (the pruned fairseq checkpoint),
DIR/MODEL_CARD.md and DIR/compress.json; DIR/stages/ keeps each stage, so the same command resumes.
"""
from __future__ import annotations

import shlex
from dataclasses import fields
from typing import Dict, Tuple

from fairseq.dataclass.configs import DistributedTrainingConfig

from fairseq_headprune.compress import preflight
from fairseq_headprune.compress.options import CompressOptions
from fairseq_headprune.options import add_arguments, from_arguments
from fairseq_headprune.compress import pipeline
from fairseq_headprune.fairseq_io.fairseq_options import INERT, RULES
from fairseq_headprune.fairseq_io.loading import PACKAGE_DIR, load


# fairseq options compress refuses though fairseq-generate takes them (preflight.recover_arguments says why)
REFUSED_FAIRSEQ_OPTIONS = ("--disable-validation",)


def add_args(parser) -> None:
    add_arguments(parser.add_argument_group("compress"), CompressOptions)  # declared once, on CompressOptions


def user_argv(argv):
    """The tokens as the user gave them (without the --user-dir the command adds for itself)."""
    out = list(argv)
    if out[:2] == ["--user-dir", PACKAGE_DIR]:
        out = out[2:]
    return out


def training_dests() -> Dict[str, str]:
    """fairseq-train's options among those the command parses (fairseq-generate's parser): every distributed
    option, and the checkpoint, dataset and common options no decoding reads (fairseq_options: inert) plus --seed.
    dest -> flag."""
    dests = {f.name for f in fields(DistributedTrainingConfig)} | {"seed"}
    for section in ("checkpoint", "dataset", "common"):
        dests |= {name for name, kind in RULES[section].items() if kind == INERT}
    return {d: "--" + d.replace("_", "-") for d in dests}


def training_options(args) -> Tuple[str, ...]:
    """The fairseq-train options the user gave compress itself, as fairseq-train tokens with their parsed values:
    the recovery applies them (or refuses them in one line, as recover refuses its own)."""
    given = {a.split("=", 1)[0] for a in user_argv(args.command_argv) if a.startswith("--")}
    out = []
    for dest, flag in sorted(training_dests().items()):
        if flag not in given or not hasattr(args, dest):
            continue
        value = getattr(args, dest)
        if isinstance(value, bool):
            out += [flag] if value else []
        elif value is not None:
            out += [flag, str(value)]
    return tuple(out)


def run(cfg, args) -> None:
    options = from_arguments(CompressOptions, args, gen_subset=cfg.dataset.gen_subset,
                             train_options=training_options(args),
                             command="fairseq-headprune compress " + shlex.join(user_argv(args.command_argv)))
    options.check()  # every option applied or refused before the model loads
    preflight.output_folder(options.out, preflight.command_inputs(cfg.task.data, cfg.common_eval.path, (
        options.references, *options.also_references)))  # never over --path, DATA or a file it did not write
    record = pipeline.run(load(cfg), options)
    if record:
        for name in ("ct2", "model.pt", "MODEL_CARD.md", "compress.json"):
            if name != "ct2" or record["stages"]["export"].get("ct2"):
                print(f"wrote {options.out.rstrip('/')}/{name}")
