"""What `compress` checks before its first stage, so that a run is refused in one line (exit code 2, nothing
written) instead of failing after the cost table, the choice, the shrink or the recovery:

  output_folder  --out is a new folder or one of compress's own runs (recognised by its records), never holding an
                 input (--path, DATA, references) or a file compress did not write; ct2/ inside it a CTranslate2
                 model folder only (the run replaces it whole).
  reported_sets  --references and --also-references have one line per sentence of their set.
  text_processing  the --bpe and --tokenizer the report stage decodes with can be built (their files exist).
  recovery       --recover-args as fairseq-train reads them: no option compress sets itself, and what fairseq-train
                 would fail on after its run folder exists (devices and world size against this machine, a
                 --max-tokens below the longest sentence, an optimizer or lr scheduler that cannot be built).
  engine         a CTranslate2 --engine for a task and model it can express.
  recover_arguments  --recover-args and compress's own fairseq-train options as recover would refuse them.
  subsets        every subset a stage reads loads.
  recovered_checkpoint  --recovered: a fairseq checkpoint of the input model's vocabulary (of the shrink's shape
                 when the shrink is in OUT).
  distillation_sources  --distill-source: UTF-8 text files, not empty.
  vocabulary     --keep-vocab: corpora this model's vocabulary can be trimmed to (UTF-8, each named for a language
                 of the pair), a model and task whose vocabulary can be trimmed.
  check          all of them but output_folder, on the loaded model, in that order.
"""
from __future__ import annotations

import codecs
import contextlib
import io
import os
import re
import tempfile
from typing import Dict, Optional, Sequence, Tuple

import torch
from fairseq import optim
from fairseq.optim import lr_scheduler

from fairseq_headprune.prune import recover, recovery_config
from fairseq_headprune.prune.export import foreign_entries
from fairseq_headprune.prune.sequence_targets import language_pair
from fairseq_headprune.compress.stages.common import split_subsets, subset_tokens, trim_point
from fairseq_headprune.compress.stages.points import shape_point
from fairseq_headprune.compress.stages.recovery import recover_options
from fairseq_headprune.engines.ct2 import check_task, ct2_decoding
from fairseq_headprune.engines.ct2_spec import unsupported_parts
from fairseq_headprune.errors import UserError
from fairseq_headprune.fairseq_io.loading import load_subset
from fairseq_headprune.records.log import LOCK_NAME

# what a compress run writes into --out (its records: stages/ and compress.json), and its temporaries
OWN_ENTRIES = ("stages", "ct2", "model.pt", "MODEL_CARD.md", "compress.json", LOCK_NAME,
               "recovery-run.sh", "recovery-run")  # --stop-after shrink's recovery command and its run folder
OWN_VOCABULARY = re.compile(r"dict\.[^/\\]+\.txt|langs\.txt")  # a vocabulary trimmed by --keep-vocab, beside model.pt
OWN_TEMPORARIES = re.compile(r"\.(MODEL_CARD\.md|compress\.json|recovery-run\.sh)\..+\.tmp|model\.pt\.tmp|\.ct2-.+"
                             r"|dict\.[^/\\]+\.txt\.tmp|langs\.txt\.tmp")

# fairseq-train options compress's recovery sets itself -> the compress option that sets it (or why it is fixed)
SET_BY_COMPRESS = {
    "--max-epoch": "use --budget-epochs N",
    "--max-update": "use --budget-updates N",
    "--valid-subset": "the recovery early-stops on valid, less the choice's held-out split with --max-bleu-loss "
                      "(a reported set takes part in no choice)",
    "--train-subset": "the recovery trains on train",
    "--criterion": "use --distill",
    "--teacher-path": "the teacher is --path, the unpruned model",
    "--distill-weight": "compress distills with recover's default weight",
    "--distill-temperature": "compress distills with recover's default temperature",
    "--distill-hidden-weight": "use compress --distill-hidden-weight",
    "--distill-hidden-layers": "compress maps them from the shrink's kept layers",
    "--save-dir": "the recovery's checkpoints are OUT/stages/recover/run",
    "--arch": "the architecture is the shrunk model's", "-a": "the architecture is the shrunk model's",
    "--finetune-from-model": "the recovery starts from the shrunk model",
    "--restore-file": "the recovery resumes from its own checkpoints",
    "--user-dir": "compress loads this package itself",
}


