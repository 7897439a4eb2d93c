"""Recover what pruning lost: a short fine-tuning of the pruned model towards the unpruned one, on fairseq's own
training loop (fairseq_cli.train: its optimizer, scheduler, validation, early stopping, checkpointing and resume).

The student is any checkpoint this package reads (a `shrink`ed or `remove`d model with uneven heads, or the
unpruned model itself: the control). Its architecture and weights come from its own file, never from the command
line; the teacher is frozen inside the criterion `label_smoothed_cross_entropy_distill`. Three signals:
  logits     KL to the teacher's token distributions, mixed with the label-smoothed loss on the references
             (and, with a hidden weight, the decoder layers' outputs pulled towards the teacher's);
  sequences  the teacher's beam translations of the training source as targets (Kim & Rush 2016), no KL;
  both       KL to the teacher on the teacher's translations;
  none       plain label-smoothed fine-tuning on the references (a baseline).
Every run keeps its fairseq checkpoints in a work folder with a `recover-run.json` identity: a rerun resumes from
`checkpoint_last.pt`, and a rerun with another student, teacher, data or setting is refused.
"""
from __future__ import annotations

import argparse
import copy
import glob
import hashlib
import json
import logging
import os
import resource
import shutil
import socket
import time
from dataclasses import asdict
from typing import Dict, List, Optional

import numpy as np
import torch
from fairseq.data import data_utils, indexed_dataset

from fairseq_headprune.prune.shrink import random_ids
from fairseq_headprune.fairseq_io.checkpoint_io import record_path_for, save_state, write_checkpoint_pair
from fairseq_headprune.errors import UserError
from fairseq_headprune.options import finite_numbers, usage_error
from fairseq_headprune.records.identity import file_sha256
from fairseq_headprune.records.log import FolderLock, atomic_output, read_json, write_json_atomic
from fairseq_headprune.prune.sequence_targets import distillation_set_data, language_pair, teacher_targets_data
from fairseq_headprune.fairseq_io.checkpoint_io import output_lock
from fairseq_headprune.prune.recovery_config import (TUNABLE_MODEL_OPTIONS, RecoverOptions, as_mapping,
                                                      check_hidden_layers, config_field, data_fingerprint, load_state,
                                                      option_names, refuse_foreign_options, refuse_teacher_decoding,
                                                      same_shape_except_heads, saved_cfg, saved_task_name,
                                                      set_config_field, source_encoders, training_argv,
                                                      vocabulary_sizes)


# --------------------------------------------------------------------------------------------- the run


def repair_last_checkpoint(work_dir: str) -> Optional[str]:
    """fairseq writes checkpointN.pt atomically but *copies* it to checkpoint_last.pt; a kill during the copy
    leaves a truncated checkpoint_last.pt. Put the newest readable epoch checkpoint in its place (atomically)."""
    last = os.path.join(work_dir, "checkpoint_last.pt")
    if not os.path.exists(last):
        return None
    try:
        torch.load(last, map_location="cpu", weights_only=False)
        return None
    except Exception:
        pass
    saved = [p for p in glob.glob(os.path.join(work_dir, "checkpoint*.pt"))
             if os.path.basename(p) not in ("checkpoint_last.pt", "checkpoint_best.pt")]
    epochs = sorted(saved, key=os.path.getmtime)  # checkpointN.pt and checkpoint_N_U.pt, each written atomically
    for candidate in reversed(epochs):
        try:
            torch.load(candidate, map_location="cpu", weights_only=False)
        except Exception:
            continue
        with atomic_output(last, "wb") as f, open(candidate, "rb") as src:
            shutil.copyfileobj(src, f)
        return candidate
    os.remove(last)  # nothing readable: start again from the student
    return "the student"


