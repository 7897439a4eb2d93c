"""Michel et al.'s head importance I_h = E_x |∂L(x)/∂ξ_h| and its per-layer l2 normalisation.

The absolute value is taken per sentence, x being one sentence pair and L(x) its summed token NLL (no label
smoothing): the paper's expectation is over examples, and a head that helps one target token and hurts another
of the same sentence has that net effect on the sentence's likelihood. The reference code takes it per token
instead, which counts such a head as important.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Tuple

import torch

from fairseq_headprune.heads import ATTENTION_TYPES

Key = Tuple[str, int]


class ImportanceAccumulator:
    """Running sums of |∂L(x)/∂ξ_h| over sentences, from the gradients of per-row ξ leaves."""

    def __init__(self) -> None:
        self.sums: Dict[Key, torch.Tensor] = {}
        self.sentences = 0

    def add(self, leaves: Mapping[Key, torch.Tensor]) -> None:
        """Add one batch: each leaf is (batch, heads) with its .grad filled by backward."""
        n = None
        for key, leaf in leaves.items():
            grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
            total = grad.detach().abs().sum(0).double().cpu()
            self.sums[key] = self.sums[key] + total if key in self.sums else total
            n = leaf.size(0)
        self.sentences += n or 0

    def mean(self) -> Dict[Key, torch.Tensor]:
        if not self.sentences:
            raise ValueError("no sentence was scored")
        return {key: s / self.sentences for key, s in self.sums.items()}


def normalize_by_layer(scores: Mapping[Key, torch.Tensor], eps: float = 1e-20) -> Dict[Key, torch.Tensor]:
    """Divide each layer's scores by their l2 norm (Michel et al. §4.1), so layers compare on one scale."""
    return {key: s / (s.pow(2).sum().sqrt() + eps) for key, s in scores.items()}


def to_nested_lists(scores: Mapping[Key, torch.Tensor]) -> Dict[str, List[List[float]]]:
    """{"enc-self": [[per head] per layer], ...}: the layout of importance.json."""
    out: Dict[str, List[List[float]]] = {}
    for attn_type in ATTENTION_TYPES:
        layers = sorted(layer for t, layer in scores if t == attn_type)
        out[attn_type] = [[float(v) for v in scores[(attn_type, layer)]] for layer in layers]
    return out


def from_nested_lists(data: Mapping[str, List[List[float]]]) -> Dict[Key, torch.Tensor]:
    return {
        (attn_type, i): torch.tensor(values, dtype=torch.float64)
        for attn_type in ATTENTION_TYPES
        for i, values in enumerate(data.get(attn_type, []), start=1)
    }