def _inside(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or lies under it, links resolved."""
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def command_inputs(data: str, checkpoint: str, references: Sequence[Optional[str]] = ()) -> Tuple[str, ...]:
    """Every path a compress run reads: DATA's folders, the checkpoint(s) of --path, the reference files."""
    paths = (data or "").split(os.pathsep) + (checkpoint or "").split(os.pathsep) + list(references)
    return tuple(p for p in paths if p)


def foreign_names(out: str) -> list:
    """What in the folder `out` no compress run wrote (empty: a new folder or one of compress's own runs)."""
    names = sorted(os.listdir(out))
    foreign = [n for n in names if n not in OWN_ENTRIES and not OWN_TEMPORARIES.fullmatch(n)
               and not OWN_VOCABULARY.fullmatch(n)]
    if foreign:
        return foreign
    if any(n not in (LOCK_NAME,) and not OWN_TEMPORARIES.fullmatch(n) for n in names) and "stages" not in names:
        return [f"{n} (no stages/ beside it: not a compress run's)" for n in names if n != LOCK_NAME][:1]
    for name in ("stages", "ct2"):
        path = os.path.join(out, name)
        if name in names and (os.path.islink(path) or not os.path.isdir(path)):
            return [f"{name} (not a folder compress made)"]
    ct2 = os.path.join(out, "ct2")
    if "ct2" in names:
        inside = [n for n in foreign_entries(ct2) if not n.startswith("no ")]
        if inside:
            return [f"ct2/{n}" for n in inside]
    return []


def output_folder(out: str, inputs: Sequence[str] = ()) -> None:
    """--out: a folder compress can create, or one an earlier compress run wrote (nothing in it but compress's own
    files, its records in stages/); never an input or a folder holding one. Refused in one line naming the path."""
    for given in inputs:
        if given and _inside(given, out):
            raise UserError(f"--out {out} is or holds an input of this run ({given}): compress writes model.pt and "
                            "MODEL_CARD.md there; name another folder")
    if os.path.islink(out) and not os.path.exists(out):
        raise UserError(f"--out {out} is a link to {os.readlink(out)}, which does not exist; name a folder")
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"--out {out} is a file; name a folder")
    if os.path.isdir(out):
        foreign = foreign_names(out)
        if foreign:
            raise UserError(f"--out {out} holds {', '.join(foreign[:3])}, which compress did not write: it writes "
                            "into a new folder or one of its own runs only; name another folder")
        writable("--out", out, out)
        return
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.exists(parent):
        raise UserError(f"--out: folder {parent} does not exist")
    if not os.path.isdir(parent):
        raise UserError(f"--out: {parent} is not a folder")
    writable("--out", parent, out)


def writable(option: str, folder: str, out: str) -> None:
    """A folder can be created in `folder` (tried, and removed at once: permissions, read-only or virtual file
    systems, which os.access does not see for root)."""
    try:
        os.rmdir(tempfile.mkdtemp(dir=folder, prefix=".compress-probe-"))
    except OSError as e:
        raise UserError(f"{option} {out} cannot be written: {e.strerror} in {folder}") from None


