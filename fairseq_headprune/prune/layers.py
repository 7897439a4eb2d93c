"""Whole encoder and decoder layers as units of pruning: selection, and the teacher layer of each kept one.

Layers are named by their ORIGINAL 1-indexed numbers here (as heads are by their original ids): `kept` maps a
stack ("enc" or "dec") to the teacher's layers it keeps, in order; stacks not named keep every layer.

Removing a pre- or post-norm transformer layer is exact (core.surgery.remove_layers): the model computes what the
unpruned one computes with that layer skipped (both its residual branches set to zero), since each layer maps the
residual stream to the next and nothing else reads it (fairseq's final LayerNorm, the encoder-decoder attention's
keys and values, and the alignment layer read the stack's output, which is the last kept layer's). The model's
config gets the new depth so that a written checkpoint rebuilds with fewer layers (fairseq_io.pruned_checkpoint).

Selection (Shleifer & Rush 2020 keep evenly spaced layers, the first and the last among them; `importance` removes
one layer at a time, the one whose removal raises the calibration loss the least, as the head search does with
heads) and the map from a student sublayer to the teacher sublayer whose output it is reconstructed towards.
"""
from __future__ import annotations

import contextlib
import copy
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from fairseq_headprune.decoding.layer_inputs import layer_inputs, starting_at
from fairseq_headprune.prune.select import output_nll, sentence_nll
from fairseq_headprune.core.shape import Key, depths, even_layers
from fairseq_headprune.core.surgery import remove_layers
from fairseq_headprune.errors import UserError

SELECTIONS = ("importance", "even")
_STACK_OF = {"enc-self": "enc", "enc-ffn": "enc", "enc-dec": "dec", "dec-self": "dec", "dec-ffn": "dec"}


def stack_of(sublayer_type: str) -> str:
    return _STACK_OF[sublayer_type]


def parse_keep_layers(text: str) -> Dict[str, int]:
    """"dec:3" or "dec:3,enc:5" -> {"dec": 3, "enc": 5}: how many layers each named stack keeps."""
    out: Dict[str, int] = {}
    for item in str(text).split(","):
        m = re.fullmatch(r"\s*(enc|dec)\s*:\s*(\d+)\s*", item)
        if not m:
            raise UserError(f"--keep-layers takes STACK:N[,STACK:N] with STACK enc or dec (e.g. dec:3), not {text!r}")
        if m.group(1) in out:
            raise UserError(f"--keep-layers names {m.group(1)} twice")
        out[m.group(1)] = int(m.group(2))
    return out


def check_counts(model, counts: Mapping[str, int]) -> None:
    """Each stack keeps at least one and at most all of its layers (fairseq and CTranslate2 need one)."""
    have = depths(model)
    for s, n in counts.items():
        if n < 1:
            raise UserError(f"--keep-layers {s}:{n}: a stack must keep at least one layer")
        if n > have[s]:
            raise UserError(f"--keep-layers {s}:{n}: the model's {s} stack has {have[s]} layers")


# --------------------------------------------------------------------------------------------- the teacher's layers


def teacher_key(key: Key, kept: Mapping[str, Sequence[int]], teacher_depths: Mapping[str, int]) -> Key:
    """The teacher sublayer whose residual stream after it a student sublayer is reconstructed towards.

    A kept layer's attention sublayers map to the same sublayer of its teacher layer; its FFN, the layer's last
    sublayer, to the FFN of the teacher layer just below the next kept one (the stack's last layer for the last
    kept layer): what the removed layers above it added is what its output must now add too. The key's type names
    the sublayer (enc-self, enc-ffn, dec-self, enc-dec, dec-ffn); stacks not in `kept` map to themselves."""
    t, j = key
    s = stack_of(t)
    if s not in kept:
        return key
    layers = list(kept[s])
    if t.endswith("-ffn"):
        nxt = layers[j] if j < len(layers) else teacher_depths[s] + 1
        return (t, nxt - 1)
    return (t, layers[j - 1])


def teacher_outputs(kept: Mapping[str, Sequence[int]], teacher_depths: Mapping[str, int]) -> Dict[str, List[int]]:
    """{stack: the teacher layer whose output each kept layer's output stands for} (its last sublayer's map): the
    `recover --distill-hidden-layers` of the decoder."""
    return {s: [teacher_key((f"{s}-ffn", j), kept, teacher_depths)[1] for j in range(1, len(v) + 1)]
            for s, v in kept.items()}


def layer_map_json(kept: Mapping[str, Sequence[int]]) -> Dict[str, List[int]]:
    return {s: list(v) for s, v in kept.items()}


# --------------------------------------------------------------------------------------------- selection


@torch.no_grad()
def calibration_loss(model, samples: Sequence[dict], pad: int) -> float:
    """Mean token NLL (no label smoothing) of the model on the samples, teacher-forced, in eval mode."""
    model.eval()
    total, tokens = 0.0, 0
    for sample in samples:
        total += float(sentence_nll(model, sample, pad))
        tokens += int(sample["target"].ne(pad).sum())
    return total / max(tokens, 1)


