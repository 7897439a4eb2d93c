"""`head_importance`: cross-entropy that also yields Michel et al.'s head importance.

Its forward gives every batch row its own ξ leaf on every head; after the caller's backward, `accumulate()`
adds the rows' |∂L(x)/∂ξ_h| (see fairseq_headprune.importance). Under fairseq-train the previous batch's
gradients are picked up at the next forward, so the statistics follow training too.
"""
from typing import Dict, Optional

from fairseq.criterions import register_criterion
from fairseq.criterions.cross_entropy import CrossEntropyCriterion, CrossEntropyCriterionConfig

from fairseq_headprune.importance import ImportanceAccumulator
from fairseq_headprune.masking import row_head_masks


@register_criterion("head_importance", dataclass=CrossEntropyCriterionConfig)
class HeadImportanceCriterion(CrossEntropyCriterion):
    def __init__(self, task, sentence_avg):
        super().__init__(task, sentence_avg)
        self.accumulator = ImportanceAccumulator()
        self._pending: Optional[Dict] = None

    def forward(self, model, sample, reduce=True):
        self.accumulate()
        with row_head_masks(model, sample["target"].size(0), requires_grad=True) as leaves:
            net_output = model(**sample["net_input"])
        self._pending = leaves
        loss, _ = self.compute_loss(model, net_output, sample, reduce=reduce)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        return loss, sample_size, logging_output

    def accumulate(self) -> None:
        """Add the last batch's per-sentence gradients, once its backward has run."""
        if self._pending is not None and any(leaf.grad is not None for leaf in self._pending.values()):
            self.accumulator.add(self._pending)
        self._pending = None
