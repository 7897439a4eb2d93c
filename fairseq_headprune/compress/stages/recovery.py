"""The recovery's settings, as the recover stage runs it and --stop-after shrink's folder writes it: the recovery set
(a seeded sample of train), what makes two recoveries one run (its key), RecoverOptions and the fairseq-train
arguments and command they become."""
from __future__ import annotations

import os
import shlex
from typing import Callable, Dict, List, Optional, Tuple

from fairseq_headprune.prune import recover, recovery_config
from fairseq_headprune.prune.recovery_config import DEFAULT_DISTILL, RecoverOptions
from fairseq_headprune.compress.stages.common import split_subsets, subset_tokens
from fairseq_headprune.compress.stages.results import Choice
from fairseq_headprune.records.identity import file_sha256
from fairseq_headprune.records.log import read_json, write_json_atomic

INPUTS = "inputs.json"  # beside a recovery run elsewhere: what it read (compress.stages.elsewhere)


def task_language_args(task_cfg) -> List[str]:
    """fairseq-train's options for the directions this run reads: -s/-t, and the multilingual task's --lang-pairs
    (a hydra task is a DictConfig, a legacy one such as the multilingual task's a Namespace)."""
    def get(key):
        return task_cfg.get(key) if hasattr(task_cfg, "get") else getattr(task_cfg, key, None)

    args = ["-s", get("source_lang"), "-t", get("target_lang")] if get("source_lang") else []
    pairs = get("lang_pairs")  # the multilingual task keeps it as a list once parsed
    return args + (["--lang-pairs", pairs if isinstance(pairs, str) else ",".join(pairs)] if pairs else [])


def encoder_args(cfg) -> List[str]:
    """The tokenizer and BPE options of a loaded config as command-line options (fairseq's own names), for a
    fairseq-train that must encode raw text as fairseq-generate would: interpolated values (the language pair)
    and false switches left to fairseq."""
    argv = []
    for kind in ("tokenizer", "bpe"):
        section = cfg.get(kind)
        if not section or not section.get("_name"):
            continue
        argv += [f"--{kind}", str(section["_name"])]
        for key in section:
            if key == "_name" or section._get_node(key)._is_interpolation():
                continue
            value = section[key]
            if value is None or value is False:
                continue
            argv += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return argv


def recover_key(loaded, options, shrunk_sha: str, sample: Dict) -> Dict:
    """What makes two recoveries the same run (their resume key): student, teacher, options, the recovery set."""
    o = options
    key = {"student": shrunk_sha, "teacher": file_sha256(loaded.checkpoint),
           "recover_args": list(o.recover_args)}
    if o.distillation.hidden_weight:  # (absent when off: the records of runs before the option still resume)
        key["distill_hidden_weight"] = o.distillation.hidden_weight
    if o.distillation.signal != DEFAULT_DISTILL:  # (likewise)
        key["distill"] = o.distillation.signal
    if o.distillation.source:  # (likewise)
        key["distill_source"] = [file_sha256(p) for p in o.distillation.source]
        key["distill_nbest"] = o.distillation.nbest
    if o.train_options:  # (likewise)
        key["train_options"] = list(o.train_options)
    if sample.get("sampled"):  # (likewise: all of train, as before the option)
        key["sample"] = {"sentences": o.recover_sentences, "seed": o.sample_seed}
    return key


