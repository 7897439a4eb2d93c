"""Michel et al.'s head importance I_h = E_x |∂L(x)/∂ξ_h| and its per-layer l2 normalisation.

The absolute value is taken per sentence, x being one sentence pair and L(x) its summed token NLL (no label
smoothing): the paper's expectation is over examples, and a head that helps one target token and hurts another
of the same sentence has that net effect on the sentence's likelihood. The reference code takes it per token
instead, which counts such a head as important: `ImportanceAccumulator(per_position=True)` does that,
I_h = sum over target tokens t of |dl_t/dxi_h| / number of target tokens (l_t the token's NLL, EOS included).

Gradients are divided by the loss scale they were computed under (fp16 training multiplies the loss by the
scaler's current scale before backward); a batch whose gradients overflowed (inf/nan: the optimizer skips it
too) is left out and counted in `skipped`.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Tuple

import torch

from fairseq_headprune.core.heads import ATTENTION_TYPES

Key = Tuple[str, int]


class ImportanceAccumulator:
    """Running sums of |∂L(x)/∂ξ_h| over sentences (or of |∂l_t(x)/∂ξ_h| over target tokens, per_position)."""

    def __init__(self, per_position: bool = False) -> None:
        self.per_position = per_position
        self.sums: Dict[Key, torch.Tensor] = {}
        self.sentences = 0
        self.tokens = 0
        self.skipped = 0

    def add(self, leaves: Mapping[Key, torch.Tensor], loss_scale: float = 1.0) -> bool:
        """Add one batch: each leaf is (batch, heads) with its .grad filled by a backward of loss_scale x the
        summed loss. False (batch skipped) when a gradient is not finite."""
        if self.per_position:
            raise ValueError("a per-position accumulator takes add_positions(), one gradient per target token")
        grads = {key: leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for key, leaf in leaves.items()}
        n = next(iter(leaves.values())).size(0) if leaves else 0
        return self._add(grads, loss_scale, sentences=n, tokens=0)

    def add_positions(self, grads: Mapping[Key, torch.Tensor], sentences: int, tokens: int,
                      loss_scale: float = 1.0) -> bool:
        """Add one batch of per-token gradients: each (positions, batch, heads) tensor holds ∂l_t(x_b)/∂ξ_h
        (zero at padding); tokens is the batch's number of target tokens, the mean's denominator."""
        if not self.per_position:
            raise ValueError("a per-sentence accumulator takes add(), one gradient per sentence")
        return self._add({key: g.flatten(0, 1) for key, g in grads.items()}, loss_scale, sentences, tokens)

    def _add(self, grads: Mapping[Key, torch.Tensor], loss_scale: float, sentences: int, tokens: int) -> bool:
        if not (loss_scale > 0 and torch.isfinite(torch.tensor(float(loss_scale)))) or not all(
                bool(torch.isfinite(g).all()) for g in grads.values()):
            self.skipped += 1
            return False
        for key, grad in grads.items():
            total = grad.detach().double().abs().sum(0).cpu() / float(loss_scale)
            self.sums[key] = self.sums[key] + total if key in self.sums else total
        self.sentences += sentences
        self.tokens += tokens
        return True

    def mean(self) -> Dict[Key, torch.Tensor]:
        """Sums over sentences (or target tokens, per_position) divided by their number."""
        count = self.tokens if self.per_position else self.sentences
        if not count:
            raise ValueError("no sentence was scored")
        return {key: s / count for key, s in self.sums.items()}


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
