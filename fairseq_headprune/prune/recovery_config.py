"""What a recovery is asked for (RecoverOptions) and the fairseq-train command line it becomes: the options recover
sets itself and refuses, the defaults it adds, the student's saved configuration as arguments, and the checks of a
student against its teacher that need no training.
"""
from __future__ import annotations

import argparse
import glob
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

from fairseq_headprune.errors import UserError
from fairseq_headprune.options import given_flags, nested, option
from fairseq_headprune.fairseq_io.loading import PACKAGE_DIR
from fairseq_headprune.records.identity import file_sha256
from fairseq_headprune.criterions.label_smoothed_cross_entropy_distill import parse_hidden_layers


DISTILL = ("logits", "sequences", "both", "none")
DEFAULT_DISTILL = "logits"


CRITERION = "label_smoothed_cross_entropy_distill"


# model options a user may change for the fine-tuning; every other option of the architecture is the student's
TUNABLE_MODEL_OPTIONS = ("dropout", "attention_dropout", "activation_dropout")


# options recover sets itself; given on the command line they are refused, never silently replaced
OWN_OPTIONS = ("--arch", "-a", "--save-dir", "--finetune-from-model", "--restore-file", "--criterion",
               "--teacher-path", "--max-epoch", "--max-update", "--reset-optimizer", "--reset-lr-scheduler",
               "--reset-meters", "--reset-dataloader", "--user-dir", "--train-subset",
               "--distill-weight", "--distill-temperature", "--distill-hidden-weight", "--distill-hidden-layers")


# fairseq-train options recover uses unless the user gives them: the De-En recipe's cool-down, the lr at which the
# bundled model converged (recipes/de_en_train_args.sh), chosen for the reasons in results/recover-de-en/README.md
TRAIN_DEFAULTS = {
    "--optimizer": "adam", "--adam-betas": "(0.9, 0.98)", "--clip-norm": "0.0", "--weight-decay": "0.0001",
    "--lr": "1e-4", "--lr-scheduler": "fixed", "--warmup-updates": "0", "--max-tokens": "2048",
    "--label-smoothing": "0.1", "--seed": "1", "--num-workers": "0", "--log-format": "simple",
    "--log-interval": "50", "--patience": "2", "--keep-last-epochs": "-1",
    "--dropout": "0.1",  # the student's own (0.3 for the bundled model) lost 0.4 BLEU on val: see results/recover-de-en
}


@dataclass
class DistillationOptions:
    """The recovery's signal and its distillation set beyond the parallel data, declared once: `recover`
    (RecoverOptions) and `compress` (CompressOptions) each hold them."""

    signal: str = option(DEFAULT_DISTILL, flag="--distill", metavar="|".join(DISTILL),
                         help="the recovery's signal (logits: KL to the teacher's token distributions on the "
                              "references + the label-smoothed loss; sequences: the teacher's beam translations of the "
                              "training subset as targets, Kim & Rush 2016, decoded once and cached; both: the "
                              "distributions on those translations; none: plain fine-tuning)")
    hidden_weight: float = option(0.0, flag="--distill-hidden-weight",
                                  help="weight β of the squared distance of every decoder layer's output to the "
                                       "teacher layer it stands for (layer distillation, CoFi); 0: off")
    source: Tuple[str, ...] = option((), flag="--distill-source", nargs="+", metavar="FILE", parse=tuple,
                                     help="raw source text the teacher translates once (one sentence a line, with "
                                          "the model's --tokenizer and --bpe), trained on as the next shard of the "
                                          "training subset (train1): a distillation set beyond the parallel data; "
                                          "cached beside DATA")
    nbest: int = option(1, flag="--distill-nbest", metavar="N",
                        help="the teacher's N best translations of each --distill-source sentence, each a pair (at "
                             "most the teacher's beam)")

    def check(self, beam: int, beam_words: str) -> None:
        """Each setting, and the ones the chosen signal or set would not read, refused in one line; `beam` the
        teacher's beam of its translations (`beam_words`: how the command names it)."""
        if self.signal not in DISTILL:
            raise UserError(f"--distill must be one of {', '.join(DISTILL)}, not {self.signal}")
        if self.hidden_weight < 0:
            raise UserError(f"--distill-hidden-weight must be at least 0, not {self.hidden_weight:g}")
        if self.hidden_weight and self.signal in ("none", "sequences"):  # no teacher in the loss
            raise UserError(f"--distill-hidden-weight weighs a distance to the teacher's forward pass, which --distill "
                            f"{self.signal} does not use")
        for path in self.source:
            if not os.path.isfile(path):
                raise UserError(f"--distill-source: no such file: {path}")
        if self.nbest != 1 and not self.source:
            raise UserError("--distill-nbest sets how many translations of each --distill-source sentence are kept: "
                            "give --distill-source")
        if not 1 <= self.nbest <= beam:
            raise UserError(f"--distill-nbest must be between 1 and {beam_words} ({beam}), not {self.nbest}")