# the parts of fairseq-train's config that make two runs the same run; budgets (a run may be extended, as
# fairseq-train allows), paths, logging and checkpoint-keeping options are left out
IDENTITY_FIELDS = {
    "task": None, "criterion": None, "optimizer": None, "lr_scheduler": None,
    "optimization": ("lr", "clip_norm", "sentence_avg", "update_freq"),
    "dataset": ("max_tokens", "batch_size", "required_batch_size_multiple", "train_subset", "valid_subset"),
    "common": ("seed", "fp16", "bf16"),
}
UNSTABLE_KEYS = {"data", "teacher_path"}  # paths: the hashes below stand for them
# settings added after run folders existed, with the value every older run trained with: an identity written
# before a field existed still matches a rerun that leaves it at that value
ADDED_LATER = {"criterion.distill_hidden_weight": 0.0, "criterion.distill_hidden_layers": ""}


def run_identity(data: str, student: str, options: RecoverOptions, cfg) -> dict:
    """What makes two recover runs the same run: the student, teacher and data by content, the settings by value."""
    identity = {
        "student_sha256": file_sha256(student),
        "teacher_sha256": file_sha256(options.teacher) if options.teacher else None,
        "data": data_fingerprint(data, [options.train_subset, options.valid_subset]),
        "distill": options.distillation.signal,
    }
    for group, keys in IDENTITY_FIELDS.items():
        values = as_mapping(cfg.get(group))
        if group == "task" and isinstance(cfg.get(group), argparse.Namespace):  # a legacy task holds every option
            own = legacy_task_options(config_field(cfg.task, "_name") or config_field(cfg.task, "task"))
            values = {k: v for k, v in values.items() if k in own}
        for key, value in values.items():
            if (keys is None or key in keys) and key not in UNSTABLE_KEYS and _jsonable(value):
                identity[f"{group}.{key}"] = value
    if options.distillation.source:  # (absent without one: the identities of runs before the option still match)
        identity["distill_source"] = [file_sha256(p) for p in options.distillation.source]
        identity["distill_nbest"] = options.distillation.nbest
        identity["distill_source_encoders"] = source_encoders(cfg)[2]
    model = cfg.model if isinstance(cfg.model, argparse.Namespace) else None
    for name in TUNABLE_MODEL_OPTIONS:
        identity[f"model.{name}"] = getattr(model, name, None) if model is not None else cfg.model.get(name)
    return identity


def _jsonable(value) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def trained_checkpoints(work_dir: str) -> List[str]:
    """fairseq's checkpoints in a run folder: a folder without any has nothing to resume (nor to protect)."""
    return sorted(glob.glob(os.path.join(work_dir, "checkpoint*.pt")))


def legacy_task_options(name: str) -> set:
    """The option names (dests) a legacy argparse task adds: its Namespace config carries every other option too
    (budgets, paths), which must not make a resumed or extended run another run."""
    from fairseq.tasks import TASK_REGISTRY

    parser = argparse.ArgumentParser(add_help=False)
    task = TASK_REGISTRY.get(name)
    if task is not None and hasattr(task, "add_args"):
        task.add_args(parser)
    return {a.dest for a in parser._actions} - {"help"}


def check_identity(work_dir: str, identity: dict, elsewhere: str = "another --work-dir") -> None:
    """Write the run's identity, or refuse a folder holding another run's checkpoints (a folder a refused or
    failed run left without checkpoints is taken over: it holds nothing to resume)."""
    identity = json.loads(json.dumps(identity))  # as it is read back (tuples as lists)
    path = os.path.join(work_dir, "recover-run.json")
    old = read_json(path)
    if old is None or not trained_checkpoints(work_dir):
        os.makedirs(work_dir, exist_ok=True)
        write_json_atomic(path, identity)
        return
    for key in sorted(set(identity) | set(old)):
        if old.get(key, ADDED_LATER.get(key)) != identity.get(key, ADDED_LATER.get(key)):
            raise UserError(f"{work_dir} holds a recover run with another {key} ({_short(old.get(key))} there, "
                            f"{_short(identity.get(key))} now): use {elsewhere}, or remove that folder")


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