def line_count(option: str, path: str) -> int:
    """Lines of a reference file, as SubsetEvaluator reads them (UTF-8)."""
    try:
        with open(path, encoding="utf-8") as f:
            return sum(1 for _ in f)
    except OSError as e:
        raise UserError(f"{option}: cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{option}: {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def reported_sets(loaded, options) -> None:
    """Each reference file has one line per sentence of its set (read at the report stage, the last one)."""
    pairs = [("--references", options.gen_subset, options.references)]
    pairs += [("--also-references", s, r) for s, r in zip(options.also_report, options.also_references)]
    for option, subset, path in pairs:
        if not path:
            continue
        lines, sentences = line_count(option, path), len(load_subset(loaded, subset))
        if lines != sentences:
            raise UserError(f"{option} {path} has {lines} lines but subset '{subset}' has {sentences} sentences")


def text_processing(loaded) -> None:
    """The --bpe and --tokenizer the report stage detokenizes with, built now (a missing codes or model file)."""
    cfg = loaded.cfg
    for option, section, build in (("--bpe", cfg.bpe, loaded.task.build_bpe),
                                   ("--tokenizer", cfg.tokenizer, loaded.task.build_tokenizer)):
        name = getattr(section, "_name", None) if section is not None else None
        if not name:
            continue
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):  # subword-nmt prints its error, then exits
                build(section)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the report stage would fail on it, after the work
            lines = (str(e) if not isinstance(e, SystemExit) else said.getvalue()).strip().splitlines()
            message = lines[0] if lines else type(e).__name__
            raise UserError(f"{option} {name} cannot be built: {message}") from None


def owned_options(train_args: Sequence[str]) -> None:
    """An option of --recover-args that compress's recovery sets itself: refused, naming compress's own option."""
    for name in recovery_config.option_names(list(train_args)):
        if name in SET_BY_COMPRESS:
            raise UserError(f"--recover-args: {name} is set by compress itself: {SET_BY_COMPRESS[name]}")


def devices(cfg) -> None:
    """--recover-args' device and distributed options against this machine, as fairseq-train would assert them
    after the choice and the shrink (fairseq.distributed.utils: a world size above the GPUs here)."""
    common, dist = cfg.common, cfg.distributed_training
    gpus = torch.cuda.device_count()
    world = int(dist.distributed_world_size or 1)
    launched = dist.distributed_init_method is not None or all(
        key in os.environ for key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"))
    if world > 1 and not launched and not common.tpu and gpus and world > gpus:  # without a GPU: CPU processes
        raise UserError(f"--recover-args: --distributed-world-size {world} needs {world} GPUs and this machine has "
                        f"{gpus}")
    if not common.cpu and gpus and dist.device_id >= gpus:
        raise UserError(f"--recover-args: --device-id {dist.device_id}, and this machine has {gpus} GPU(s)")


def optimizer_and_schedule(cfg) -> None:
    """fairseq-train's optimizer and lr scheduler built as its Trainer builds them (on one stand-in parameter):
    an option combination they refuse, or fail on, is refused here."""
    try:
        optimizer = optim.build_optimizer(cfg.optimizer, [torch.nn.Parameter(torch.zeros(1))])
        schedule = lr_scheduler.build_lr_scheduler(cfg.lr_scheduler, optimizer)
        schedule.step_begin_epoch(1)
        schedule.step_update(0)
    except Exception as e:  # noqa: BLE001 - any failure of fairseq's own builders is one of the user's options
        name = getattr(cfg.lr_scheduler, "_name", None)
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"--recover-args: fairseq-train cannot set up --optimizer {cfg.optimizer._name} with "
                        f"--lr-scheduler {name}: {message}") from None


def recovery(loaded, options) -> None:
    """The recovery's fairseq-train configuration, as compress.recover will build it, checked now."""
    if not options.budget_epochs:
        return
    if getattr(loaded.task, "trimmed_ids", None) is not None and not options.recovered:  # fairseq-train reads
        # DATA's ids as they are
        raise UserError(f"{loaded.checkpoint}: its vocabulary was trimmed (shrink --keep-vocab) and DATA is binarised "
                        "for the model it was trimmed from; the recovery trains on DATA's ids: binarise it against "
                        "the dict.*.txt written beside the checkpoint, give --budget-epochs 0, or compress the "
                        "untrimmed model with --keep-vocab (trimmed after its recovery)")
    owned_options(options.recover_args)
    model_cfg = loaded.saved_cfg.model
    arch = (model_cfg.get("arch") if hasattr(model_cfg, "get") else getattr(model_cfg, "arch", None)) or "transformer"
    settings = recover_options(loaded, options, os.path.join(options.out, "model.pt"), None)
    argv = recovery_config.training_argv(loaded.cfg.task.data, loaded.checkpoint, settings,  # under the saved task
                                         recovery_config.saved_task_name(loaded.saved_cfg), arch)
    cfg = recover.fairseq_train_cfg(argv, loaded.saved_cfg, settings)
    devices(cfg)
    optimizer_and_schedule(cfg)
    weights: Dict[str, torch.Tensor] = loaded.model.state_dict()
    recover.preflight(cfg, loaded.cfg.task.data, weights, settings)


