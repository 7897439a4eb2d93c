"""Head masks ξ on fairseq's MultiheadAttention, on every code path it takes.

A masked head's output is multiplied by ξ_h just before the output projection. fairseq computes encoder
self-attention and training-time decoder self-attention in the fused `F.multi_head_attention_forward`, where
per-head outputs never exist; whenever a mask is active the call is routed to fairseq's own Python path (the
same switch fairseq uses for pruned heads, `skip_embed_dim_check`), which also serves incremental decoding and
the static keys/values of encoder-decoder attention. With no active mask the module runs exactly as stock
fairseq, fused path included, so unmasked hypotheses are stock hypotheses.

Two masks multiply: `head_mask`, a (num_heads,) buffer that is the model's own ξ (a non-persistent buffer,
so state dicts stay stock), and `row_head_mask`, an optional (batch, num_heads) tensor giving every batch row
its own ξ: per-sentence gradient leaves for importance scoring, or several masks sharing one decode.

A third factor is optional: `head_gate`, Voita et al.'s Hard Concrete gate per head (fairseq_headprune.core.gates),
a submodule that exists only on gated models (`install_head_gates`, or loading a gated checkpoint: a load
pre-hook creates the gates that a state dict holds). A gated module always takes the Python path.

A call that cannot honour an active mask raises UnsupportedMaskError rather than ignoring the mask or changing
the computation behind the user's back: `before_softmax=True` (it returns attention logits and values, before
per-head outputs exist), and a module configured for xformers (`xformers_att_config`) on a call that stock
fairseq sends to xformers (rerouting it would silently swap the attention implementation).
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Dict, Iterable, Iterator, Optional, Tuple

import torch
from fairseq.modules.multihead_attention import MultiheadAttention

from fairseq_headprune.errors import UserError
from fairseq_headprune.core.gates import INIT_LOG_ALPHA, TEMPERATURE, HeadGate
from fairseq_headprune.core.heads import ATTENTION_TYPES, Head, HeadLayout, attention_modules, head_ids


class UnsupportedMaskError(UserError, ValueError):
    """A head mask (or gate) is active on a call that cannot apply it; the message is one line for the user."""


# MultiheadAttention.forward's parameters after (query, key, value, key_padding_mask, incremental_state)
_AFTER_STATE = ("need_weights", "static_kv", "attn_mask", "before_softmax", "need_head_weights")
assert tuple(inspect.signature(MultiheadAttention.forward).parameters)[6:] == _AFTER_STATE


class HeadMaskedMultiheadAttention(MultiheadAttention):
    """fairseq's MultiheadAttention with a ξ per head; parameters and state-dict keys are unchanged."""

    head_mask: torch.Tensor
    row_head_mask: Optional[torch.Tensor]
    head_gate: Optional[HeadGate]

    @classmethod
    def convert(cls, attn: MultiheadAttention) -> "HeadMaskedMultiheadAttention":
        """Turn a built (or loaded) fairseq attention module into a maskable one, in place."""
        if isinstance(attn, cls):
            return attn
        attn.__class__ = cls
        attn.register_buffer(
            "head_mask", torch.ones(attn.num_heads, dtype=attn.out_proj.weight.dtype), persistent=False
        )
        attn.row_head_mask = None
        attn.register_module("head_gate", None)
        attn._register_load_state_dict_pre_hook(_gates_from_state_dict, with_module=True)
        return attn

    def head_output_scale(self, rows: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        """The factor on the (T, B, heads*head_dim) input of out_proj, or None when no head is masked or gated.
        A gate is drawn here, once per call (training) or deterministically (eval)."""
        gate = self.head_gate() if self.head_gate is not None else None
        if rows is None and gate is None and bool((self.head_mask == 1).all()):
            return None
        scale = self.head_mask.unsqueeze(0)  # (1, H)
        if gate is not None:
            scale = scale * gate.to(scale.dtype).unsqueeze(0)
        if rows is not None:
            scale = rows * scale  # (B, H)
        return scale.repeat_interleave(self.head_dim, dim=-1).unsqueeze(0)  # (1, B or 1, H*head_dim)

    def _rows_for(self, incremental_state) -> Optional[torch.Tensor]:
        """This call's per-row mask. In incremental decoding the rows set before the first step are kept in
        fairseq's incremental state, so its own beam reordering and batch shrinking move them with their
        sentences (encoder-decoder attention with beam_size > 1 keeps one row per sentence, as for its keys)."""
        if incremental_state is None:
            return self.row_head_mask
        buffer = self._get_input_buffer(incremental_state)
        per_sentence = self.encoder_decoder_attention and self.beam_size > 1
        if "row_head_mask" not in buffer:
            if self.row_head_mask is None:
                return None
            rows = self.row_head_mask
            buffer["row_head_mask"] = rows[:: self.beam_size] if per_sentence else rows
            self._set_input_buffer(incremental_state, buffer)
            return rows
        rows = buffer["row_head_mask"]
        return rows.repeat_interleave(self.beam_size, dim=0) if per_sentence else rows

    def forward(self, query, key, value, key_padding_mask=None, incremental_state=None, *args, **kwargs):
        scale = self.head_output_scale(self._rows_for(incremental_state))
        if scale is None:
            return super().forward(query, key, value, key_padding_mask, incremental_state, *args, **kwargs)
        self._check_mask_applies(query, key, value, key_padding_mask, incremental_state, args, kwargs)
        handle = self.out_proj.register_forward_pre_hook(lambda _module, inputs: (inputs[0] * scale.to(inputs[0]),))
        fused_allowed = self.skip_embed_dim_check
        self.skip_embed_dim_check = True  # per-head outputs exist only on fairseq's Python path
        try:
            return super().forward(query, key, value, key_padding_mask, incremental_state, *args, **kwargs)
        finally:
            handle.remove()
            self.skip_embed_dim_check = fused_allowed

    def _check_mask_applies(self, query, key, value, key_padding_mask, incremental_state, args, kwargs) -> None:
        """Raise UnsupportedMaskError when this call would ignore the mask or run another implementation."""
        call = dict(zip(_AFTER_STATE, args), **kwargs)  # not inspect's bind: 27 us a call, every decoding step
        if call.get("before_softmax", False):
            raise UnsupportedMaskError(
                "a head mask or gate is active but the call asks for before_softmax=True, which returns attention "
                "logits before per-head outputs exist: the mask would be ignored; unmask the heads for this call")
        stock_takes_fused = (not self.onnx_trace and query.device.type != "xla" and incremental_state is None
                             and not call.get("static_kv", False) and not self.skip_embed_dim_check)
        if stock_takes_fused and getattr(self, "use_xformers", False):
            raise UnsupportedMaskError(
                "a head mask or gate is active on an attention module configured for xformers "
                "(xformers_att_config): masking needs fairseq's Python attention path, which would silently "
                "replace xformers here; mask a model built without --encoder/--decoder-xformers-att-config")


def install_head_masks(model) -> Dict[Tuple[str, int], HeadMaskedMultiheadAttention]:
    """Make every attention module of a fairseq transformer maskable; returns them by (type, layer)."""
    return {key: HeadMaskedMultiheadAttention.convert(attn) for key, attn in attention_modules(model).items()}


def _gates_from_state_dict(attn, state_dict, prefix, *_args) -> None:
    """Load pre-hook: a state dict with gates for this module (a gated checkpoint) gives an ungated module its
    gates, so gated checkpoints load for evaluation with no flag."""
    if attn.head_gate is None and prefix + "head_gate.theta" in state_dict:
        weight = attn.out_proj.weight
        attn.head_gate = HeadGate.from_state_dict(state_dict, prefix + "head_gate.").to(weight.device)


def install_head_gates(model, types, temperature: float = TEMPERATURE, init_log_alpha: float = INIT_LOG_ALPHA,
                       lr_scale: float = 1.0) -> Dict[Tuple[str, int], HeadGate]:
    """Give every attention module of the given types a Hard Concrete gate per head; returns them."""
    gates = {}
    for (attn_type, layer), attn in install_head_masks(model).items():
        if attn_type in types:
            if attn.head_gate is None:
                attn.head_gate = HeadGate(attn.num_heads, temperature, init_log_alpha, lr_scale).to(
                    attn.out_proj.weight.device)
            gates[(attn_type, layer)] = attn.head_gate
    return gates


def head_gates(model) -> Dict[Tuple[str, int], HeadGate]:
    """The gates a model holds, by (type, layer); empty for an ungated model."""
    return {key: attn.head_gate for key, attn in attention_modules(model).items()
            if getattr(attn, "head_gate", None) is not None}


def masked_modules(model) -> Dict[Tuple[str, int], HeadMaskedMultiheadAttention]:
    modules = attention_modules(model)
    for key, attn in modules.items():
        if not isinstance(attn, HeadMaskedMultiheadAttention):
            raise TypeError(f"{key} has no head masks: call install_head_masks(model) first")
    return modules


def set_head_masks(model, masked: Iterable[Head]) -> None:
    """Set ξ_h = 0 for the given heads and 1 for every other head (checked against the model's layout)."""
    masked = list(masked)
    HeadLayout.of(model).check(masked)
    for (attn_type, layer), attn in masked_modules(model).items():
        ids = head_ids(attn)
        mask = torch.ones(attn.num_heads, dtype=attn.head_mask.dtype, device=attn.head_mask.device)
        for h in masked:
            if h.type == attn_type and h.layer == layer:
                mask[ids.index(h.head)] = 0
        attn.head_mask.copy_(mask)


def current_masked_heads(model) -> list:
    """The heads whose ξ is 0, in spec order."""
    out = []
    for (attn_type, layer), attn in masked_modules(model).items():
        ids = head_ids(attn)
        out += [Head(attn_type, layer, ids[i]) for i in (attn.head_mask == 0).nonzero().flatten().tolist()]
    return sorted(out, key=lambda h: (ATTENTION_TYPES.index(h.type), h.layer, h.head))


@contextlib.contextmanager
def head_masks(model, masked: Iterable[Head]) -> Iterator[None]:
    """The given heads masked (set_head_masks) for the block; the masks the model held before restored after."""
    before = current_masked_heads(model)
    set_head_masks(model, masked)
    try:
        yield
    finally:
        set_head_masks(model, before)


@contextlib.contextmanager
def row_head_masks(
    model, batch_size: int, requires_grad: bool = False
) -> Iterator[Dict[Tuple[str, int], torch.Tensor]]:
    """Give every batch row its own ξ (all ones) for the duration; yields the (batch, heads) tensors.

    With requires_grad they are the gradient leaves of Michel et al.'s importance: row b's gradient is
    ∂L(x_b)/∂ξ because rows of a transformer batch do not interact.
    """
    modules = masked_modules(model)
    rows = {}
    try:
        for key, attn in modules.items():
            weight = attn.out_proj.weight
            rows[key] = torch.ones(
                batch_size, attn.num_heads, dtype=weight.dtype, device=weight.device, requires_grad=requires_grad
            )
            attn.row_head_mask = rows[key]
        yield rows
    finally:
        for attn in modules.values():
            attn.row_head_mask = None