def fairseq_train_cfg(argv: List[str], student_cfg, options: RecoverOptions):
    """fairseq-train's config from `argv`, with the student's model config and the task settings it was trained
    with (any task option the user gives wins)."""
    from fairseq import options as fairseq_options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf, omegaconf_no_object_check
    from omegaconf import open_dict

    parser = fairseq_options.get_training_parser()

    def refuse(message: str):  # argparse's own error, as one line instead of fairseq-train's 200-line usage
        raise UserError(f"fairseq-train options: {usage_error(parser, message)}")

    parser.error = refuse
    finite_numbers(parser)  # nan or inf: refused as any bad value is
    try:
        args = fairseq_options.parse_args_and_arch(parser, input_args=argv)
    except ValueError as e:  # fairseq's own checks of option combinations
        raise UserError(f"fairseq-train options: {str(e).splitlines()[0]}") from None
    except SyntaxError as e:  # fairseq reads list and float options (--lr, --adam-betas) as Python literals
        raise UserError(f"fairseq-train options: {(e.text or '').strip()!r} is not a number or a list of "
                        "numbers") from None
    try:
        cfg = convert_namespace_to_omegaconf(args)
    except Exception as e:  # hydra's composition errors (a tokenizer that needs the language pair, ...)
        hint = ": give the language pair (-s SRC -t TGT)" if "source_lang" in str(e) or "target_lang" in str(e) else ""
        raise UserError(f"fairseq-train options: {str(e).splitlines()[0]}{hint}") from None
    given = set(option_names(options.train_args))
    in_argv = set(option_names(argv))  # the user's and recover's defaults
    model = copy.deepcopy(student_cfg["model"])
    for name in TUNABLE_MODEL_OPTIONS:
        if "--" + name.replace("_", "-") in in_argv:
            value = getattr(args, name)
            if isinstance(model, argparse.Namespace):
                setattr(model, name, value)
            else:
                model[name] = value
    saved_task = as_mapping(student_cfg.get("task"))
    with open_dict(cfg), omegaconf_no_object_check():  # a legacy model config is a Namespace, as fairseq keeps it
        cfg.model = model
        if saved_task_name(student_cfg) == config_field(cfg.task, "_name"):
            for key, value in saved_task.items():
                if key in ("_name", "task", "data", "train_subset", "valid_subset") or key not in cfg.task:
                    continue
                if "--" + key.replace("_", "-") not in given:
                    set_config_field(cfg.task, key, value)
    return cfg