def engine(loaded, options) -> None:
    """--engine: a CTranslate2 engine for a task and model it can express (fairseq runs any)."""
    if options.engine != "fairseq":  # CTranslate2 decodes as fairseq under translation and the multilingual task
        check_task(loaded.cfg.task, f"compress --engine {options.engine}", "; --engine fairseq compresses it")
        ct2_decoding(loaded.cfg.generation)
        activation = getattr(loaded.saved_cfg.model, "activation_fn", None) or "relu"
        problems = unsupported_parts(loaded.model, activation)
        if problems:
            raise UserError(f"--engine {options.engine}: CTranslate2 cannot express {problems[0]}")


def recover_arguments(loaded, options) -> None:
    """fairseq-train's options of the recovery, refused in one line before any work (as recover refuses them)."""
    if not options.budget_epochs:
        if options.recover_args:
            raise UserError("--recover-args: --budget-epochs 0 runs no recovery")
        return
    model_cfg = loaded.saved_cfg.model
    arch = model_cfg.get("arch") if hasattr(model_cfg, "get") else getattr(model_cfg, "arch", None)
    _, _, train_options = split_subsets(options.train_options)
    instead = {"--max-update": "--budget-updates N", "--max-epoch": "--budget-epochs N",
               "--train-subset": "--train-subset to compress itself", "--valid-subset":
               "--valid-subset to compress itself"}
    for name in recovery_config.option_names(list(options.recover_args)):
        if name in instead:
            raise UserError(f"--recover-args: {name} is the recovery's budget or data, which compress sets: give "
                            f"{instead[name]}")
    recovery_config.refuse_foreign_options(train_options + list(options.recover_args), arch or "transformer")
    if "--disable-validation" in train_options + list(options.recover_args):
        raise UserError("--disable-validation: the recovery early-stops on valid and keeps its best checkpoint")
    # (fairseq-train's own reading of them, under the task the recovery trains with: `recovery`, run before this)
    settings = recover_options(loaded, options, os.path.join(options.out, "model.pt"), None)
    signal = settings.distillation.signal
    if signal in ("sequences", "both"):  # what recover would refuse after the choice and the shrink
        recovery_config.refuse_teacher_decoding(signal, recovery_config.saved_task_name(loaded.saved_cfg))
        language_pair(loaded.cfg.task.data, settings.train_subset)


def recovered_checkpoint(loaded, options) -> None:
    """--recovered: a fairseq checkpoint with the input model's vocabulary, and, where this run's shrink is already
    in OUT, a student of it (every parameter's name and shape); the recover stage checks the rest when it adopts it."""
    path = options.recovered
    if not path:
        return
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's to fix
        raise UserError(f"--recovered {path} is not a checkpoint torch can load ({type(e).__name__})") from None
    weights = state.get("model") if isinstance(state, dict) else None
    if not isinstance(weights, dict) or state.get("cfg") is None:
        raise UserError(f"--recovered {path} is not a fairseq checkpoint (it holds no model weights and cfg)")
    wanted = recovery_config.vocabulary_sizes(loaded.model.state_dict())
    held = recovery_config.vocabulary_sizes(weights)
    for name in (n for n in wanted if held.get(n) != wanted[n]):
        raise UserError(f"--recovered {path} is not a student of --path: its {name} has {held.get(name)} rows, the "
                        f"input model's {wanted[name]}")
    shrunk = os.path.join(options.out, "stages", "shrink", "model.pt")
    if os.path.isfile(shrunk):
        student = torch.load(shrunk, map_location="cpu", weights_only=False)["model"]
        differs = recovery_config.first_shape_difference(weights, student)
        if differs:
            raise UserError(f"--recovered {path} is not a student of this run's shrink ({shrunk}): {differs} differs")
    elif options.shape is not None:
        differs = shape_difference(weights, shape_point(loaded, options), loaded.model)
        if differs:
            raise UserError(f"--recovered {path} is not of --shape {options.shape}: {differs}")


