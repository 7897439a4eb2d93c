"""The sublayers of a fairseq Transformer as the compression pipeline addresses them: keys (type, layer), the
modules each one is made of, and forward hooks that capture its residual stream, output and inputs on calibration
batches. Shared by the closed-form reconstruction (reconstruct) and the window fit (window_fit)."""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from fairseq_headprune.prune.select import keys_in_order
from fairseq_headprune.core.heads import attention_modules

Key = Tuple[str, int]

@dataclass
class SublayerFit:
    key: Key
    kept: int
    method: str  # what was applied: scales | out-proj | bias | none
    error_before: float  # Σ ||output - y||² over calibration tokens, before and after
    error_after: float
    target_energy: float  # Σ ||y + b_out - residual part||²: scale of the errors (Σ ||teacher sublayer delta||²)
    tokens: int
    scales: Optional[List[float]] = None
    fallback: Optional[str] = None
    condition: Optional[float] = None  # of the fit's system, or its upper bound (reconstruct.ridge_condition)
    part: str = "output"  # output: out_proj, fc2 or the bias; input: the map folded into the layers reading the
    # input; window: the whole sublayer fitted by Adam (window_fit)
    steps: Optional[int] = None  # window: the Adam step kept (lowest held-out error)

    def as_json(self) -> dict:
        d = asdict(self)
        d["key"] = f"{self.key[0]}:{self.key[1]}"
        return d

class StopForward(Exception):
    """Raised by a capture hook (here or in window_fit) once the sublayer of interest has run: nothing above it
    needs computing; forward_to catches it."""

@dataclass
class _Capture:
    residual: List[torch.Tensor] = field(default_factory=list)
    output: List[torch.Tensor] = field(default_factory=list)
    context: List[torch.Tensor] = field(default_factory=list)

FFN_TYPES = ("enc-ffn", "dec-ffn")

ENCODER_TYPES = ("enc-self", "enc-ffn")

ENCODER_OUT = "enc-out"  # the key (ENCODER_OUT, number of encoder layers) of the encoder output's input map

def _parts(model, key: Key):
    """(layer, the module whose output the sublayer adds to the residual stream, the linear layer whose input is
    refit (out_proj or fc2), the LayerNorm before (pre-norm) or after (post-norm) the sublayer, is attention)."""
    t, i = key
    layer = model.encoder.layers[i - 1] if t in ("enc-self", "enc-ffn") else model.decoder.layers[i - 1]
    if getattr(layer, "attn_ln", None) is not None or getattr(layer, "w_resid", None) is not None:
        raise NotImplementedError("decoder layers with --scale-attn or --scale-resids are not supported")
    if t in FFN_TYPES:
        return layer, layer.fc2, layer.fc2, layer.final_layer_norm, False
    attn = attention_modules(model)[key]
    norm = layer.encoder_attn_layer_norm if t == "enc-dec" else layer.self_attn_layer_norm
    return layer, attn, attn.out_proj, norm, True

def sublayer_keys(model, ffn: bool = False) -> List[Key]:
    """Attention (and with ffn, FFN) sublayers in forward order."""
    keys = keys_in_order(attention_modules(model))
    if not ffn:
        return keys
    out = []
    for key in keys:
        out.append(key)
        if key[0] == "enc-self":
            out.append(("enc-ffn", key[1]))
        elif key[0] == "enc-dec" or (key[0] == "dec-self" and ("enc-dec", key[1]) not in keys):
            out.append(("dec-ffn", key[1]))
    return out

@contextlib.contextmanager
def capture(model, keys: Sequence[Key], context: bool = False, stop_at: Optional[Key] = None
            ) -> Iterator[Dict[Key, _Capture]]:
    """Record, per forward, each sublayer's residual stream before it, its attention output (after out_proj, with
    its bias) and, with `context`, out_proj's input before any head mask (the heads' outputs, T x B x H*head_dim).
    With stop_at, the forward raises StopForward right after that sublayer."""
    records = {key: _Capture() for key in keys}
    handles, forced = [], []
    for key in keys:
        layer, module, linear, norm, is_attention = _parts(model, key)
        rec = records[key]
        if layer.normalize_before:  # residual = the LayerNorm's input before the sublayer
            handles.append(norm.register_forward_pre_hook(lambda _m, args, rec=rec: rec.residual.append(args[0])))
        elif is_attention:  # post-norm: the residual is the attention's query itself
            handles.append(module.register_forward_pre_hook(
                lambda _m, args, kwargs, rec=rec: rec.residual.append(kwargs.get("query", args[0] if args else None)),
                with_kwargs=True))
        else:  # post-norm FFN: fc1's input
            handles.append(layer.fc1.register_forward_pre_hook(
                lambda _m, args, rec=rec: rec.residual.append(args[0])))

        def after(_m, _args, output, rec=rec, key=key):
            rec.output.append(output[0] if isinstance(output, tuple) else output)
            if stop_at == key:
                raise StopForward

        handles.append(module.register_forward_hook(after))
        if context:
            # registered before any mask hook of the masked forward, so it sees the unmasked head outputs
            handles.append(linear.register_forward_pre_hook(lambda _m, args, rec=rec: rec.context.append(args[0])))
            if is_attention:
                forced.append((module, module.skip_embed_dim_check))
                module.skip_embed_dim_check = True  # per-head outputs exist on fairseq's Python path only
    try:
        yield records
    finally:
        for h in handles:
            h.remove()
        for attn, flag in forced:
            attn.skip_embed_dim_check = flag

def _input_reader(model, key: Key):
    """The module whose input is the sublayer's input stream: the attention (its query) or the FFN's fc1."""
    layer, module, _linear, _norm, is_attention = _parts(model, key)
    return module if is_attention else layer.fc1

def input_consumers(model, key: Key) -> List[torch.nn.Linear]:
    """The linear layers that read the sublayer's input stream (the encoder output's: every k_proj and v_proj of
    the encoder-decoder attention)."""
    if key[0] == ENCODER_OUT:
        return [p for layer in model.decoder.layers if getattr(layer, "encoder_attn", None) is not None
                for p in (layer.encoder_attn.k_proj, layer.encoder_attn.v_proj)]
    layer, module, _linear, _norm, is_attention = _parts(model, key)
    if not is_attention:
        return [layer.fc1]
    return [module.q_proj] if key[0] == "enc-dec" else [module.q_proj, module.k_proj, module.v_proj]

@contextlib.contextmanager
def capture_inputs(model, keys: Sequence[Key], stop_at: Optional[Key] = None
                   ) -> Iterator[Dict[Key, List[torch.Tensor]]]:
    """Record, per forward, the input stream each sublayer's projections read (T x B x d); with stop_at, the
    forward raises StopForward as soon as that sublayer's input is known."""
    records: Dict[Key, List[torch.Tensor]] = {key: [] for key in keys}
    handles = []
    for key in keys:
        def pre(_m, args, kwargs, key=key):
            records[key].append(kwargs.get("query", args[0] if args else None))
            if stop_at == key:
                raise StopForward

        handles.append(_input_reader(model, key).register_forward_pre_hook(pre, with_kwargs=True))
    try:
        yield records
    finally:
        for h in handles:
            h.remove()

def token_mask(sample, key: Key, pad: int) -> torch.Tensor:
    """(T, B) boolean: the real (non-pad) positions of the sublayer's stream in the batch."""
    if key[0] in ENCODER_TYPES + (ENCODER_OUT,):
        return sample["net_input"]["src_tokens"].ne(pad).t()
    return sample["target"].ne(pad).t()