def recover(data: str, student: str, options: RecoverOptions, log=print) -> dict:
    """Fine-tune `student` towards `options.teacher` with fairseq-train and write `options.out` and its record.
    Everything a user can get wrong is refused before anything is written (no run folder, teacher cache or
    identity a corrected rerun would trip on); OUT is locked for the whole run, so two runs cannot both write it."""
    start = time.perf_counter()
    options.check()
    student_state = load_state(student)
    student_cfg = saved_cfg(student_state, student)
    arch = config_field(student_cfg["model"], "arch") or config_field(student_cfg["model"], "_name")
    refuse_foreign_options(options.train_args, arch)
    if options.teacher:
        teacher_state = load_state(options.teacher)
        teacher_model_cfg = saved_cfg(teacher_state, options.teacher)["model"]
        differs = same_shape_except_heads(student_cfg["model"], teacher_model_cfg)
        if differs:
            raise UserError(f"the student is not a pruned model of the teacher's network: {differs}")
        depths = [config_field(cfg, "decoder_layers") for cfg in (student_cfg["model"], teacher_model_cfg)]
        check_hidden_layers(options, *depths)
        a, b = vocabulary_sizes(student_state["model"]), vocabulary_sizes(teacher_state["model"])
        if a != b:
            raise UserError(f"the teacher's dictionaries differ from the student's (embedding rows {b} and {a}): "
                            "distillation compares distributions over one vocabulary")
        del teacher_state
    for subset in (options.train_subset, options.valid_subset):
        if not glob.glob(os.path.join(data.split(os.pathsep)[0], subset + ".*")):
            raise UserError(f"no '{subset}' subset in {data}")
    task_name = saved_task_name(student_cfg)
    refuse_teacher_decoding(options.distillation.signal, task_name)
    cfg = fairseq_train_cfg(training_argv(data, student, options, task_name, arch), student_cfg, options)
    preflight(cfg, data, student_state["model"], options)
    del student_state
    with output_lock(options.out):  # held to the end: a second run of this OUT is refused, whatever its work dir
        refuse_output_of_another_run(options, student)
        train_data, distillation_set = data, None
        if options.distillation.signal in ("sequences", "both"):
            train_data = teacher_targets_data(data, options, log=log)
            cfg = fairseq_train_cfg(training_argv(train_data, student, options, task_name, arch), student_cfg,
                                    options)
        if options.distillation.source:
            made = distillation_set_data(train_data, options, source_encoders(cfg), log=log)
            train_data, distillation_set = made["data"], {k: made[k] for k in ("sources", "pairs", "nbest")}
            cfg = fairseq_train_cfg(training_argv(train_data, student, options, task_name, arch), student_cfg,
                                    options)
            if "--upsample-primary" not in option_names(options.train_args) and \
                    int(config_field(cfg.task, "upsample_primary") or 1) < 1:
                # fairseq's default (-1) cannot concatenate a second shard
                set_config_field(cfg.task, "upsample_primary", 1)
            distillation_set.update(mix(train_data, options.train_subset, made["pairs"],
                                        int(config_field(cfg.task, "upsample_primary"))))
        work_dir = options.resolved_work_dir()
        created = not os.path.exists(work_dir)
        os.makedirs(work_dir, exist_ok=True)
        try:
            with FolderLock(work_dir):  # one process per run folder: another would interleave fairseq's checkpoints
                return _train_and_write(cfg, data, student, options, work_dir, start, log, distillation_set)
        except BaseException:
            if created and not trained_checkpoints(work_dir):  # nothing to resume: leave nothing behind
                shutil.rmtree(work_dir, ignore_errors=True)
            raise


def mix(data: str, subset: str, pairs: int, upsample_primary: int) -> Dict[str, object]:
    """The proportion a distillation set is trained in: fairseq's --upsample-primary (the training subset's own
    pairs counted that many times an epoch, the set's once) and the set's share of an epoch's pairs."""
    src, tgt = language_pair(data, subset)
    primary = len(indexed_dataset.make_dataset(os.path.join(data, f"{subset}.{src}-{tgt}.{tgt}"), impl="mmap"))
    return {"upsample_primary": upsample_primary, "train_pairs": primary,
            "share": round(pairs / max(pairs + upsample_primary * primary, 1), 4)}


def refuse_output_of_another_run(options: RecoverOptions, student: str) -> None:
    """An existing OUT is replaced only by the run that wrote it (a rerun resuming or extending it: its record
    names this run folder and student) or with --force."""
    if not os.path.exists(options.out) or options.force:
        return
    record = read_json(record_path(options.out)) or {}
    if record.get("work_dir") == os.path.abspath(options.resolved_work_dir()) and os.path.exists(student) and \
            record.get("student_sha256") == file_sha256(student):
        return
    how = "--force to replace it" if options.command == "recover" else "use another --out or remove it"
    raise UserError(f"--out {options.out} exists, written by another run ({how})")


