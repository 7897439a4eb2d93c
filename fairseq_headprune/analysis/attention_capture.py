"""Per-head attention weights of every attention module of a fairseq transformer, without editing fairseq.

fairseq's encoder and decoder layers ask their attention modules for no weights (self-attention) or for the
head average (encoder-decoder attention), and the fused `F.multi_head_attention_forward` that serves encoder
self-attention never returns per-head weights at all. For the duration of `capture_attention` each module
takes fairseq's own Python path (`skip_embed_dim_check`, the switch fairseq uses for pruned heads) with
`need_head_weights=True`, the (heads, batch, queries, keys) weights are recorded, and the caller gets back
exactly what it asked for (None or the head average), so the model's outputs are unchanged.
"""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator, List, Tuple

import torch

from fairseq_headprune.core.heads import attention_modules

Key = Tuple[str, int]


@contextlib.contextmanager
def capture_attention(model) -> Iterator[Dict[Key, List[torch.Tensor]]]:
    """Record the per-head attention weights of every call, by (type, layer): a list with one detached
    (heads, batch, queries, keys) float tensor per call (one per forward, one per step when decoding
    incrementally). Weights are the softmax output before attention dropout (as fairseq returns them)."""
    modules = attention_modules(model)
    captured: Dict[Key, List[torch.Tensor]] = {key: [] for key in modules}
    handles, saved = [], {}
    for key, attn in modules.items():
        asked: List[Tuple[bool, bool]] = []

        def pre_hook(_module, args, kwargs, asked=asked):
            if len(args) > 5:  # fairseq's layers pass everything after incremental_state by name
                raise RuntimeError("capture_attention: attention flags passed positionally")
            asked.append((kwargs.get("need_weights", True), kwargs.get("need_head_weights", False)))
            return args, {**kwargs, "need_weights": True, "need_head_weights": True}

        def hook(_module, _args, _kwargs, output, key=key, asked=asked):
            need_weights, need_head_weights = asked.pop()
            out, weights = output
            if weights is None:  # before_softmax or an implementation that does not return them
                raise RuntimeError(f"{key} returned no attention weights")
            captured[key].append(weights.detach().float())
            if need_head_weights:
                return out, weights
            return out, (weights.mean(dim=0) if need_weights else None)

        saved[key] = attn.skip_embed_dim_check
        attn.skip_embed_dim_check = True  # fairseq's Python path: the only one with per-head weights
        handles.append(attn.register_forward_pre_hook(pre_hook, with_kwargs=True))
        handles.append(attn.register_forward_hook(hook, with_kwargs=True))
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()
        for key, attn in modules.items():
            attn.skip_embed_dim_check = saved[key]