def stack_heads(weights: Dict[str, torch.Tensor], stack: str, attention: str, head_dim: int) -> Dict[int, int]:
    """{layer: heads} of one attention of a stack in a state dict (its query projection's rows over head_dim)."""
    prefix, suffix = f"{stack}.layers.", f".{attention}.q_proj.weight"
    return {int(name[len(prefix):-len(suffix)]): int(w.shape[0]) // head_dim for name, w in weights.items()
            if name.startswith(prefix) and name.endswith(suffix)}


def shape_difference(weights: Dict[str, torch.Tensor], point: Dict[str, int], model) -> Optional[str]:
    """What of a state dict differs from a shape point (--shape): the decoder's depth or a layer's heads (the FFN
    share is not read: shrink rounds it per layer); None when it has the shape."""
    head_dim = {"encoder": int(model.encoder.layers[0].self_attn.head_dim),
                "decoder": int(model.decoder.layers[0].self_attn.head_dim)}
    for stack, layers in (("encoder", model.encoder.layers), ("decoder", model.decoder.layers)):
        held = len(stack_heads(weights, stack, "self_attn", head_dim[stack]))
        depth = point.get(f"{stack[:3]}_layers", len(layers))
        if held != depth:
            return f"its {stack} has {held} layers, the shape {depth}"
    for stack, attn, heads in (("encoder", "self_attn", point["enc_heads"]), ("decoder", "self_attn",
                               point["dec_heads"]), ("decoder", "encoder_attn", point["dec_heads"])):
        for layer, held in sorted(stack_heads(weights, stack, attn, head_dim[stack]).items()):
            if held != heads:
                return f"{stack} layer {layer + 1}'s {attn} holds {held} heads, the shape {heads}"
    return None


TEXT_SAMPLE = 1 << 20  # bytes of a text file read to judge it
MIN_PRINTABLE = 0.98  # share of printable characters (line breaks and tabs count) below which a file is not text


def text_problem(path: str) -> Optional[str]:
    """Why a file is not UTF-8 text (None when it is), judged on its first TEXT_SAMPLE bytes: empty, undecodable,
    or holding too few printable characters."""
    with open(path, "rb") as f:
        head = f.read(TEXT_SAMPLE)
        complete = not f.read(1)
    if not head.strip():
        return "is empty"
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=complete)
    except UnicodeDecodeError as e:
        return f"is not UTF-8 text ({e.reason} at byte {e.start})"
    printable = sum(1 for c in text if c.isprintable() or c in "\n\r\t")
    if printable < MIN_PRINTABLE * len(text):
        return f"is not text: {1 - printable / len(text):.0%} of its first characters are not printable"
    return None


def distillation_sources(options) -> None:
    """--distill-source: files of UTF-8 text, one sentence a line (read by the recover stage, after the shrink)."""
    for path in options.distillation.source:
        try:
            problem = text_problem(path)
        except OSError as e:
            raise UserError(f"--distill-source: cannot read {path}: {e.strerror}") from None
        if problem:
            raise UserError(f"--distill-source {path} {problem}")


def subsets(loaded, options) -> None:
    """Every subset a stage reads loads (fairseq's own refusal of a missing one, in one line)."""
    for subset in ("train", "valid", options.gen_subset, options.calibration_subset, options.timing_subset,
                   *options.also_report):
        subset_tokens(loaded, subset, 1)


def check(loaded, options) -> None:
    """Every refusal the loaded model and data can give, in one line, before OUT is made or anything runs."""
    engine(loaded, options)
    recovery(loaded, options)
    reported_sets(loaded, options)
    text_processing(loaded)
    recover_arguments(loaded, options)
    subsets(loaded, options)
    recovered_checkpoint(loaded, options)
    distillation_sources(options)
    trim_point(loaded, options)  # --keep-vocab: what it keeps, or one line
    if options.shape is not None:
        shape_point(loaded, options)