@dataclass
class RecoverOptions:
    """What `fairseq-headprune recover` does: each field a command-line option of `recover` with its one default
    (compress and shrink --recover-epochs build it from their own options)."""

    teacher: str = option("", flag="--teacher", metavar="UNPRUNED.pt",
                          help="the frozen teacher (needed unless --distill none)")
    out: str = option("", flag="--out", metavar="OUT.pt", help="the recovered checkpoint to write")
    distillation: DistillationOptions = nested(DistillationOptions)
    distill_weight: float = option(0.9, flag="--distill-weight",
                                   help="weight w of the KL (1 - w: the label-smoothed loss on the targets)")
    distill_temperature: float = option(2.0, flag="--distill-temperature", help="softmax temperature T")
    distill_hidden_layers: str = option("", flag="--distill-hidden-layers", metavar="T1,T2,...", shown="one to one",
                                        help="the teacher decoder layer (1-indexed) each student layer is compared "
                                             "with, for a student with fewer layers (shrink --keep-layers records "
                                             "its map as layers.teacher_outputs)")
    epochs: Optional[int] = option(None, flag="--epochs", group="budget", shown="2",
                                   help="epochs of the training subset (2 when neither this nor --updates is given)")
    updates: Optional[int] = option(None, flag="--updates", group="budget", help="updates instead of epochs")
    train_subset: str = option("train", flag="--train-subset", help="the subset trained on")
    valid_subset: str = option("valid", flag="--valid-subset", help="validation loss for early stopping (--patience)")
    work_dir: Optional[str] = option(None, flag="--work-dir", shown="OUT.recover/",
                                     help="fairseq's checkpoints of this run")
    sequence_beam: int = option(5, flag="--sequence-beam",
                                help="beam of the teacher's translations (--distill sequences or both, "
                                     "--distill-source)")
    sequence_max_len_a: float = 1.2  # the teacher's length cap on its own translations: a x source + b
    sequence_max_len_b: int = 10
    force: bool = option(False, flag="--force", help="replace an existing OUT.pt")
    train_args: List[str] = field(default_factory=list)  # fairseq-train options as given, passed through
    command: str = "recover"  # the command running it (`shrink --recover-epochs`): its refusals name its options

    def elsewhere(self) -> str:
        """How a refused user writes elsewhere, in the options of the command that runs the recovery."""
        return "another --work-dir" if self.command == "recover" else "another --out (its run folder is OUT.recover)"

    def check(self) -> None:
        """Every setting that can be refused before anything is read or written."""
        signal = self.distillation.signal
        self.check_unused()
        if self.sequence_beam < 1:
            raise UserError(f"--sequence-beam must be at least 1, not {self.sequence_beam}")
        self.distillation.check(self.sequence_beam, "--sequence-beam")
        if signal != "none" and not self.teacher:
            raise UserError(f"--distill {signal} needs --teacher UNPRUNED.pt")
        if not 0.0 <= self.distill_weight <= 1.0:
            raise UserError(f"--distill-weight must be in [0, 1], not {self.distill_weight}")
        if not self.distill_temperature > 0:
            raise UserError(f"--distill-temperature must be > 0, not {self.distill_temperature}")
        if self.distillation.source and not self.teacher:
            raise UserError("--distill-source is translated by the teacher: give --teacher UNPRUNED.pt")
        self.budget_args()

    def check_unused(self) -> None:
        """An option set away from its default that the chosen signal does not read: refused, never ignored."""
        given, signal = given_flags(RecoverOptions, self), self.distillation.signal
        teacher_terms = [f for f in ("--distill-weight", "--distill-temperature", "--distill-hidden-weight",
                                     "--distill-hidden-layers") if f in given]
        if teacher_terms and signal in ("none", "sequences"):  # no teacher in the loss
            raise UserError(f"{teacher_terms[0]} weighs a distance to the teacher's forward pass, which --distill "
                            f"{signal} does not use")
        if "--sequence-beam" in given and signal not in ("sequences", "both") and not self.distillation.source:
            raise UserError(f"--sequence-beam sets the beam of the teacher's translations, which --distill "
                            f"{signal} does not use (without --distill-source)")

    def budget_args(self) -> List[str]:
        """fairseq-train's budget: --max-epoch, --max-update, or both (it stops at whichever comes first)."""
        if self.updates is not None:
            if self.updates < 1:
                raise UserError(f"--updates must be at least 1, not {self.updates}")
            if self.epochs is None:
                return ["--max-update", str(self.updates), "--max-epoch", "0"]
        epochs = 2 if self.epochs is None else self.epochs
        if epochs < 1:
            raise UserError(f"--epochs must be at least 1, not {epochs}")
        return ["--max-epoch", str(epochs)] + ([] if self.updates is None else ["--max-update", str(self.updates)])

    def resolved_work_dir(self) -> str:
        return self.work_dir or os.path.splitext(self.out)[0] + ".recover"


