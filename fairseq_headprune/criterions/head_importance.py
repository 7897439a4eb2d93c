"""`head_importance`: cross-entropy that also yields Michel et al.'s head importance.

Its forward gives every batch row its own ξ leaf on every head; after the caller's backward, `accumulate()`
adds the rows' |∂L(x)/∂ξ_h| (see fairseq_headprune.core.importance). Under fairseq-train the previous batch's
gradients are picked up at the next forward, so the statistics follow training too. The gradient that reaches
the returned loss is recorded: it is the loss scale of fp16 training (the optimizer backpropagates scale x loss),
and ξ's gradients are divided by it.

With per_position=True (the reference code's definition) forward itself takes one gradient per target position
(|∂l_t(x)/∂ξ_h|, a backward per position of the batch, the graph kept for the caller's backward) and the caller's
backward adds nothing: T backward passes for a batch of T target positions. Those gradients are not loss-scaled.
"""
from dataclasses import dataclass, field
from typing import Dict, Optional

import torch
from fairseq.criterions import register_criterion
from fairseq.criterions.cross_entropy import CrossEntropyCriterion, CrossEntropyCriterionConfig

from fairseq_headprune.core.importance import ImportanceAccumulator
from fairseq_headprune.core.masking import row_head_masks


@dataclass
class HeadImportanceCriterionConfig(CrossEntropyCriterionConfig):
    per_position: bool = field(
        default=False,
        metadata={"help": "head importance as the reference code: |dl_t/dxi| per target token, averaged over "
                  "tokens (one backward per target position), instead of |dL(x)/dxi| per sentence"},
    )


@register_criterion("head_importance", dataclass=HeadImportanceCriterionConfig)
class HeadImportanceCriterion(CrossEntropyCriterion):
    def __init__(self, task, sentence_avg, per_position: bool = False):
        super().__init__(task, sentence_avg)
        self.per_position = per_position
        self.accumulator = ImportanceAccumulator(per_position=per_position)
        self._pending: Optional[Dict] = None
        self._loss_scale: Optional[torch.Tensor] = None

    def forward(self, model, sample, reduce=True):
        self.accumulate()
        with row_head_masks(model, sample["target"].size(0), requires_grad=True) as leaves:
            net_output = model(**sample["net_input"])
        if self.per_position:
            token_loss, _ = self.compute_loss(model, net_output, sample, reduce=False)
            self._add_positions(leaves, token_loss.view_as(sample["target"]), sample)
            loss = token_loss.sum() if reduce else token_loss
        else:
            loss, _ = self.compute_loss(model, net_output, sample, reduce=reduce)
            self._pending = leaves
            self._loss_scale = None
            if loss.requires_grad:
                loss.register_hook(self._record_loss_scale)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data.sum(),
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        return loss, sample_size, logging_output

    def _record_loss_scale(self, grad: torch.Tensor) -> None:
        """The gradient reaching the loss: 1 for loss.backward(), the scaler's scale for fp16 training."""
        self._loss_scale = grad.detach()

    def _add_positions(self, leaves, token_loss: torch.Tensor, sample) -> None:
        """∂l_t(x_b)/∂ξ for every target position t: rows have their own ξ, so one backward of the position's
        losses summed over rows gives every row its own gradient."""
        keys = list(leaves)
        per_key = {key: [] for key in keys}
        for t in range(token_loss.size(1)):
            grads = torch.autograd.grad(token_loss[:, t].sum(), [leaves[k] for k in keys], retain_graph=True,
                                        allow_unused=True)
            for key, g in zip(keys, grads):
                per_key[key].append(torch.zeros_like(leaves[key]) if g is None else g.detach())
        self.accumulator.add_positions({key: torch.stack(g) for key, g in per_key.items()},
                                       sentences=sample["target"].size(0), tokens=int(sample["ntokens"]))

    def accumulate(self) -> None:
        """Add the last batch's per-sentence gradients, once its backward has run, divided by its loss scale."""
        if self._pending is not None and any(leaf.grad is not None for leaf in self._pending.values()):
            self.accumulator.add(self._pending, loss_scale=_scale_value(self._loss_scale))
        self._pending = None
        self._loss_scale = None


def _scale_value(grad: Optional[torch.Tensor]) -> float:
    """One number from the loss's gradient (a scalar loss, or per-token losses all given the same scale)."""
    if grad is None:
        return 1.0
    values = grad.detach().double().flatten()
    if values.numel() > 1 and not bool((values == values[0]).all()):
        raise ValueError("the loss was backpropagated with unequal weights per element: no single loss scale")
    return float(values[0]) if values.numel() else 1.0