def recovery_set(loaded, options, choice: Optional[Choice], stages_root: str, log: Callable,
                 prepare: bool = True) -> Tuple[str, Dict]:
    """The recovery's data folder and what it trains on: the user's (or the choice's, valid split) when train
    holds at most --recover-sentences pairs, else a folder whose train subset is a random sample of that many
    (OUT/stages/recover-data, drawn once per data, size and seed; `prepare` False: its path only)."""
    o = options
    base = (choice.data if choice else None) or loaded.cfg.task.data
    train_subset, _, _ = split_subsets(o.train_options)
    total, _ = subset_tokens(loaded, train_subset)
    if o.recover_sentences >= total:
        return base, {"subset": train_subset, "sentences": total, "of": total, "sampled": False}
    folder = os.path.join(stages_root, "recover-data")
    described = {"subset": train_subset, "sentences": o.recover_sentences, "of": total, "sampled": True,
                 "seed": o.sample_seed}
    if not prepare:
        return folder, described
    identity = {"data": recovery_config.data_fingerprint(base, [train_subset]), "sentences": o.recover_sentences,
                "seed": o.sample_seed, "subset": train_subset}
    held = read_json(os.path.join(folder, "sample.json"))
    if not held or held.get("identity") != identity or not links_hold(folder):
        drawn = recover.sample_subset(base, train_subset, o.recover_sentences, o.sample_seed, folder)
        write_json_atomic(os.path.join(folder, "sample.json"), {"identity": identity, "drawn": drawn})
        log(f"recovery set: {o.recover_sentences} of the {total} pairs of '{train_subset}', drawn at random "
            f"(seed {o.sample_seed}) into {folder}")
    return folder, described


def links_hold(folder: str) -> bool:
    """Every file of a drawn folder is there (its links to the files it did not sample lead somewhere: a folder
    moved with the run folder links into the old place)."""
    return all(os.path.exists(os.path.join(folder, name)) for name in os.listdir(folder))


def recover_options(loaded, options, out: str, work_dir: Optional[str],
                    layers: Optional[Dict] = None) -> RecoverOptions:
    """`layers`: the shrink record's; a cut decoder compares each kept layer with the teacher layer its
    reconstruction aimed at (`teacher_outputs`), an uncut one layer by layer."""
    cfg = loaded.cfg
    languages = task_language_args(cfg.task)
    hidden_map = ((layers or {}).get("teacher_outputs") or {}).get("dec")
    train_subset, valid_subset, train_options = split_subsets(options.train_options)
    return RecoverOptions(teacher=loaded.checkpoint, out=out, epochs=options.budget_epochs,
                          updates=options.budget_updates, distillation=options.distillation,
                          distill_hidden_layers=",".join(map(str, hidden_map)) if hidden_map and
                          options.distillation.hidden_weight else "",
                          train_subset=train_subset,
                          valid_subset=valid_subset, work_dir=work_dir,
                          train_args=languages + (encoder_args(cfg) if options.distillation.source else [])
                          + train_options + list(options.recover_args))


def recovery_argv(loaded, options, data: str, student: str, settings: RecoverOptions) -> Tuple[List[str], bool]:
    """The recovery's fairseq-train arguments (`settings`: recover_options'), and whether they hold the student's
    own model and task options (its pruned heads, its shape: read from its checkpoint once the shrink wrote it)."""
    model_cfg = loaded.saved_cfg.model
    arch = (model_cfg.get("arch") if hasattr(model_cfg, "get") else getattr(model_cfg, "arch", None)) \
        or "transformer"
    task = recovery_config.saved_task_name(loaded.saved_cfg)
    saved = []
    if os.path.exists(student):  # (--dry-run: the student does not exist yet)
        student_cfg = recovery_config.saved_cfg(recovery_config.load_state(student), student)
        arch = recovery_config.config_field(student_cfg["model"], "arch") or arch
        saved = recovery_config.student_args(student, arch, task)
    return recovery_config.training_argv(os.path.abspath(data), student, settings, task, arch, saved), bool(saved)


def recovery_command(loaded, options, data: str, folder: str, student: str, layers: Optional[Dict] = None) -> str:
    """The recovery's fairseq-train command, as the recover stage runs it (from OUT/stages/shrink's student into
    OUT/stages/recover/run)."""
    settings = recover_options(loaded, options, os.path.join(folder, "model.pt"), os.path.join(folder, "run"), layers)
    argv, complete = recovery_argv(loaded, options, data, student, settings)
    return "fairseq-train " + shlex.join(argv) + ("" if complete else "  (and the student's model options, read "
                                                  "from its checkpoint once the shrink wrote it)")