def option_names(argv: List[str]) -> List[str]:
    """The option names in a fairseq argument list (`--lr 1e-4`, `--lr=1e-4` -> `--lr`)."""
    return [a.split("=", 1)[0] for a in argv if a.startswith("-") and not _is_number(a)]


def _is_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False


def model_option_names(arch: str) -> Dict[str, str]:
    """Command-line name -> dest of every option the architecture's model class adds (its shape and dropouts)."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    parser = argparse.ArgumentParser(add_help=False)
    ARCH_MODEL_REGISTRY[arch].add_args(parser)
    return {s: a.dest for a in parser._actions for s in a.option_strings}


def refuse_foreign_options(train_args: List[str], arch: str) -> None:
    """One line for an option recover sets itself or one that would change the student's architecture."""
    names = option_names(train_args)
    own = [n for n in names if n in OWN_OPTIONS]
    if own:
        raise UserError(f"{own[0]} is set by recover itself (see fairseq-headprune recover --help)")
    model = model_option_names(arch)
    shape = [n for n in names if n in model and model[n] not in TUNABLE_MODEL_OPTIONS]
    if shape:
        raise UserError(f"{shape[0]}: the student's architecture is read from its checkpoint and cannot change "
                        f"(only {', '.join('--' + o.replace('_', '-') for o in TUNABLE_MODEL_OPTIONS)} can)")


def saved_config_args(section, add_args, skip=()) -> List[str]:
    """A saved config section (the student's model or task) as command-line options of the parser `add_args`
    builds: every option whose saved value is set, so that a bare fairseq-train builds the very model the
    checkpoint holds (its pruned heads, its shape) under its task's settings."""
    values = as_mapping(section)
    parser = argparse.ArgumentParser(add_help=False)
    add_args(parser)
    out: List[str] = []
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.dest in skip or values.get(action.dest) is None:
            continue
        value, flag = values[action.dest], longs[0]
        if isinstance(action, argparse._StoreTrueAction):
            out += [flag] if value else []
        elif isinstance(action, argparse._StoreFalseAction):
            out += [] if value else [flag]
        elif isinstance(value, (list, tuple)):
            out += [flag, *map(str, value)] if action.nargs in ("+", "*") else [flag, ",".join(map(str, value))]
        else:
            out += [flag, str(value)]
    return out


