"""FFN hidden units as units of pruning: their importance, and which units each FFN keeps.

A layer's FFN is fc2(act(fc1 x)); hidden unit i is row i of fc1 and input column i of fc2. Removing units is
core.surgery's (prune_ffn); each layer keeps its own number of units, which a checkpoint records (core.shape).

Importance is Kwon et al. (2022)'s mask Fisher: for a mask m_i on unit i's activation a_i, the loss gradient of
sentence s is ∂L_s/∂m_i = Σ_t a_t,i · ∂L/∂a_t,i over its tokens (one backward pass gives every sentence's: the
sentences of a batch do not interact), and F_i = Σ_s (∂L_s/∂m_i)². Each FFN keeps its highest-Fisher units; the
reconstruction then refits fc2 on the units kept (prune.reconstruct), which is Kwon's mask tuning.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Mapping

import torch

from fairseq_headprune.prune.select import sentence_nll
from fairseq_headprune.core.shape import Key, ffn_layers, kept_count

def unit_gradients(model, samples: Iterable[dict], pad: int) -> Dict[Key, torch.Tensor]:
    """{(stack, layer): (sentences, units) float64 tensor of ∂L_s/∂m_i}, rows in the order of the samples' rows
    (L_s: sentence s's summed token NLL, teacher-forced, eval mode; no weight gets a gradient)."""
    model.eval()
    layers = ffn_layers(model)
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    chunks: Dict[Key, List[torch.Tensor]] = {key: [] for key in layers}
    seen: Dict[Key, torch.Tensor] = {}

    def keep_input(key):
        def hook(module, args):
            x = args[0]
            if not x.requires_grad:
                x = x.detach().requires_grad_(True)
            x.retain_grad()
            seen[key] = x
            return (x,) + tuple(args[1:])
        return hook

    handles = [layer.fc2.register_forward_pre_hook(keep_input(key)) for key, layer in layers.items()]
    try:
        for sample in samples:
            seen.clear()
            sentence_nll(model, sample, pad).backward()
            rows = sample["target"].size(0)
            for key, x in seen.items():  # fairseq's layers are time-major: (T, B, units)
                if x.dim() != 3 or x.size(1) != rows:
                    raise RuntimeError(f"{key}: fc2 input of shape {tuple(x.shape)} is not (T, {rows}, units)")
                grad = x.grad if x.grad is not None else torch.zeros_like(x)
                chunks[key].append((x.detach() * grad).sum(0).double().cpu())
    finally:
        for h in handles:
            h.remove()
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
    return {key: torch.cat(parts) for key, parts in chunks.items()}


def fisher_kept(grads: Mapping[Key, torch.Tensor], percent: float) -> Dict[Key, List[int]]:
    """Each FFN keeps its kept_count(units, percent) highest-Fisher units (ties: the lower index), in index order."""
    out = {}
    for key, g in grads.items():
        fisher = g.pow(2).sum(0)
        n = kept_count(fisher.numel(), percent)
        order = sorted(range(fisher.numel()), key=lambda i: (-float(fisher[i]), i))
        out[key] = sorted(order[:n])
    return out
