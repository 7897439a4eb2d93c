"""A model's shape as data (ModelShape): the heads each attention layer holds, the layers each stack keeps, each FFN's
width and the target vocabulary; what its decoding costs (core.flops), how a checkpoint records it; and the shape
compress chooses and deploy's speed ceilings are cut to (Shape).

Read here, removed in `surgery`: a shape never changes a model. Heads are named by their original 1-indexed ids
(`heads.HeadLayout`), layers and FFNs by (stack, 1-indexed layer) with stack "enc" or "dec". A pruned checkpoint
records the shape in its model config as JSON: `kept_heads` ({TYPE: {LAYER: [ids]}}, the layers that lost heads)
and `kept_ffn` ({"enc"|"dec": {LAYER: UNITS}}, the layers narrower than the configured width); its depth is the
config's own encoder_layers / decoder_layers.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from fairseq_headprune.core.heads import ATTENTION_TYPES, HeadLayout, HeadSpecError, attention_modules, head_ids
from fairseq_headprune.errors import UserError

Key = Tuple[str, int]  # ("enc" | "dec", 1-indexed layer)
STACKS = ("enc", "dec")


# --------------------------------------------------------------------------------------------- read from a model


def stack_module(model, stack: str):
    """The encoder ("enc") or decoder ("dec") of a fairseq transformer."""
    return model.encoder if stack == "enc" else model.decoder


def depths(model) -> Dict[str, int]:
    """{stack: its number of layers}."""
    return {s: len(stack_module(model, s).layers) for s in STACKS}


def ffn_layers(model) -> Dict[Key, object]:
    """{(stack, layer): the transformer layer holding that FFN}, encoder first."""
    return {(s, i): layer for s in STACKS for i, layer in enumerate(stack_module(model, s).layers, 1)}


def ffn_widths(model) -> Dict[Key, int]:
    """{(stack, layer): the FFN's hidden units}."""
    return {key: layer.fc1.out_features for key, layer in ffn_layers(model).items()}


@dataclass(frozen=True)
class ModelShape:
    """What surgery may have changed in a model, and all its decoding cost depends on (core.flops): the width, the
    target vocabulary, each layer's FFN units (the number of layers with them), the heads each (type, layer) holds
    and their dimension; read from a model, also which original heads those are (`layout`)."""

    embed_dim: int
    vocab: int
    enc_ffn: Tuple[int, ...]
    dec_ffn: Tuple[int, ...]
    heads: Mapping[Tuple[str, int], int]  # (type, 1-indexed layer) -> heads it holds
    head_dims: Mapping[Tuple[str, int], int]  # (type, 1-indexed layer) -> head dimension
    layout: Optional[HeadLayout] = field(default=None, compare=False)  # the original ids held (`of` a model)

    @classmethod
    def uniform(cls, *, enc_layers: int, dec_layers: int, heads: int, embed_dim: int, ffn: int, vocab: int,
                head_dim: Optional[int] = None) -> "ModelShape":
        """A model with the same number of heads in every attention module (head_dim = embed_dim / heads)."""
        keys = [("enc-self", i) for i in range(1, enc_layers + 1)]
        keys += [(t, i) for i in range(1, dec_layers + 1) for t in ("enc-dec", "dec-self")]
        return cls(embed_dim, vocab, (ffn,) * enc_layers, (ffn,) * dec_layers, {k: heads for k in keys},
                   {k: head_dim or embed_dim // heads for k in keys})

    @classmethod
    def of(cls, model) -> "ModelShape":
        """Read a fairseq transformer (pruned or not); attention modules report their own head counts and ids."""
        modules = {("enc-self", i): layer.self_attn for i, layer in enumerate(model.encoder.layers, start=1)}
        for i, layer in enumerate(model.decoder.layers, start=1):
            modules[("dec-self", i)] = layer.self_attn
            if getattr(layer, "encoder_attn", None) is not None:
                modules[("enc-dec", i)] = layer.encoder_attn
        layout = HeadLayout({k: tuple(head_ids(m)) for k, m in modules.items()},
                            {k: int(getattr(m, "original_num_heads", m.num_heads)) for k, m in modules.items()})
        return cls(model.encoder.embed_tokens.embedding_dim, model.decoder.output_projection.out_features,
                   tuple(layer.fc1.out_features for layer in model.encoder.layers),
                   tuple(layer.fc1.out_features for layer in model.decoder.layers),
                   {k: m.num_heads for k, m in modules.items()}, {k: m.head_dim for k, m in modules.items()},
                   layout)

    def without(self, heads: Iterable[Sequence]) -> "ModelShape":
        """The shape after removing heads given as (type, layer, head) (heads.Head or tuples); ids may repeat."""
        removed: Dict[Tuple[str, int], set] = {}
        for h in heads:
            removed.setdefault((h[0], int(h[1])), set()).add(int(h[2]))
        counts = dict(self.heads)
        for key, ids in removed.items():
            if key not in counts:
                raise ValueError(f"{key[0]} layer {key[1]} is not in this model")
            if len(ids) > counts[key]:
                raise ValueError(f"{key[0]} layer {key[1]} holds {counts[key]} heads, {len(ids)} removed")
            counts[key] -= len(ids)
        return replace(self, heads=counts, layout=None)

    def width(self, attn_type: str, layer: int) -> int:
        """heads x head_dim of one attention module: the size its cost scales with (0 if it has no heads)."""
        return self.heads.get((attn_type, layer), 0) * self.head_dims.get((attn_type, layer), 0)

    @property
    def ffn(self) -> Dict[Key, int]:
        """{(stack, layer): the FFN's hidden units}."""
        return {(s, i): units for s, widths in (("enc", self.enc_ffn), ("dec", self.dec_ffn))
                for i, units in enumerate(widths, 1)}

    def kept_heads(self) -> Dict[str, Dict[str, List[int]]]:
        """{type: {layer: [original ids still held]}} for the layers that lost heads (JSON-ready); needs `layout`."""
        if self.layout is None:
            raise ValueError("a shape not read from a model does not know which heads it holds")
        return kept_in(self.layout)

    def kept_heads_json(self) -> str:
        """The `--kept-heads` value that rebuilds these heads; "" when no layer lost one."""
        kept = self.kept_heads()
        return json.dumps(kept, separators=(",", ":")) if kept else ""

    def kept_ffn_json(self, configured: Mapping[str, int]) -> str:
        """The `--kept-ffn` value that rebuilds these FFN widths (the layers narrower than `configured`)."""
        return kept_ffn_json(self.ffn, configured)


def kept_in(layout: HeadLayout) -> Dict[str, Dict[str, List[int]]]:
    """{type: {layer: [original ids still held]}} for the layers of a head layout that lost heads (JSON-ready)."""
    out: Dict[str, Dict[str, List[int]]] = {}
    for attn_type in ATTENTION_TYPES:
        for layer in layout.layers(attn_type):
            held = layout.heads[(attn_type, layer)]
            if len(held) < layout.original_heads[(attn_type, layer)]:
                out.setdefault(attn_type, {})[str(layer)] = list(held)
    return out


def kept_heads(model) -> Dict[str, Dict[str, List[int]]]:
    """{type: {layer: [original ids still held]}} for the pruned layers only (JSON-ready)."""
    return kept_in(HeadLayout.of(model))


def kept_ffn_json(widths: Mapping[Key, int], configured: Mapping[str, int]) -> str:
    """The `--kept-ffn` value that rebuilds these FFN widths ({(stack, layer): units}, ffn_widths): the layers
    narrower than `configured` ({stack: width}, configured_widths)."""
    out: Dict[str, Dict[str, int]] = {}
    for (s, i), units in widths.items():
        if units != configured.get(s):
            out.setdefault(s, {})[str(i)] = units
    return json.dumps(out, separators=(",", ":")) if out else ""


def kept_heads_json(model) -> str:
    """The `--kept-heads` value that rebuilds this model's shape; "" for an unpruned model."""
    kept = kept_heads(model)
    return json.dumps(kept, separators=(",", ":")) if kept else ""


# --------------------------------------------------------------------------------------------- as a config records it


def configured_widths(model_cfg) -> Dict[str, int]:
    """{stack: the FFN width the config builds} (legacy Namespace or dict config)."""
    get = (lambda k: model_cfg.get(k)) if isinstance(model_cfg, Mapping) else (lambda k: getattr(model_cfg, k, None))
    return {"enc": get("encoder_ffn_embed_dim"), "dec": get("decoder_ffn_embed_dim")}


def parse_kept_heads(kept: Union[str, Mapping]) -> Dict[Tuple[str, int], List[int]]:
    """{(type, layer): [ids]} from the JSON; a checkpoint edited by hand gets a one-line error, not a traceback."""
    if isinstance(kept, str):
        try:
            kept = json.loads(kept) if kept.strip() else {}
        except json.JSONDecodeError as e:
            raise HeadSpecError(f"--kept-heads is not valid JSON: {e}") from None
    if not isinstance(kept, Mapping) or not all(isinstance(v, Mapping) for v in kept.values()):
        raise HeadSpecError("--kept-heads must be a JSON object {TYPE: {LAYER: [HEADS]}}")
    out = {}
    for attn_type, layers in kept.items():
        for layer, ids in layers.items():
            if not str(layer).isdigit() or not (
                isinstance(ids, list) and all(isinstance(h, int) and not isinstance(h, bool) for h in ids)
            ):
                raise HeadSpecError(f"--kept-heads: bad entry {attn_type}/{layer}: expected a layer number and a list")
            out[(attn_type, int(layer))] = ids
    return out


def parse_kept_ffn(kept: Union[str, Mapping]) -> Dict[Key, int]:
    """{(stack, layer): units} from the JSON; a hand-edited checkpoint gets one line, not a traceback."""
    if isinstance(kept, str):
        try:
            kept = json.loads(kept) if kept.strip() else {}
        except json.JSONDecodeError as e:
            raise UserError(f"--kept-ffn is not valid JSON: {e}") from None
    if not isinstance(kept, Mapping) or not all(s in STACKS and isinstance(v, Mapping) for s, v in kept.items()):
        raise UserError('--kept-ffn must be a JSON object {"enc"|"dec": {LAYER: UNITS}}')
    out = {}
    for s, layers in kept.items():
        for layer, units in layers.items():
            if not str(layer).isdigit() or not isinstance(units, int) or isinstance(units, bool) or units < 1:
                raise UserError(f"--kept-ffn: bad entry {s}/{layer}: expected a layer number and a unit count")
            out[(s, int(layer))] = units
    return out


# --------------------------------------------------------------------------------------------- counts and spacing


def kept_count(total: int, percent: float, least: int = 1) -> int:
    """The first round(total x percent) units, at least `least`."""
    return max(least, min(total, round(total * percent / 100)))


def even_layers(n_layers: int, n_keep: int) -> Tuple[int, ...]:
    """Evenly spaced layers, first and last kept, positions rounded down: Shleifer & Rush's table for 6 layers
    (6 -> 3: 1, 3, 6; 6 -> 4: 1, 2, 4, 6; 6 -> 2: 1, 6), 1-indexed."""
    if not 1 <= n_keep <= n_layers:
        raise ValueError(f"cannot keep {n_keep} of {n_layers} layers")
    if n_keep == 1:
        return (1,)
    step = (n_layers - 1) / (n_keep - 1)
    return tuple(int(i * step + 1e-9) + 1 for i in range(n_keep))


# --------------------------------------------------------------------------------------------- a speed ceiling's shape

_CEILING = re.compile(r"^(?:(\d+)x)?(\d+)/(?:(\d+)x)?(\d+)(?::(.+))?$")
_LEVERS = ("ffn", "vocab")


def _shares(text: str, items: Optional[str], flag: str) -> Dict[str, float]:
    """{"ffn_percent": P, "vocab_percent": P} from `ffn=P%,vocab=P%`."""
    shares = {}
    for item in items.split(",") if items else []:
        key, sep, value = item.partition("=")
        if key not in _LEVERS or not sep:
            raise UserError(f"{flag} {text}: {item!r} is not ffn=P% or vocab=P%")
        try:
            percent = float(value.rstrip("%"))
        except ValueError:
            raise UserError(f"{flag} {text}: {key} takes a percentage, not {value!r}") from None
        if not 0 < percent <= 100:
            raise UserError(f"{flag} {text}: {key} keeps a share in (0, 100]%, not {value}")
        shares[f"{key}_percent"] = percent
    return shares


@dataclass(frozen=True)
class Shape:
    """A shape compress chooses, deploy times and the card states: the heads kept in every attention layer of each
    stack (CTranslate2's one head count per stack), the layers each stack keeps, and the share (percent) of every
    FFN's hidden units and of the target vocabulary. Its text is the command line's (`parse`, `label`) and the
    card's (`words`); its point the choice's records' (`record`, `of_record`; against the whole model: `point`,
    `of_point`). surgery.crude_model cuts it from a model crudely: the first heads, evenly spaced layers, the first
    units."""

    enc_heads: int
    dec_heads: int
    ffn_percent: float = 100.0
    vocab_percent: float = 100.0
    enc_layers: Optional[int] = None  # layers kept per stack (evenly spaced); None: all
    dec_layers: Optional[int] = None

    @classmethod
    def parse(cls, text: str, flag: str = "--ceilings") -> "Shape":
        """`ENC/DEC[:ffn=P%][,vocab=P%]`, each side optionally `LAYERSxHEADS`: `8/4`, `8/3:ffn=75%`,
        `8/8:vocab=50%,ffn=50%`, `6x8/3x3` (the decoder at 3 layers of 3 heads). `flag`: the option refusals name."""
        match = _CEILING.match(text.strip())
        if not match:
            raise UserError(f"{flag}: {text!r} is not [L x]ENC/[L x]DEC[:ffn=P%,vocab=P%] (heads kept per stack, "
                            f"e.g. 8/4, or layers x heads, e.g. 6x8/3x3)")
        shares = _shares(text, match.group(5), flag)
        layers = {k: int(v) for k, v in (("enc_layers", match.group(1)), ("dec_layers", match.group(3))) if v}
        return cls(int(match.group(2)), int(match.group(4)), **shares, **layers)

    @classmethod
    def of_point(cls, point: Mapping[str, float], whole: Mapping[str, int]) -> "Shape":
        """The shape of a choice point {field: value}, a field not given whole (`whole`: levers.stack_sizes)."""
        layers = int(point.get("dec_layers", whole["dec_layers"]))
        return cls(int(point.get("enc_heads", whole["enc_heads"])), int(point.get("dec_heads", whole["dec_heads"])),
                   float(point.get("ffn_percent", 100.0)), float(point.get("vocab_percent", 100.0)),
                   enc_layers=int(point["enc_layers"]) if "enc_layers" in point else None,
                   dec_layers=layers if layers < whole["dec_layers"] else None)

    @classmethod
    def of_record(cls, point: Mapping[str, float]) -> "Shape":
        """The shape of a point as the choice's records keep it: heads per stack, and only what it cuts of the
        rest (a field absent: kept whole)."""
        return cls(int(point["enc_heads"]), int(point["dec_heads"]), float(point.get("ffn_percent", 100.0)),
                   float(point.get("vocab_percent", 100.0)),
                   enc_layers=int(point["enc_layers"]) if "enc_layers" in point else None,
                   dec_layers=int(point["dec_layers"]) if "dec_layers" in point else None)

    def record(self) -> Dict[str, float]:
        """The point of_record reads: heads per stack, a depth where one is given, a share below 100%."""
        point: Dict[str, float] = {"enc_heads": self.enc_heads, "dec_heads": self.dec_heads}
        for name in ("dec_layers", "enc_layers"):
            if getattr(self, name) is not None:
                point[name] = getattr(self, name)
        for name in ("ffn_percent", "vocab_percent"):
            if getattr(self, name) < 100:
                point[name] = getattr(self, name)
        return point

    def point(self, whole: Mapping[str, int]) -> Dict[str, float]:
        """The choice point of this shape: its record without a depth equal to the whole's (`whole`: as
        of_point's, with the encoder's depth too, "enc_layers")."""
        return {k: v for k, v in self.record().items() if k not in ("dec_layers", "enc_layers") or v != whole[k]}

    def words(self, mapped: bool = False) -> str:
        """The shape as the verdict and the card say it: "4/2 heads per stack (encoder/decoder)", or with a depth
        cut "encoder 4 heads per layer, decoder 3 layers x 2 heads"; ", every FFN at 50% of its units" when
        narrowed, ", with the vocabulary map" when it ships one (`mapped`)."""
        ffn = f", every FFN at {self.ffn_percent:g}% of its units" if self.ffn_percent < 100 else ""
        ffn += ", with the vocabulary map" if mapped else ""
        if self.dec_layers is None and self.enc_layers is None:
            return f"{self.enc_heads}/{self.dec_heads} heads per stack (encoder/decoder){ffn}"
        enc = (f"{self.enc_layers} layers x {self.enc_heads} heads" if self.enc_layers is not None else
               f"{self.enc_heads} heads per layer")
        dec = (f"{self.dec_layers} layers x {self.dec_heads} heads" if self.dec_layers is not None else
               f"{self.dec_heads} heads per layer")
        return f"encoder {enc}, decoder {dec}{ffn}"

    @property
    def label(self) -> str:
        levers = [f"{k} {p:g}%" for k, p in (("ffn", self.ffn_percent), ("vocab", self.vocab_percent)) if p < 100]
        enc = f"{self.enc_layers}x{self.enc_heads}" if self.enc_layers is not None else f"{self.enc_heads}"
        dec = f"{self.dec_layers}x{self.dec_heads}" if self.dec_layers is not None else f"{self.dec_heads}"
        return f"{enc}/{dec}" + (f" ({', '.join(levers)})" if levers else "")

    def check(self, model, flag: str = "--ceilings") -> None:
        """Refused in one line: more heads than a layer of the stack holds, or none."""
        depth = {"encoder": (len(model.encoder.layers), self.enc_layers),
                 "decoder": (len(model.decoder.layers), self.dec_layers)}
        for stack, (have, kept) in depth.items():
            if kept is not None and not 1 <= kept <= have:
                raise UserError(f"{flag} {self.label}: the {stack} keeps 1 to {have} layers, not {kept}")
        held = {"encoder": [], "decoder": []}
        for (attn_type, _), attn in attention_modules(model).items():
            held["encoder" if attn_type == "enc-self" else "decoder"].append(int(attn.num_heads))
        for stack, kept in (("encoder", self.enc_heads), ("decoder", self.dec_heads)):
            if not 1 <= kept <= min(held[stack]):
                raise UserError(f"{flag} {self.label}: the {stack} keeps 1 to {min(held[stack])} heads per "
                                f"layer in this model, not {kept}")


MAP_FIELD = "vocab_map"  # a shape point's flag: it ships (or is timed with) the vocabulary map


def shape_words(point: Dict) -> str:
    """Shape.words of a point as the choice's records keep it (the map: its MAP_FIELD)."""
    return Shape.of_record(point).words(bool(point.get(MAP_FIELD)))
