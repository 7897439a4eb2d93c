"""Head masks and gates under any registered fairseq task: `--task NAME_headprune` for every task NAME.

The fairseq translation models people hold are trained under several tasks (`translation`,
`translation_multi_simple_epoch` for M2M-100, NLLB and mBART-50, `translation_from_pretrained_bart` for mBART
fine-tunes), each with its own data loading, language tokens and generator. Rather than re-implement any of them,
this module registers, for every task fairseq knows, a subclass named `NAME_headprune` that is that task in every
respect except `build_model`: the model it builds (or loads) gets a ξ mask on every head before its weights load,
and the options below (`--mask-heads`, `--gated-types`, ...). `translation_headprune` is the one for `translation`.

`fairseq-headprune` itself needs none of the names: it converts whatever task it is given in place
(`with_head_masks`), so `--task translation_multi_simple_epoch` works as given. A task whose models have no
attention this package knows (language models, speech-to-text) is refused in one line when the model is built.
"""

# no `from __future__ import annotations`: fairseq reads the option dataclass's field types at run time
import argparse
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Dict

from fairseq.dataclass import FairseqDataclass
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.tasks import TASK_REGISTRY, FairseqTask, register_task

from fairseq_headprune.errors import UserError
from fairseq_headprune.core.gates import INIT_LOG_ALPHA, TEMPERATURE
from fairseq_headprune.core.heads import ATTENTION_TYPES, HeadSpecError, parse_head_spec
from fairseq_headprune.core.masking import install_head_gates, install_head_masks, set_head_masks

SUFFIX = "_headprune"


@dataclass
class HeadpruneOptions(FairseqDataclass):
    """The options every `*_headprune` task adds to its base task's."""

    mask_heads: str = field(
        default="",
        metadata={
            "help": "heads to mask: comma-separated TYPE:LAYER:HEADS (TYPE enc-self|enc-dec|dec-self, "
            "1-indexed LAYER and HEADS; HEADS a number, a range 1-4 or a list 2+5), or @file.json"
        },
    )
    gated_types: str = field(
        default="",
        metadata={"help": "put a Hard Concrete gate on every head of these attention types (comma-separated, "
                  "from enc-self, enc-dec, dec-self): Voita et al. 2019"},
    )
    gate_temperature: float = field(
        default=TEMPERATURE, metadata={"help": "Hard Concrete temperature (reference code 0.33; Louizos et al. 2/3)"}
    )
    gate_init_log_alpha: float = field(
        default=INIT_LOG_ALPHA,
        metadata={"help": "initial log alpha of every gate (>= log 11 = 2.40: gates start at exactly 1 in eval)"},
    )
    gate_lr_scale: float = field(
        default=1.0,
        metadata={"help": "log alpha = SCALE x the trained parameter: with Adam, a learning-rate multiplier "
                  "for the gates only"},
    )


def task_options(task) -> HeadpruneOptions:
    """The task's head options: from its dataclass config, or from a legacy task's argparse namespace; the
    defaults (masks installed, none set, no gates) for a task converted by `with_head_masks`."""
    source = getattr(task, "cfg", None)
    if source is None or not hasattr(source, "mask_heads"):
        source = getattr(task, "args", None)
    names = [f.name for f in fields(HeadpruneOptions)]
    return HeadpruneOptions(**{n: getattr(source, n) for n in names if getattr(source, n, None) is not None})


def prepare_model(model, options: HeadpruneOptions, task_name: str = "") -> None:
    """Masks on every head, gates on the asked types, ξ = 0 on --mask-heads; bad options raise UserError."""
    try:
        install_head_masks(model)
    except UserError as e:
        raise UserError(f"--task {task_name}: {e}" if task_name else str(e)) from None
    if options.gated_types:
        types = [t.strip() for t in options.gated_types.split(",") if t.strip()]
        bad = [t for t in types if t not in ATTENTION_TYPES]
        if bad or not (options.gate_temperature > 0 and options.gate_lr_scale > 0):
            what = (f"unknown attention type '{bad[0]}' (use {', '.join(ATTENTION_TYPES)})" if bad
                    else "--gate-temperature and --gate-lr-scale must be > 0")
            raise UserError(f"--gated-types: {what}")
        install_head_gates(model, types, options.gate_temperature, options.gate_init_log_alpha,
                           options.gate_lr_scale)
    if options.mask_heads:
        try:
            set_head_masks(model, parse_head_spec(options.mask_heads))
        except HeadSpecError as e:
            raise HeadSpecError(f"--mask-heads: {e}") from None


class HeadpruneTaskMixin:
    """Put first in the bases of a fairseq task: its models are built with head masks (and gates)."""

    base_task_name = ""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        repair(self)

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        prepare_model(model, task_options(self), self.base_task_name)
        return model


def repair(task) -> None:
    """fairseq 0.12's `translation_from_pretrained_bart` (mBART fine-tunes) is an argparse task on top of the
    dataclass `translation` task and reads `self.args`, which nothing sets: stock fairseq-train and -generate stop
    with `AttributeError: ... has no attribute 'args'`. Its `_headprune` twin sets it to the task's namespace."""
    if getattr(task, "args", None) is None and isinstance(getattr(task, "cfg", None), argparse.Namespace):
        task.args = task.cfg


_BY_BASE: Dict[type, type] = {}


def headprune_task_class(name: str, base: type) -> type:
    """The registered `NAME_headprune` subclass of task class `base` (registered on first use)."""
    registered = TASK_REGISTRY.get(name + SUFFIX)
    if registered is not None:
        _BY_BASE.setdefault(base, registered)
        return registered
    base_dc = getattr(base, "__dataclass", None)
    attrs = {"base_task_name": name, "__module__": __name__, "__doc__": f"`{name}` with head masks and gates."}
    if base_dc is None:  # a legacy argparse task: its own options, then ours
        def add_args(cls, parser, _base=base):
            _base.add_args(parser)
            gen_parser_from_dataclass(parser, HeadpruneOptions())
        attrs["add_args"] = classmethod(add_args)
        dc = None
    else:
        dc = make_dataclass(f"Headprune_{name}_config", [], bases=(HeadpruneOptions, base_dc))  # base fields first
    cls = type(f"Headprune_{name}", (HeadpruneTaskMixin, base), attrs)
    cls = register_task(name + SUFFIX, dataclass=dc)(cls)
    _BY_BASE.setdefault(base, cls)
    return cls


def register_all() -> None:
    """`NAME_headprune` for every task registered now (fairseq's own, this package's)."""
    for name, cls in list(TASK_REGISTRY.items()):
        if not name.endswith(SUFFIX) and not issubclass(cls, HeadpruneTaskMixin):
            headprune_task_class(name, cls)


def with_head_masks(task: FairseqTask) -> FairseqTask:
    """The same task object, its class switched in place to its `_headprune` subclass (nothing else changes:
    configuration, dictionaries and datasets stay), so that the models it builds or loads carry head masks.
    The options keep their defaults: no head is masked, no gate installed."""
    if isinstance(task, HeadpruneTaskMixin):
        return task
    base = type(task)
    cls = _BY_BASE.get(base)
    if cls is None:
        name = next((n for n, c in TASK_REGISTRY.items() if c is base), base.__name__)
        cls = headprune_task_class(name, base)
    task.__class__ = cls
    repair(task)
    return task

