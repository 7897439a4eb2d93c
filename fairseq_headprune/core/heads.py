"""The vocabulary of heads: attention types, head addresses, the spec syntax, and a model's head layout.

Heads are addressed as in the papers' tables: (type, layer, head) with layer and head 1-indexed. A head keeps
its original number after physical pruning (each attention module records the ids it still holds), so a spec
written against the unpruned model means the same heads on a pruned one.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, NamedTuple, Tuple

from fairseq_headprune.errors import UserError

ATTENTION_TYPES: Tuple[str, ...] = ("enc-self", "enc-dec", "dec-self")
TYPE_DESCRIPTIONS = {
    "enc-self": "encoder self-attention",
    "enc-dec": "encoder-decoder attention",
    "dec-self": "decoder self-attention",
}


class HeadSpecError(UserError, ValueError):
    """A head spec that does not parse or does not fit the model; the message is one line for the user."""


class Head(NamedTuple):
    """One attention head, 1-indexed as in the papers."""

    type: str
    layer: int
    head: int

    def __str__(self) -> str:
        return f"{self.type}:{self.layer}:{self.head}"


class UnsupportedModelError(UserError, TypeError):
    """A model whose attention this package does not know how to address (not an encoder-decoder Transformer)."""


def attention_modules(model) -> Dict[Tuple[str, int], "object"]:
    """Map (type, 1-indexed layer) to the fairseq MultiheadAttention module of a transformer model."""
    from fairseq.modules.multihead_attention import MultiheadAttention

    stacks = [getattr(getattr(model, part, None), "layers", None) for part in ("encoder", "decoder")]
    if any(layers is None or not all(isinstance(getattr(layer, "self_attn", None), MultiheadAttention)
                                     for layer in layers) for layers in stacks):
        raise UnsupportedModelError(
            f"model {type(model).__name__} has no attention this package knows: it addresses the heads of fairseq's "
            "encoder-decoder Transformers (encoder.layers[i].self_attn, decoder.layers[i].self_attn and "
            ".encoder_attn), as the translation tasks build them")
    modules = {}
    for i, layer in enumerate(model.encoder.layers, start=1):
        modules[("enc-self", i)] = layer.self_attn
    for i, layer in enumerate(model.decoder.layers, start=1):
        modules[("dec-self", i)] = layer.self_attn
        if getattr(layer, "encoder_attn", None) is not None:
            modules[("enc-dec", i)] = layer.encoder_attn
    return modules


def head_ids(attn) -> List[int]:
    """The original (1-indexed) ids of the heads a module holds; all of them unless it was pruned."""
    return list(getattr(attn, "head_ids", range(1, attn.num_heads + 1)))


@dataclass(frozen=True)
class HeadLayout:
    """Which heads each (type, layer) holds: the model's real shape, for validation and messages."""

    heads: Mapping[Tuple[str, int], Tuple[int, ...]]
    original_heads: Mapping[Tuple[str, int], int]

    @classmethod
    def of(cls, model) -> "HeadLayout":
        mods = attention_modules(model)
        heads = {key: tuple(head_ids(m)) for key, m in mods.items()}
        original = {key: int(getattr(m, "original_num_heads", m.num_heads)) for key, m in mods.items()}
        return cls(heads, original)

    def layers(self, attn_type: str) -> List[int]:
        return sorted(layer for t, layer in self.heads if t == attn_type)

    def all_heads(self, types: Iterable[str] = ATTENTION_TYPES) -> List[Head]:
        return [Head(t, layer, h) for t in types for layer in self.layers(t) for h in self.heads[(t, layer)]]

    def describe(self) -> str:
        parts = []
        for t in ATTENTION_TYPES:
            layers = self.layers(t)
            counts = [len(self.heads[(t, layer)]) for layer in layers]
            if counts and len(set(counts)) == 1:
                parts.append(f"{t} {len(layers)} layers x {counts[0]} heads")
            else:
                parts.append(f"{t} {len(layers)} layers with {counts} heads")
        return "the model has " + ", ".join(parts)

    def check(self, heads: Iterable[Head]) -> None:
        """Raise HeadSpecError naming the first head the model does not hold."""
        for h in heads:
            if h.type not in ATTENTION_TYPES:
                raise HeadSpecError(f"unknown attention type '{h.type}' ({self.describe()})")
            layers = self.layers(h.type)
            if h.layer not in layers:
                raise HeadSpecError(
                    f"{h.type} layer {h.layer} does not exist: layers are 1..{len(layers)} ({self.describe()})"
                )
            held = self.heads[(h.type, h.layer)]
            if h.head not in held:
                original = self.original_heads[(h.type, h.layer)]
                if 1 <= h.head <= original:
                    raise HeadSpecError(f"head {h} was removed from this pruned model ({self.describe()})")
                raise HeadSpecError(
                    f"{h.type} layer {h.layer} has no head {h.head}: heads are 1..{original} ({self.describe()})"
                )


