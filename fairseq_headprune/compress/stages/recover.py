"""The recover stage: fairseq-train (prune.recover.recover) distils the unpruned model into the shrunk one, early
stopping on valid, resumable from its own checkpoints; or, with --recovered, a recovery run elsewhere
(compress.stages.elsewhere writes its folder) adopted. Also the recovery set (a seeded sample of train) and the
recovery's fairseq-train arguments and command, for --dry-run and --stop-after shrink."""
from __future__ import annotations

import os
import shlex
from typing import Callable, Dict, List, Optional, Tuple

from fairseq_headprune.prune import recover, recovery_config
from fairseq_headprune.prune.recovery_config import DEFAULT_DISTILL, RecoverOptions
from fairseq_headprune.compress.stages.common import split_subsets, subset_tokens
from fairseq_headprune.compress.stages.contract import Context, Results, Stage
from fairseq_headprune.engines.fairseq_engine import torch_threads
from fairseq_headprune.errors import UserError
from fairseq_headprune.fairseq_io.checkpoint_io import save_state
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


def recovery_set(loaded, options, choice: Optional[Dict], stages_root: str, log: Callable,
                 prepare: bool = True) -> Tuple[str, Dict]:
    """The recovery's data folder and what it trains on: the user's (or the choice's, valid split) when train
    holds at most --recover-sentences pairs, else a folder whose train subset is a random sample of that many
    (OUT/stages/recover-data, drawn once per data, size and seed; `prepare` False: its path only)."""
    o = options
    base = (choice or {}).get("data") or loaded.cfg.task.data
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


def build(folder: str, loaded, options, shrunk: Dict, data: str, sample: Dict, threads: int,
          log: Callable) -> Dict:
    """The shrunk model distilled from the unpruned one (--budget-epochs 0: the shrunk model as it is)."""
    o = options
    if o.budget_epochs == 0:
        return {"checkpoint": shrunk["checkpoint"], "checkpoint_sha256": shrunk["checkpoint_sha256"],
                "budget_epochs": 0, "recovered": False}
    out = os.path.join(folder, "model.pt")
    for path in (out, recover.record_path(out)):  # a shorter run's result: recovery goes on from its checkpoints
        if os.path.exists(path):
            os.remove(path)
    settings = recover_options(loaded, options, out, os.path.join(folder, "run"), shrunk.get("layers"))
    with torch_threads(threads):  # the threads the command was given (every other stage times on one)
        record = recover.recover(data, shrunk["checkpoint"], settings, log=log)
    return {"checkpoint": out, "checkpoint_sha256": file_sha256(out), "budget_epochs": o.budget_epochs,
            "budget_updates": o.budget_updates, "recovered": True, "updates": record["updates"],
            "updates_at_best": record["updates_at_best"], "sentences": sample["sentences"], "sample": sample,
            "distillation_set": record.get("distillation_set"),
            "processes": record["processes"], "device": record["device"], "threads": threads,
            "epochs": record["epochs"], "best_checkpoint": record["best_checkpoint"],
            "peak_rss_gib": record["peak_rss_gib"], "distill": settings.distillation.signal,
            "distill_hidden": {"weight": settings.distillation.hidden_weight,
                               "teacher_layers": settings.distill_hidden_layers or "one to one"}
            if settings.distillation.hidden_weight else None}


