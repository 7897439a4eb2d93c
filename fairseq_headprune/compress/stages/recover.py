"""The recover stage: fairseq-train (prune.recover.recover) distils the unpruned model into the shrunk one, early
stopping on valid, resumable from its own checkpoints; or, with --recovered, a recovery run elsewhere
(compress.stages.elsewhere writes its folder) adopted. The recovery's settings (its set, key, options and command)
are compress.stages.recovery's."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Dict, Optional

from fairseq_headprune.prune import recover
from fairseq_headprune.compress.stages.contract import Context, Inputs, Results, Stage
from fairseq_headprune.compress.stages.recovery import INPUTS, recover_key, recover_options, recovery_set
from fairseq_headprune.compress.stages.results import Recovered, Shrunk
from fairseq_headprune.engines.fairseq_engine import torch_threads
from fairseq_headprune.errors import UserError
from fairseq_headprune.fairseq_io.checkpoint_io import save_state
from fairseq_headprune.records.identity import file_sha256
from fairseq_headprune.records.log import read_json


def run_here(folder: str, loaded, options, shrunk: Shrunk, data: str, sample: Dict, threads: int,
             log: Callable) -> Dict:
    """The shrunk model distilled from the unpruned one (--budget-epochs 0: the shrunk model as it is)."""
    o = options
    if o.budget_epochs == 0:
        return {"checkpoint": shrunk.checkpoint, "checkpoint_sha256": shrunk.checkpoint_sha256,
                "budget_epochs": 0, "recovered": False}
    out = os.path.join(folder, "model.pt")
    for path in (out, recover.record_path(out)):  # a shorter run's result: recovery goes on from its checkpoints
        if os.path.exists(path):
            os.remove(path)
    settings = recover_options(loaded, options, out, os.path.join(folder, "run"), shrunk.layers)
    with torch_threads(threads):  # the threads the command was given (every other stage times on one)
        record = recover.recover(data, shrunk.checkpoint, settings, log=log)
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


def adopt(folder: str, options, shrunk: Shrunk, sample: Dict) -> Dict:
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
    student = torch.load(shrunk.checkpoint, map_location="cpu", weights_only=False)["model"]
    weights = state.get("model") or {}
    shapes = {k: tuple(v.shape) for k, v in weights.items() if torch.is_tensor(v)}
    wanted = {k: tuple(v.shape) for k, v in student.items() if torch.is_tensor(v)}
    differs = sorted(set(shapes) ^ set(wanted)) or sorted(k for k in wanted if shapes[k] != wanted[k])
    if differs:
        raise UserError(f"--recovered {path} is not a student of this run's shrink ({shrunk.checkpoint}): "
                        f"{differs[0]} differs")
    cfg = state.get("cfg") or {}
    source = ((cfg.get("checkpoint") or {}).get("finetune_from_model")) if hasattr(cfg, "get") else None
    if source and os.path.isfile(source) and file_sha256(source) != shrunk.checkpoint_sha256:
        raise UserError(f"--recovered {path} was fine-tuned from {source}, not from this run's shrink")
    inputs = read_json(os.path.join(os.path.dirname(os.path.abspath(path)), INPUTS)) or {}
    if inputs.get("student_sha256", shrunk.checkpoint_sha256) != shrunk.checkpoint_sha256:
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


@dataclass(frozen=True)
class RecoverInputs(Inputs):
    """--recovered's file by content; else the recovery's key (recovery.recover_key: student, teacher, options, the
    recovery set) and budget."""
    recovered: Optional[str] = None
    run: Optional[Dict] = None
    budget_epochs: Optional[int] = None
    budget_updates: Optional[int] = None


def inputs(context: Context, results: Results) -> RecoverInputs:
    o = context.options
    if o.recovered:
        return RecoverInputs(recovered=file_sha256(o.recovered))
    _, sample = recovery_set(context.loaded, o, results.get("choice"), context.stages_root, context.log, False)
    key = recover_key(context.loaded, o, results["shrink"].checkpoint_sha256, sample)
    return RecoverInputs(run=key, budget_epochs=o.budget_epochs, budget_updates=o.budget_updates)


def check(context: Context, inputs: RecoverInputs) -> None:
    """--recovered inside the stage's own folder (which the stage replaces), or a recovery of a larger budget held
    there for this very run: refused."""
    o, folder = context.options, context.folder("recover")
    if o.recovered:
        if os.path.realpath(o.recovered).startswith(os.path.realpath(folder) + os.sep):
            raise UserError(f"--recovered {o.recovered} is inside the recover stage's own folder, which the stage "
                            "replaces: move it out first")
        return
    record = context.held("recover")
    if record and record["identity"].get("run") == inputs.run:
        for name, flag in (("budget_epochs", "--budget-epochs"), ("budget_updates", "--budget-updates")):
            held = record["result"].get(name)
            if held is not None and held > getattr(o, name):
                raise UserError(f"{folder} holds a recovery of {flag} {held}: give {flag} {held} or more, or "
                                "another --out")


def resume_key(inputs: RecoverInputs) -> Optional[Dict]:
    """A recovery run here keeps its checkpoints while its key holds (a larger budget extends it); --recovered's
    adoption, none."""
    return inputs.run


def build(folder: str, inputs: RecoverInputs, context: Context, results: Results) -> Recovered:
    """The recovery run here, or --recovered's adopted."""
    o, shrunk = context.options, results["shrink"]
    data, sample = recovery_set(context.loaded, o, results.get("choice"), context.stages_root, context.log,
                                prepare=o.budget_epochs > 0 and not o.recovered)
    if o.recovered:
        return Recovered.of(adopt(folder, o, shrunk, sample))
    return Recovered.of(run_here(folder, context.loaded, o, shrunk, data, sample, context.threads, context.log))


STAGE = Stage("recover", inputs, build, Recovered, check=check, resume_key=resume_key)