class CutLoss:
    """`calibration_loss` of the model with only some of its layers, `loss(kept, parent)` ({stack: original layers
    kept}; `parent`: the layers of the model the candidate removes one layer from, None for the whole model), as
    it is on remove_layers' copy, without the copy and without running again what the cut leaves as it was: while
    the encoder is whole its output is reused, and a decoder cut starts at its first changed layer, from the input
    that layer receives in the parent (one recorded forward of the parent a step). The layers that run compute
    what they compute in the copy (decoding.layer_inputs.starting_at)."""

    def __init__(self, model, samples: Sequence[dict], pad: int):
        self.model, self.samples, self.pad = model, samples, pad
        self.encoder_outs: Optional[List[dict]] = None
        self.parent: Optional[Tuple[int, ...]] = None  # the decoder layers whose inputs `inputs` holds
        self.inputs: List[List[torch.Tensor]] = []  # per batch, the input of each of the parent's layers

    @torch.no_grad()
    def __call__(self, kept: Mapping[str, Sequence[int]], parent: Optional[Mapping[str, Sequence[int]]] = None
                 ) -> float:
        whole = depths(self.model)
        if len(kept.get("enc", range(whole["enc"]))) < whole["enc"]:  # the encoder cut: the copy, run whole
            return calibration_loss(remove_layers(copy.deepcopy(self.model), kept), self.samples, self.pad)
        layers = tuple(kept.get("dec", range(1, whole["dec"] + 1)))
        if parent is None:  # the whole model: its forward recorded, the parent of the first step's candidates
            return self._run(layers, record=True)
        above = tuple(parent.get("dec", range(1, whole["dec"] + 1)))
        if above != self.parent:
            self._run(above, record=True)
        same = next((i for i, (a, b) in enumerate(zip(layers, above)) if a != b), len(layers))
        return self._run(layers, start=min(same, len(layers) - 1))  # the last layer cut: its layer below reruns

    def _run(self, layers: Tuple[int, ...], start: Optional[int] = None, record: bool = False) -> float:
        """The mean token NLL with the decoder holding `layers`, from the parent's input of position `start` (None:
        from the embeddings); with `record`, each layer's input kept as the parent's."""
        self.model.eval()
        decoder = self.model.decoder
        if self.encoder_outs is None:
            self.encoder_outs = [self.model.encoder(s["net_input"]["src_tokens"],
                                                    src_lengths=s["net_input"]["src_lengths"]) for s in self.samples]
        total, tokens, inputs = 0.0, 0, []
        with decoder_holding(decoder, layers):
            for b, sample in enumerate(self.samples):
                net_input = sample["net_input"]
                with contextlib.ExitStack() as scope:
                    if start is not None:
                        scope.enter_context(starting_at(decoder, start, self.inputs[b][start]))
                    if record:
                        inputs.append(scope.enter_context(layer_inputs(decoder.layers)))
                    output = decoder(net_input["prev_output_tokens"], encoder_out=self.encoder_outs[b],
                                     src_lengths=net_input["src_lengths"], return_all_hiddens=True)
                total += float(output_nll(self.model, output, sample, self.pad))
                tokens += int(sample["target"].ne(self.pad).sum())
        if record:
            self.parent, self.inputs = layers, inputs
        return total / max(tokens, 1)


@contextlib.contextmanager
def decoder_holding(decoder, layers: Sequence[int]) -> Iterator[None]:
    """The decoder runs only these of its layers (original 1-indexed numbers), as remove_layers leaves it."""
    held, count = decoder.layers, decoder.num_layers
    decoder.layers = nn.ModuleList([held[i - 1] for i in layers])
    decoder.num_layers = len(layers)
    try:
        yield
    finally:
        decoder.layers, decoder.num_layers = held, count


@dataclass
class LayerSelection:
    kept: Dict[str, Tuple[int, ...]]
    rule: str
    loss_before: Optional[float] = None
    steps: List[dict] = field(default_factory=list)  # greedy: per step, every candidate's loss and the removed one

    def as_json(self, teacher_depths: Optional[Mapping[str, int]] = None) -> dict:
        out = {"kept": layer_map_json(self.kept), "rule": self.rule, "loss_before": self.loss_before,
               "steps": self.steps}
        if teacher_depths:  # the teacher layer whose output each kept layer's output was reconstructed towards
            out["teacher_outputs"] = teacher_outputs(self.kept, teacher_depths)
        return out


def select_even(model, counts: Mapping[str, int]) -> LayerSelection:
    have = depths(model)
    return LayerSelection({s: even_layers(have[s], n) for s, n in counts.items()}, "even")


def select_by_loss(model, counts: Mapping[str, int], loss: Callable[..., float], log=None) -> LayerSelection:
    """Greedy: remove, one at a time, the layer (of any stack still above its count) whose removal leaves the
    lowest calibration loss; `loss(kept, parent)` scores the model holding only the layers `kept` ({stack: the
    original layers kept}), one fewer than `parent` (None: the whole model; CutLoss)."""
    have = depths(model)
    kept = {s: list(range(1, have[s] + 1)) for s in counts}
    result = LayerSelection({}, "importance", loss(kept, None))
    while any(len(kept[s]) > counts[s] for s in counts):
        trials = {}
        for s in counts:
            if len(kept[s]) <= counts[s]:
                continue
            for i in kept[s]:
                candidate = {t: [k for k in v if not (t == s and k == i)] for t, v in kept.items()}
                trials[(s, i)] = loss(candidate, kept)
        (s, i), best = min(trials.items(), key=lambda kv: (kv[1], kv[0]))
        kept[s].remove(i)
        result.steps.append({"removed": f"{s}:{i}", "loss": best,
                             "candidates": {f"{a}:{b}": v for (a, b), v in sorted(trials.items())}})
        if log:
            log(f"layer search: remove {s}:{i} (calibration loss {best:.4f}; candidates "
                f"{', '.join(f'{a}:{b} {v:.3f}' for (a, b), v in sorted(trials.items()))})")
    result.kept = {s: tuple(v) for s, v in kept.items()}
    return result