def adopt(folder: str, options, shrunk: Dict, sample: Dict) -> Dict:
    """--recovered CKPT: a recovery that ran elsewhere, checked to be a student of this run's shrink (every
    parameter's name and shape; where the file it was fine-tuned from is here, that file; where its folder's
    inputs.json is beside it, the student named there), written as the recovered model (weights and config, no
    optimizer state)."""
    import torch  # heavy: loaded when a recovery is adopted

    path = options.recovered
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's to fix
        raise UserError(f"--recovered: cannot load {path}: {type(e).__name__}") from None
    student = torch.load(shrunk["checkpoint"], map_location="cpu", weights_only=False)["model"]
    weights = state.get("model") or {}
    shapes = {k: tuple(v.shape) for k, v in weights.items() if torch.is_tensor(v)}
    wanted = {k: tuple(v.shape) for k, v in student.items() if torch.is_tensor(v)}
    differs = sorted(set(shapes) ^ set(wanted)) or sorted(k for k in wanted if shapes[k] != wanted[k])
    if differs:
        raise UserError(f"--recovered {path} is not a student of this run's shrink ({shrunk['checkpoint']}): "
                        f"{differs[0]} differs")
    cfg = state.get("cfg") or {}
    source = ((cfg.get("checkpoint") or {}).get("finetune_from_model")) if hasattr(cfg, "get") else None
    if source and os.path.isfile(source) and file_sha256(source) != shrunk["checkpoint_sha256"]:
        raise UserError(f"--recovered {path} was fine-tuned from {source}, not from this run's shrink")
    inputs = read_json(os.path.join(os.path.dirname(os.path.abspath(path)), INPUTS)) or {}
    if inputs.get("student_sha256", shrunk["checkpoint_sha256"]) != shrunk["checkpoint_sha256"]:
        raise UserError(f"--recovered {path}: its folder's {INPUTS} names another student than this run's shrink "
                        "(a recovery folder of an earlier shrink)")
    state.pop("last_optimizer_state", None)
    out = os.path.join(folder, "model.pt")
    save_state(state, out + ".tmp")
    os.replace(out + ".tmp", out)
    trained = (state.get("optimizer_history") or [{}])[-1]
    distributed = (cfg.get("distributed_training") or {}) if hasattr(cfg, "get") else {}
    return {"checkpoint": out, "checkpoint_sha256": file_sha256(out), "budget_epochs": options.budget_epochs,
            "recovered": True, "elsewhere": os.path.abspath(path), "updates": trained.get("num_updates"),
            "updates_at_best": trained.get("num_updates"), "sentences": sample["sentences"], "sample": sample,
            "processes": int(distributed.get("distributed_world_size") or 1),
            "device": "elsewhere", "epochs": [], "best_checkpoint": os.path.basename(path),
            "distill": options.distillation.signal, "distill_hidden": None}


def identity(context: Context, results: Results) -> Dict:
    """--recovered's file by content, else the recovery's key (recover_key) and budget."""
    o = context.options
    if o.recovered:
        return {"recovered": file_sha256(o.recovered)}
    _, sample = recovery_set(context.loaded, o, results.get("choice"), context.stages_root, context.log, False)
    key = recover_key(context.loaded, o, results["shrink"]["checkpoint_sha256"], sample)
    return {"run": key, "budget_epochs": o.budget_epochs, "budget_updates": o.budget_updates}


def check(context: Context, identity: Dict) -> None:
    """--recovered inside the stage's own folder (which the stage replaces), or a recovery of a larger budget held
    there for this very run (`identity`: the stage's): refused."""
    o, folder = context.options, context.folder("recover")
    if o.recovered:
        if os.path.realpath(o.recovered).startswith(os.path.realpath(folder) + os.sep):
            raise UserError(f"--recovered {o.recovered} is inside the recover stage's own folder, which the stage "
                            "replaces: move it out first")
        return
    record = context.held("recover")
    if record and record["identity"].get("run") == identity["run"]:
        for name, flag in (("budget_epochs", "--budget-epochs"), ("budget_updates", "--budget-updates")):
            held = record["result"].get(name)
            if held is not None and held > getattr(o, name):
                raise UserError(f"{folder} holds a recovery of {flag} {held}: give {flag} {held} or more, or "
                                "another --out")


def resume_key(identity: Dict) -> Optional[Dict]:
    """A recovery run here keeps its checkpoints while its key holds (a larger budget extends it); --recovered's
    adoption, none."""
    return identity.get("run")


def build_stage(folder: str, context: Context, results: Results) -> Dict:
    """The recovery run here, or --recovered's adopted."""
    o, shrunk = context.options, results["shrink"]
    data, sample = recovery_set(context.loaded, o, results.get("choice"), context.stages_root, context.log,
                                prepare=o.budget_epochs > 0 and not o.recovered)
    if o.recovered:
        return adopt(folder, o, shrunk, sample)
    return build(folder, context.loaded, o, shrunk, data, sample, context.threads, context.log)


STAGE = Stage("recover", identity, build_stage, check=check, resume_key=resume_key)