def reusable_student(path: str, record_file: str, source: str, data: str, options_record: dict) -> bool:
    """`shrink --recover-epochs` rerun (after a kill, or to extend the recovery): True when `path` is the student
    this shrink would write again (its record names the same source, data and options, and this very file), so
    it is reused, never rewritten; False when there is none. Any other file there is refused: a finished
    recovery's record may still point at it."""
    if not os.path.exists(path):
        return False
    record = read_json(record_file)
    why = None
    if record is None:
        why = f"it has no record {record_file}"
    elif record.get("checkpoint_sha256") != file_sha256(path):
        why = "its record describes another file"
    elif record.get("source_sha256") != file_sha256(source):
        why = "it was shrunk from another checkpoint"
    elif (record.get("calibration") or {}).get("data") != os.path.abspath(data):
        why = "it was calibrated on other data"
    else:
        saved = record.get("options") or {}
        differs = sorted(k for k in set(saved) | set(options_record) if saved.get(k) != options_record.get(k))
        if differs:
            why = (f"it was shrunk with another {differs[0]} ({_short(saved.get(differs[0]))} there, "
                   f"{_short(options_record.get(differs[0]))} now)")
    if why:
        raise UserError(f"{path} exists and {why}: a recovered model may point at it; use another --out or remove it")
    return True


def preflight(cfg, data: str, student_weights: Dict[str, torch.Tensor], options: RecoverOptions) -> None:
    """What fairseq-train would fail on after its run folder exists, refused in one line before: fp16 without a
    GPU, DATA's dictionaries against the student's embeddings, task options the student's model refuses
    (--mask-heads naming a removed head), a --max-tokens below the longest sentence."""
    from fairseq import tasks

    common = cfg.common
    if (config_field(common, "fp16") or config_field(common, "memory_efficient_fp16")) and (
            config_field(common, "cpu") or not torch.cuda.is_available()):
        raise UserError("--fp16 trains on a GPU: none is available here (leave --fp16 out on CPU)")
    processes, cores = cpu_processes(cfg), os.cpu_count() or 1
    if processes > cores:
        raise UserError(f"--distributed-world-size {processes} trains in {processes} CPU processes and this machine "
                        f"has {cores} cores")
    try:  # as fairseq-train sets them up first (a UserError of this package's tasks passes unchanged)
        task = tasks.setup_task(cfg.task)
        model = task.build_model(cfg.model)
    except OSError as e:  # a dictionary missing from DATA
        raise UserError(f"cannot set up the task on {data}: {e}") from None
    built = vocabulary_sizes(model.state_dict())
    saved = vocabulary_sizes(student_weights)
    differs = sorted(k for k in saved if built.get(k) != saved[k])
    if differs:
        raise UserError(f"the dictionaries of {data} do not fit the student: {differs[0]} has {built.get(differs[0])} "
                        f"rows from DATA's dictionary but {saved[differs[0]]} in the checkpoint")
    max_tokens = config_field(cfg.dataset, "max_tokens")
    if max_tokens:
        positions = min(int(config_field(cfg.model, "max_source_positions") or 1024),
                        int(config_field(cfg.model, "max_target_positions") or 1024))
        for subset in (options.train_subset, options.valid_subset):
            longest = longest_sentence(data, subset, positions)
            if longest > max_tokens:
                raise UserError(f"--max-tokens {max_tokens} is below the longest sentence of '{subset}' ({longest} "
                                "tokens): fairseq would skip or refuse it")


def longest_sentence(data: str, subset: str, positions: int) -> int:
    """The longest side of any sentence of the subset's binarised files that fits the model's positions."""
    import numpy as np
    from fairseq.data import indexed_dataset

    longest = 0
    for folder in data.split(os.pathsep):
        for idx in glob.glob(os.path.join(folder, glob.escape(subset) + ".*.idx")):
            prefix = idx[:-4]
            impl = indexed_dataset.infer_dataset_impl(prefix)
            if impl is None:
                continue
            dataset = indexed_dataset.make_dataset(prefix, impl=impl)
            sizes = np.array(dataset.sizes, copy=True)  # a view of the mmap, gone with the dataset
            del dataset
            sizes = sizes[sizes <= positions]
            if sizes.size:
                longest = max(longest, int(sizes.max()))
    return longest


