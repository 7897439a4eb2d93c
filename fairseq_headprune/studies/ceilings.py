"""Speed ceilings: how fast CTranslate2 runs a shape, measured on a crude slice of the unpruned model.

A ceiling keeps the first k heads of every attention layer of each stack (encoder / decoder, CTranslate2's one
head count per stack), and optionally the first share of every FFN's hidden units and of the target vocabulary
(the output layer). Its translations mean nothing; its speed at equal work (every hypothesis forced to the same
length) is the speed of any trained model of that shape. Timed beside the deployment table's models (`deploy
--ceilings`), they say what each lever would buy where a target is missed: more heads removed, the FFN, the
output layer. Pure functions on a model; the timing is deploy's.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Iterable, List, Optional

import torch

from fairseq_headprune.errors import UserError

_SPEC = re.compile(r"^(?:(\d+)x)?(\d+)/(?:(\d+)x)?(\d+)(?::(.+))?$")
_LEVERS = ("ffn", "vocab")


@dataclass(frozen=True)
class CeilingShape:
    """Heads kept per stack, and the share (percent) of FFN hidden units and target vocabulary kept."""

    enc_heads: int
    dec_heads: int
    ffn_percent: float = 100.0
    vocab_percent: float = 100.0
    enc_layers: Optional[int] = None  # layers kept per stack (evenly spaced, compress.layers); None: all
    dec_layers: Optional[int] = None

    @classmethod
    def parse(cls, text: str, flag: str = "--ceilings") -> "CeilingShape":
        """`ENC/DEC[:ffn=P%][,vocab=P%]`, each side optionally `LAYERSxHEADS`: `8/4`, `8/3:ffn=75%`,
        `8/8:vocab=50%,ffn=50%`, `6x8/3x3` (the decoder at 3 layers of 3 heads). `flag`: the option refusals name."""
        match = _SPEC.match(text.strip())
        if not match:
            raise UserError(f"{flag}: {text!r} is not [L x]ENC/[L x]DEC[:ffn=P%,vocab=P%] (heads kept per stack, "
                            f"e.g. 8/4, or layers x heads, e.g. 6x8/3x3)")
        shares = {}
        for item in match.group(5).split(",") if match.group(5) else []:
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
        layers = {k: int(v) for k, v in (("enc_layers", match.group(1)), ("dec_layers", match.group(3))) if v}
        return cls(int(match.group(2)), int(match.group(4)), **shares, **layers)

    @property
    def label(self) -> str:
        levers = [f"{k} {p:g}%" for k, p in (("ffn", self.ffn_percent), ("vocab", self.vocab_percent)) if p < 100]
        enc = f"{self.enc_layers}x{self.enc_heads}" if self.enc_layers else f"{self.enc_heads}"
        dec = f"{self.dec_layers}x{self.dec_heads}" if self.dec_layers else f"{self.dec_heads}"
        return f"{enc}/{dec}" + (f" ({', '.join(levers)})" if levers else "")

    def check(self, model, flag: str = "--ceilings") -> None:
        """Refused in one line: more heads than a layer of the stack holds, or none."""
        from fairseq_headprune.core.heads import attention_modules

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


def kept_count(total: int, percent: float, least: int = 1) -> int:
    """The first round(total x percent) units, at least `least`."""
    return max(least, min(total, round(total * percent / 100)))


def crude_model(model, target_dictionary, shape: CeilingShape):
    """A copy of `model` cut to `shape` (the first heads, FFN units and target words kept) and its target
    dictionary, cut alike. Only its speed means anything."""
    from fairseq_headprune.core.heads import Head, attention_modules, head_ids
    from fairseq_headprune.core.surgery import prune_model

    from fairseq_headprune.compress.ffn import remove_units
    from fairseq_headprune.compress.layers import even_layers, remove_layers

    shape.check(model)
    model = copy.deepcopy(model)
    depth = {s: n for s, n in (("enc", shape.enc_layers), ("dec", shape.dec_layers)) if n is not None}
    remove_layers(model, {s: even_layers(len((model.encoder if s == "enc" else model.decoder).layers), n)
                          for s, n in depth.items()})
    removed: List[Head] = []
    for (attn_type, layer), attn in attention_modules(model).items():
        kept = shape.enc_heads if attn_type == "enc-self" else shape.dec_heads
        removed += [Head(attn_type, layer, h) for h in head_ids(attn)[kept:]]
    prune_model(model, removed)
    for layer in list(model.encoder.layers) + list(model.decoder.layers):
        remove_units(layer, list(range(kept_count(layer.fc1.out_features, shape.ffn_percent))))
    words = kept_count(len(target_dictionary), shape.vocab_percent, least=target_dictionary.nspecial + 1)
    return model, cut_target_vocabulary(model, target_dictionary, range(words))


def cut_target_vocabulary(model, target_dictionary, words: Iterable[int]):
    """Keep only these target words (ids; the special symbols always) in the decoder's input embeddings and output
    layer, in place, and return the dictionary cut alike (same order). CTranslate2 addresses words by their text, so
    its output maps back to the full dictionary's ids."""
    from fairseq_headprune.core.surgery import select_linear

    keep = sorted(set(range(target_dictionary.nspecial)) | set(words))
    dictionary = copy.copy(target_dictionary)
    dictionary.symbols = [target_dictionary.symbols[i] for i in keep]
    dictionary.indices = {s: i for i, s in enumerate(dictionary.symbols)}
    decoder = model.decoder
    decoder.output_projection = select_linear(decoder.output_projection, keep, 0)
    embed = decoder.embed_tokens
    index = torch.tensor(keep, dtype=torch.long, device=embed.weight.device)
    decoder.embed_tokens = torch.nn.Embedding.from_pretrained(  # the specials keep their ids, padding included
        embed.weight.detach().index_select(0, index), freeze=True, padding_idx=embed.padding_idx)
    return dictionary
