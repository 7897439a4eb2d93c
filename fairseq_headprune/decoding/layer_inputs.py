"""Forward passes that start at the lowest masked layer, from cached unmasked layer inputs.

A head mask in layer L of a stack changes nothing below L: layers 1..L of that stack see the inputs of the
unmasked model. A sweep runs one pass per mask over the same batches, so the unmasked encoder output (reused by
every decode under decoder-side masks) and, for teacher-forced passes (`ablate --metric loss`), the unmasked
input of every layer are recorded once; each masked forward then starts at its lowest masked layer. The layers
that do run compute exactly what they compute in a full forward (the NLL matches to float rounding, tested).

Memory: one (tokens x d_model) tensor per layer per batch, plus the encoder output and the decoder features.
"""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from torch import nn

from fairseq_headprune.core.heads import attention_modules
from fairseq_headprune.core.masking import current_masked_heads, set_head_masks


class LayerInputCache:
    """Per batch: the unmasked encoder output (what decoding under decoder-side masks reuses) and, once a loss
    forward needs them, the unmasked inputs of every encoder and decoder layer. Cleared when the weights change."""

    def __init__(self, model):
        self.model = model
        self._encoder_outs: Dict[int, dict] = {}
        self._encoder_inputs: Dict[int, List[torch.Tensor]] = {}
        self._layers: Dict[int, dict] = {}
        self._weights_version = self._version()

    def _version(self) -> int:
        """Changes whenever a parameter is modified in place (a checkpoint loaded into the model, a training step)."""
        return sum(p._version for p in self.model.parameters())

    def _check_weights(self) -> None:
        if self._version() != self._weights_version:
            self._encoder_outs.clear()
            self._encoder_inputs.clear()
            self._layers.clear()
            self._weights_version = self._version()

    def encoder_out(self, b: int, net_input: dict) -> dict:
        """Batch b's encoder output with no encoder head masked or gated."""
        self._check_weights()
        if b not in self._encoder_outs:
            with _unmasked(self.model):
                self._encoder_outs[b] = self.model.encoder.forward_torchscript(net_input)
        return self._encoder_outs[b]

    def encoder_inputs(self, b: int, net_input: dict) -> List[torch.Tensor]:
        """Batch b's unmasked input of every encoder layer (one unmasked encoder pass, kept)."""
        self._check_weights()
        if b in self._layers:
            return self._layers[b]["encoder"]
        if b not in self._encoder_inputs:
            with _unmasked(self.model), layer_inputs(self.model.encoder.layers) as inputs:
                out = self.model.encoder.forward_torchscript(net_input)
            self._encoder_outs.setdefault(b, out)
            self._encoder_inputs[b] = inputs
        return self._encoder_inputs[b]

    def encoder_out_from(self, b: int, net_input: dict, start: int, times: int = 1) -> dict:
        """Batch b's encoder output under the encoder's current masks (fixed ξ or per-row masks), computed from
        layer `start` (0-based) up: no mask below `start` may be set. The layers below run unmasked, so their
        recorded outputs are reused. times > 1: for the batch repeated `times` times (mask-major rows, as a shared
        beam search has them)."""
        hidden = self.encoder_inputs(b, net_input)[start]  # T x B x C
        if times > 1:
            hidden = hidden.repeat(1, times, 1)
            net_input = {k: (v.repeat(times, *([1] * (v.dim() - 1))) if torch.is_tensor(v) else v)
                         for k, v in net_input.items()}
        with starting_at(self.model.encoder, start, hidden):
            return self.model.encoder.forward_torchscript(net_input)

    def decoder_features(self, b: int, net_input: dict) -> torch.Tensor:
        """model.decoder(..., features_only=True) features of batch b under the model's current masks."""
        starts = lowest_masked_layers(self.model)
        if starts is None or self.model.training:  # gates, per-row masks or dropout: nothing is fixed
            return self.model(**net_input, features_only=True)[0]
        cached = self._layer_inputs(b, net_input)
        enc_start, dec_start = starts
        decoder, prev = self.model.decoder, net_input["prev_output_tokens"]
        if enc_start is not None:
            with starting_at(self.model.encoder, enc_start, cached["encoder"][enc_start]):
                encoder_out = self.model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
            return decoder(prev, encoder_out=encoder_out, features_only=True)[0]
        if dec_start is None:
            return cached["features"]
        encoder_out = self.encoder_out(b, net_input)  # not inside starting_at: that hides the lower layers
        with starting_at(decoder, dec_start, cached["decoder"][dec_start]):
            return decoder(prev, encoder_out=encoder_out, features_only=True)[0]

    def _layer_inputs(self, b: int, net_input: dict) -> dict:
        """One unmasked forward of batch b, keeping every layer's input and the decoder's features."""
        self._check_weights()
        if b not in self._layers:
            encoder, decoder = self.model.encoder, self.model.decoder
            with _unmasked(self.model), layer_inputs(encoder.layers) as enc_inputs:
                self._encoder_outs.setdefault(b, encoder.forward_torchscript(net_input))
            with _unmasked(self.model), layer_inputs(decoder.layers) as dec_inputs:
                features = decoder(net_input["prev_output_tokens"], encoder_out=self.encoder_out(b, net_input),
                                   features_only=True)[0]
            self._layers[b] = {"encoder": enc_inputs, "decoder": dec_inputs, "features": features}
        return self._layers[b]


def lowest_masked_layers(model) -> Optional[Tuple[Optional[int], Optional[int]]]:
    """(lowest masked encoder layer, lowest masked decoder layer), 0-based, None where nothing is masked; None
    altogether when a gate or a per-row mask is active (their effect is not a fixed ξ)."""
    for attn in attention_modules(model).values():
        if attn.head_gate is not None or attn.row_head_mask is not None:
            return None
    masked = current_masked_heads(model)
    enc = min((h.layer - 1 for h in masked if h.type == "enc-self"), default=None)
    dec = min((h.layer - 1 for h in masked if h.type != "enc-self"), default=None)
    return enc, dec


@contextlib.contextmanager
def _unmasked(model) -> Iterator[None]:
    """All ξ = 1 for the duration; the masks are put back afterwards."""
    masked = current_masked_heads(model)
    set_head_masks(model, [])
    try:
        yield
    finally:
        set_head_masks(model, masked)


@contextlib.contextmanager
def layer_inputs(layers: nn.ModuleList) -> Iterator[List[torch.Tensor]]:
    """Records the first positional input (the hidden states) of each layer, in order."""
    inputs: List[torch.Tensor] = []
    handles = [layer.register_forward_pre_hook(lambda _module, args: inputs.append(args[0])) for layer in layers]
    try:
        yield inputs
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def starting_at(stack, index: int, hidden: torch.Tensor) -> Iterator[None]:
    """The stack (a fairseq encoder or decoder) runs only its layers from `index` on, the first of them fed
    `hidden` instead of what the embeddings give."""
    layers = stack.layers
    handle = layers[index].register_forward_pre_hook(lambda _module, args: (hidden, *args[1:]))
    stack.layers = nn.ModuleList(list(layers)[index:])
    try:
        yield
    finally:
        stack.layers = layers
        handle.remove()