def _train_and_write(cfg, data, student, options, work_dir, start, log, distillation_set=None) -> dict:
    from fairseq import checkpoint_utils
    from fairseq.distributed import utils as distributed_utils
    from fairseq_cli import train as fairseq_train

    check_identity(work_dir, run_identity(data, student, options, cfg), options.elsewhere())
    repaired = repair_last_checkpoint(work_dir)
    if repaired:
        log(f"checkpoint_last.pt was unreadable (killed while fairseq copied it): resuming from {repaired}")
    if hasattr(checkpoint_utils.save_checkpoint, "best"):  # fairseq keeps the best loss on the function
        del checkpoint_utils.save_checkpoint.best
    for name in ("best", "num_runs"):  # and its early-stopping count on should_stop_early
        if hasattr(fairseq_train.should_stop_early, name):
            delattr(fairseq_train.should_stop_early, name)
    loggers = [logging.getLogger(name) for name in ("fairseq", "fairseq_cli")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:  # fairseq-train's own progress (the command logs WARNING and above), for this run only
        logger.setLevel(logging.INFO)
    try:
        if cpu_processes(cfg) > 1:
            call_main_on_cpu(cfg, fairseq_train.main)
        else:
            distributed_utils.call_main(cfg, fairseq_train.main)
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
    best = os.path.join(work_dir, "checkpoint_best.pt")
    if not os.path.exists(best):
        raise UserError(f"fairseq-train wrote no {best} (no validation ran?)")
    patience = int(cfg.checkpoint.patience)
    stopped = patience > 0 and getattr(fairseq_train.should_stop_early, "num_runs", 0) >= patience
    return write_recovered(best, student, options, data, work_dir, cfg, time.perf_counter() - start,
                           early_stop=(f"the valid loss did not improve for {patience} validations (--patience "
                                       f"{patience})") if stopped else None, distillation_set=distillation_set)


def cpu_processes(cfg) -> int:
    """The processes of a recovery on the CPU (--distributed-world-size without a GPU, or with --cpu): fairseq 0.12
    spawns one process per GPU only, so call_main_on_cpu starts them. 1 on GPUs (fairseq's own spawn) or alone."""
    world = int(cfg.distributed_training.distributed_world_size or 1)
    on_cpu = bool(cfg.common.cpu) or not torch.cuda.is_available()
    launched = cfg.distributed_training.distributed_init_method is not None  # torchrun, Slurm: fairseq's own
    return world if on_cpu and not launched else 1


def call_main_on_cpu(cfg, main) -> None:
    """fairseq-train's main in distributed_world_size local CPU processes, through fairseq's own distributed_main
    (torch.distributed, gloo; fairseq's legacy_ddp where torch's DDP, which wants a GPU id, was asked): each rank
    trains on its shard of every batch, the gradients are all-reduced, and rank 0 alone writes the checkpoints, as
    on GPUs. The machine's threads are shared out between the ranks."""
    from fairseq.distributed import utils as distributed_utils
    from omegaconf import open_dict

    world = int(cfg.distributed_training.distributed_world_size)
    with socket.socket() as s:  # a free port on this machine for the rendezvous
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    with open_dict(cfg):
        cfg.common.cpu = True
        cfg.distributed_training.distributed_backend = "gloo"
        cfg.distributed_training.distributed_init_method = f"tcp://localhost:{port}"
        cfg.distributed_training.distributed_no_spawn = True
        cfg.distributed_training.distributed_rank = None
        cfg.distributed_training.distributed_num_procs = world
        if cfg.distributed_training.ddp_backend in ("pytorch_ddp", "c10d"):  # torch's DDP takes no CPU device id
            cfg.distributed_training.ddp_backend = "legacy_ddp"
    threads = max(1, torch.get_num_threads() // world)
    torch.multiprocessing.spawn(fn=cpu_rank, args=(main, cfg, threads, distributed_utils.distributed_main),
                                nprocs=world, join=True)


def cpu_rank(rank: int, main, cfg, threads: int, distributed_main) -> None:
    """One rank of call_main_on_cpu (a spawned process)."""
    torch.set_num_threads(threads)
    cfg.distributed_training.distributed_rank = rank
    distributed_main(0, main, cfg, {})


def training_setup(cfg) -> Dict[str, object]:
    """What ran: the processes (fairseq's world size) and the device (a GPU when one is visible and --cpu is not
    given, as fairseq's trainer decides)."""
    world = int(cfg.distributed_training.distributed_world_size or 1)
    gpu = torch.cuda.is_available() and not cfg.common.cpu
    return {"processes": world, "device": torch.cuda.get_device_name(0) if gpu else "CPU"}


def sample_subset(source: str, subset: str, n: int, seed: int, out: str) -> Dict:
    """A data folder `out` beside the user's: every file linked, except the subset's binarised files, which hold n
    of its sentence pairs drawn at random with `seed` (in id order; each language pair's files sampled alike).
    Written whole: built beside `out`, then renamed. Returns what was drawn (per pair: sentences, ids' hash)."""
    folder = source.split(os.pathsep)[0]
    prefixes = sorted({p[:-4] for p in glob.glob(os.path.join(folder, glob.escape(subset) + ".*.bin"))})
    if not prefixes:
        raise UserError(f"no binarised '{subset}' subset in {folder} to sample")
    staged = out + ".partial"
    shutil.rmtree(staged, ignore_errors=True)
    os.makedirs(staged)
    for path in glob.glob(os.path.join(folder, "*")):
        if os.path.isfile(path) and not os.path.basename(path).startswith(subset + "."):
            os.symlink(os.path.abspath(path), os.path.join(staged, os.path.basename(path)))
    drawn: Dict[str, Dict] = {}
    for prefix in prefixes:
        name = os.path.basename(prefix)  # train.de-en.de: the pair is the part between the subset and the language
        pair = name[len(subset) + 1:].rsplit(".", 1)[0]
        dataset = data_utils.load_indexed_dataset(prefix, None)
        ids = random_ids(len(dataset), n, seed)
        if pair in drawn and drawn[pair]["of"] != len(dataset):
            raise UserError(f"the files of '{subset}' for {pair} hold different numbers of sentences")
        drawn[pair] = {"sentences": len(ids), "of": len(dataset),
                       "ids_sha256": hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:16]}
        dtype = getattr(getattr(dataset, "_index", None), "dtype", np.int32)  # the user's files' own width
        builder = indexed_dataset.MMapIndexedDatasetBuilder(os.path.join(staged, name + ".bin"), dtype=dtype)
        for i in ids:
            builder.add_item(dataset[i])
        builder.finalize(os.path.join(staged, name + ".idx"))
        del dataset
    shutil.rmtree(out, ignore_errors=True)
    os.rename(staged, out)
    return {"subset": subset, "seed": seed, "pairs": drawn}


def last_valid_loss(state: dict):
    """The loss of fairseq's last validation as a checkpoint records it (None: none ran)."""
    return (state.get("extra_state") or {}).get("val_loss")


def checkpoint_epoch(state: dict):
    """The epoch a fairseq checkpoint was saved in (None when it has no train iterator state). fairseq's iterator
    saved at the end of an epoch names the next one, with no iterations in it (EpochBatchIterator.state_dict)."""
    iterator = (state.get("extra_state") or {}).get("train_iterator") or {}
    if iterator.get("epoch") is None:
        return None
    return iterator["epoch"] - 1 if iterator.get("iterations_in_epoch") == 0 and iterator["epoch"] > 1 \
        else iterator["epoch"]


def epoch_history(work_dir: str) -> List[dict]:
    """Valid loss and updates of every epoch checkpoint fairseq kept, in epoch order."""
    rows = []
    for path in glob.glob(os.path.join(work_dir, "checkpoint[0-9]*.pt")):
        state = torch.load(path, map_location="cpu", weights_only=False)
        history = state.get("optimizer_history") or [{}]
        rows.append({"epoch": int(os.path.basename(path)[10:-3]),
                     "valid_loss": (state.get("extra_state") or {}).get("val_loss"),
                     "updates": history[-1].get("num_updates")})
    return sorted(rows, key=lambda r: r["epoch"])


def write_recovered(best: str, student: str, options: RecoverOptions, data: str, work_dir: str, cfg,
                    seconds: float, early_stop: Optional[str] = None,
                    distillation_set: Optional[dict] = None) -> dict:
    """The best checkpoint as the student's kind of file (weights and config, no optimizer state) and its record,
    written as one pair (checkpoint_io: whole or not at all, one writer per output path)."""
    state = torch.load(best, map_location="cpu", weights_only=False)
    updates = (state.get("optimizer_history") or [{}])[-1].get("num_updates")
    best_epoch = checkpoint_epoch(state)
    state.pop("last_optimizer_state", None)
    if isinstance(state.get("extra_state"), dict):
        state["extra_state"] = {k: v for k, v in state["extra_state"].items() if k in ("val_loss", "best")}
    dtypes = {t.dtype for t in load_state(student)["model"].values() if torch.is_tensor(t) and t.is_floating_point()}
    if dtypes == {torch.float16}:  # stored as the student was (fairseq trains in fp32)
        state["model"] = {k: v.half() if v.is_floating_point() else v for k, v in state["model"].items()}
    last = os.path.join(work_dir, "checkpoint_last.pt")
    last_state = torch.load(last, map_location="cpu", weights_only=False)
    trained = (last_state.get("optimizer_history") or [{}])[-1]
    signal = options.distillation.signal
    record = {
        "checkpoint": os.path.abspath(options.out),
        "student": os.path.abspath(student), "student_sha256": file_sha256(student),
        "teacher": os.path.abspath(options.teacher) if options.teacher else None,
        "teacher_sha256": file_sha256(options.teacher) if options.teacher else None,
        "data": os.path.abspath(data), "train_subset": options.train_subset, "valid_subset": options.valid_subset,
        "criterion": cfg.criterion._name, "distill": signal,
        "distill_weight": options.distill_weight if signal in ("logits", "both") else None,
        "distill_temperature": options.distill_temperature if signal in ("logits", "both") else None,
        "distill_hidden_weight": options.distillation.hidden_weight if signal in ("logits", "both") else None,
        "best_checkpoint": os.path.basename(best), "updates_at_best": updates, "epoch_at_best": best_epoch,
        "last_valid_loss": last_valid_loss(last_state), "best_valid_loss": last_valid_loss(state),
        "early_stop": early_stop, "distillation_set": distillation_set,
        "updates": trained.get("num_updates"),  # fairseq's own count, carried across resumes
        "epochs": epoch_history(work_dir),
        "lr": list(cfg.optimization.lr), "lr_scheduler": cfg.lr_scheduler._name, "max_tokens": cfg.dataset.max_tokens,
        "wall_seconds_this_call": round(seconds, 1), **training_setup(cfg),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "work_dir": os.path.abspath(work_dir),
        "options": {k: v for k, v in asdict(options).items()},
    }
    write_checkpoint_pair(options.out, lambda path: save_state(state, path), record, record_path(options.out))
    return {**record, "checkpoint_sha256": file_sha256(options.out)}


def record_path(out: str) -> str:
    """OUT.pt's record: OUT.json, as every checkpoint writer here names it (checkpoint_io)."""
    return record_path_for(out)