_ITEM = re.compile(r"^(?P<type>[a-z-]+):(?P<layer>\d+):(?P<heads>[0-9+\-]+)$")


def _parse_heads(text: str, where: str) -> List[int]:
    heads: List[int] = []
    for part in text.split("+"):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise HeadSpecError(f"bad heads '{text}' in '{where}': use a number, a range 1-4 or a list 2+5")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if lo > hi:
            raise HeadSpecError(f"bad range '{part}' in '{where}': start after end")
        heads.extend(range(lo, hi + 1))
    return heads


def _checked(attn_type: str, layer: int, heads: Iterable[int], where: str) -> List[Head]:
    if attn_type not in ATTENTION_TYPES:
        raise HeadSpecError(
            f"unknown attention type '{attn_type}' in '{where}' (expected one of {', '.join(ATTENTION_TYPES)})"
        )
    if layer < 1:
        raise HeadSpecError(f"layer {layer} in '{where}': layers are numbered from 1")
    out = []
    for h in heads:
        if h < 1:
            raise HeadSpecError(f"head {h} in '{where}': heads are numbered from 1")
        out.append(Head(attn_type, layer, h))
    return out


def parse_head_spec(spec: str) -> List[Head]:
    """Parse `TYPE:LAYER:HEADS[,...]` or `@file.json` into heads (syntax only; see HeadLayout.check)."""
    spec = spec.strip()
    if not spec:
        return []
    if spec.startswith("@"):
        return _parse_json_file(spec[1:])
    heads: List[Head] = []
    for item in spec.split(","):
        item = item.strip()
        m = _ITEM.match(item)
        if not m:
            raise HeadSpecError(f"bad head spec item '{item}': expected TYPE:LAYER:HEADS, e.g. enc-dec:6:1-4")
        heads += _checked(m["type"], int(m["layer"]), _parse_heads(m["heads"], item), item)
    return sorted(set(heads), key=_order)


def _parse_json_file(path: str) -> List[Head]:
    """JSON of the same structure: {"enc-dec": {"6": [1, 2, 3]}, ...}; heads may also be a spec string "1-4"."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise HeadSpecError(f"cannot read head spec file '{path}': {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise HeadSpecError(f"head spec file '{path}' is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise HeadSpecError(f"head spec file '{path}' must hold an object {{TYPE: {{LAYER: [HEADS]}}}}")
    heads: List[Head] = []
    for attn_type, layers in data.items():
        if attn_type == "meta":
            continue
        if not isinstance(layers, dict):
            raise HeadSpecError(f"'{attn_type}' in '{path}' must map layer numbers to head lists")
        for layer, hs in layers.items():
            where = f"{path}: {attn_type}/{layer}"
            if not str(layer).isdigit():
                raise HeadSpecError(f"bad layer '{layer}' in {where}")
            if isinstance(hs, str):
                hs = _parse_heads(hs, where)
            elif not (isinstance(hs, list) and all(isinstance(h, int) and not isinstance(h, bool) for h in hs)):
                raise HeadSpecError(f"heads in {where} must be a list of numbers or a spec string like '1-4'")
            heads += _checked(attn_type, int(layer), hs, where)
    return sorted(set(heads), key=_order)


def _order(h: Head) -> Tuple[int, int, int]:
    return (ATTENTION_TYPES.index(h.type) if h.type in ATTENTION_TYPES else 99, h.layer, h.head)


def format_head_spec(heads: Iterable[Head]) -> str:
    """The inverse of parse_head_spec: a compact spec string, one item per (type, layer)."""
    grouped: Dict[Tuple[str, int], List[int]] = {}
    for h in sorted(set(heads), key=_order):
        grouped.setdefault((h.type, h.layer), []).append(h.head)
    return ",".join(f"{t}:{layer}:{'+'.join(map(str, hs))}" for (t, layer), hs in grouped.items())