def student_args(student: str, arch: str, task_name: str) -> List[str]:
    """The student checkpoint's model and task options for a fairseq-train command run on its own (recover passes
    them as configs instead): its architecture's options but the tunable dropouts, and its task's but the data
    and the subsets."""
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    cfg = saved_cfg(load_state(student), student)
    out = saved_config_args(cfg["model"], ARCH_MODEL_REGISTRY[arch].add_args, set(TUNABLE_MODEL_OPTIONS) | {"arch"})
    task = TASK_REGISTRY.get(task_name)
    if task is not None and saved_task_name(cfg) == task_name:
        out += saved_config_args(cfg.get("task"), task.add_args, {"data", "train_subset", "valid_subset"})
    return out


def training_argv(data: str, student: str, options: RecoverOptions, saved_task: str, arch: str,
                  saved: List[str] = ()) -> List[str]:
    """fairseq-train's argument list for this recovery: defaults, then the user's options, then recover's own
    (`saved`: the student's model and task options, student_args, for a command run on its own)."""
    given = set(option_names(options.train_args))
    argv = [data, "--user-dir", PACKAGE_DIR, "--arch", arch]
    if "--task" not in given:
        argv += ["--task", saved_task]
    argv += list(saved)
    for name, value in TRAIN_DEFAULTS.items():
        if name not in given:
            argv += [name, value]
    argv += list(options.train_args)
    argv += ["--save-dir", options.resolved_work_dir(), "--finetune-from-model", os.path.abspath(student),
             "--train-subset", options.train_subset, "--valid-subset", options.valid_subset]
    argv += options.budget_args()
    if options.distillation.signal == "none" or options.distillation.signal == "sequences":
        argv += ["--criterion", "label_smoothed_cross_entropy"]
    else:
        argv += ["--criterion", CRITERION, "--teacher-path", os.path.abspath(options.teacher),
                 "--distill-weight", str(options.distill_weight),
                 "--distill-temperature", str(options.distill_temperature),
                 "--distill-hidden-weight", str(options.distillation.hidden_weight)]
        if options.distill_hidden_layers:
            argv += ["--distill-hidden-layers", options.distill_hidden_layers]
    return argv


def source_encoders(cfg):
    """The tokenizer and BPE fairseq builds from these options (fairseq-interactive's), and their description
    (with the BPE's codes or model by content): how raw source text becomes the model's tokens."""
    from fairseq.data import encoders

    described = []
    for kind in ("tokenizer", "bpe"):
        section = cfg.get(kind) if hasattr(cfg, "get") else None
        name = config_field(section, "_name") if section is not None else None
        if name:
            files = [f"{k}={file_sha256(v, 16)}" for k, v in sorted(as_mapping(section).items())
                     if isinstance(v, str) and k != "_name" and os.path.isfile(v)]
            described.append(" ".join([f"{kind}={name}"] + files))
    return encoders.build_tokenizer(cfg.tokenizer), encoders.build_bpe(cfg.bpe), "; ".join(described) or "none"


def config_field(cfg, name):
    return cfg.get(name) if hasattr(cfg, "get") else getattr(cfg, name, None)


def as_mapping(section) -> dict:
    """A saved config section as a plain dict: fairseq keeps legacy tasks and models (multilingual, mBART) as
    argparse Namespaces, hydra ones as dicts or DictConfigs."""
    from omegaconf import OmegaConf

    if section is None:
        return {}
    if isinstance(section, argparse.Namespace):
        return dict(vars(section))
    if OmegaConf.is_config(section):
        return OmegaConf.to_container(section, resolve=True) or {}
    return dict(section)


def saved_task_name(student_cfg) -> str:
    """The task the student was trained under (a legacy Namespace names it in `task` when `_name` is absent)."""
    task = as_mapping(student_cfg.get("task"))
    return task.get("_name") or task.get("task") or "translation"


def refuse_teacher_decoding(distill: str, task_name: str) -> None:
    """`sequences` and `both` decode the teacher under the translation task: another task's language tokens would
    be dropped."""
    if distill in ("sequences", "both") and task_name not in ("translation", "translation_headprune"):
        raise UserError(f"--distill {distill} decodes the teacher under the translation task, which would drop "
                        f"{task_name}'s language tokens: use --distill logits or none")


def set_config_field(section, key, value) -> None:
    if isinstance(section, argparse.Namespace):
        setattr(section, key, value)
    else:
        section[key] = value


def same_shape_except_heads(student_model_cfg, teacher_model_cfg) -> Optional[str]:
    """None when the student is the teacher's network with (possibly) fewer heads and fewer layers (prune.layers:
    the logits distillation compares outputs only); else what differs."""
    for name in ("encoder_layers", "decoder_layers"):
        a, b = config_field(student_model_cfg, name), config_field(teacher_model_cfg, name)
        if a is None or b is None or a > b:
            return f"{name.replace('_', '-')} is {a} in the student and {b} in the teacher"
    for name in ("encoder_embed_dim", "decoder_embed_dim",
                 "encoder_ffn_embed_dim", "decoder_ffn_embed_dim", "encoder_normalize_before",
                 "decoder_normalize_before", "share_all_embeddings", "share_decoder_input_output_embed"):
        a, b = config_field(student_model_cfg, name), config_field(teacher_model_cfg, name)
        if a != b:
            return f"{name.replace('_', '-')} is {a} in the student and {b} in the teacher"
    return None


def check_hidden_layers(options: RecoverOptions, student_layers: int, teacher_layers: int) -> None:
    """The hidden-state term compares each student decoder layer with one teacher layer: one to one at equal depth,
    else through --distill-hidden-layers (one teacher layer per student layer, 1..teacher_layers)."""
    layers = parse_hidden_layers(options.distill_hidden_layers)
    if layers is not None and options.distillation.hidden_weight <= 0:
        raise UserError("--distill-hidden-layers maps the hidden-state term, which --distill-hidden-weight 0 turns off")
    if options.distillation.hidden_weight <= 0:
        return
    if layers is None:
        if student_layers != teacher_layers:
            raise UserError(f"--distill-hidden-weight compares decoder layers one to one: the student has "
                            f"{student_layers} and the teacher {teacher_layers} (give --distill-hidden-layers, or "
                            f"leave the term out: the logits distillation works at any depth)")
        return
    if len(layers) != student_layers or max(layers) > teacher_layers:
        raise UserError(f"--distill-hidden-layers {options.distill_hidden_layers}: one teacher layer "
                        f"(1..{teacher_layers}) for each of the student's {student_layers} decoder layers")


def vocabulary_sizes(weights: Dict[str, torch.Tensor]) -> Dict[str, int]:
    """Rows of the source embedding, the target embedding and the output projection of a state dict."""
    names = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight")
    return {n.split(".")[0] + "." + n.split(".")[1]: int(weights[n].shape[0]) for n in names if n in weights}


def first_shape_difference(weights: Dict[str, torch.Tensor], wanted: Dict[str, torch.Tensor]) -> Optional[str]:
    """The first parameter (by name) that one state dict lacks, holds extra, or holds in another shape; None when
    every parameter of `wanted` is in `weights` in its shape."""
    shapes = {k: tuple(v.shape) for k, v in weights.items() if torch.is_tensor(v)}
    wants = {k: tuple(v.shape) for k, v in wanted.items() if torch.is_tensor(v)}
    differs = sorted(set(shapes) ^ set(wants)) or sorted(k for k in wants if shapes[k] != wants[k])
    return differs[0] if differs else None


def data_fingerprint(data: str, subsets: List[str]) -> Dict[str, str]:
    """Hashes of the data folder's dictionaries and of every file of the given subsets (their sentences)."""
    out = {}
    for folder in data.split(os.pathsep):
        for path in sorted(glob.glob(os.path.join(folder, "*"))):
            name = os.path.basename(path)
            if os.path.isfile(path) and (name.startswith("dict") or any(name.startswith(s + ".") for s in subsets)):
                out[name] = file_sha256(path, 16)
    return out


def load_state(path: str) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise UserError(f"cannot load checkpoint {path}: {type(e).__name__}: {first}") from None


def saved_cfg(state: dict, path: str):
    cfg = state.get("cfg")
    if cfg is None or cfg.get("model") is None:
        raise UserError(f"{path} has no fairseq config (cfg): not a fairseq 0.10+ checkpoint")
    return cfg
