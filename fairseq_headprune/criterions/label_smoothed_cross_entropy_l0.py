"""`label_smoothed_cross_entropy_l0`: label-smoothed cross-entropy + λ · Σ_h P(gate_h ≠ 0) (Voita et al. 2019).

The penalty is the expected L0 norm of the model's Hard Concrete head gates (fairseq_headprune.core.gates; install
them with the task's --gated-types). Scale: fairseq sums the loss over the batch's target tokens and divides the
gradient by sample_size, so the penalty is added as λ · L0 · sample_size: λ is the weight of the penalty
against the *per-token* cross-entropy, as in Voita et al.'s loss (L = L_xent + λ L_C with a per-token mean
L_xent; their λ = 0.01 ... 0.1 are on that scale). With --sentence-avg it is per sentence.
Logged: `l0` (expected number of open gates), `gates_open` (deterministic gates > 0) and `gates_one` (= 1).
"""

from dataclasses import dataclass, field

import torch
from fairseq import metrics
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)

from fairseq_headprune.core.gates import deterministic_gates
from fairseq_headprune.core.masking import head_gates


@dataclass
class LabelSmoothedCrossEntropyL0Config(LabelSmoothedCrossEntropyCriterionConfig):
    l0_lambda: float = field(
        default=0.0, metadata={"help": "weight of the expected number of open head gates, per target token"}
    )


@register_criterion("label_smoothed_cross_entropy_l0", dataclass=LabelSmoothedCrossEntropyL0Config)
class LabelSmoothedCrossEntropyL0Criterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, l0_lambda=0.0, ignore_prefix_size=0,
                 report_accuracy=False):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        if l0_lambda < 0:
            raise ValueError(f"--l0-lambda must be >= 0, not {l0_lambda}")
        self.l0_lambda = l0_lambda

    def forward(self, model, sample, reduce=True):
        loss, sample_size, logging_output = super().forward(model, sample, reduce=reduce)
        gates = head_gates(model)
        if not gates:
            raise RuntimeError("label_smoothed_cross_entropy_l0 needs head gates: train with --task "
                               "translation_headprune --gated-types enc-self,enc-dec,dec-self (or a subset)")
        l0 = sum(g.expected_l0() for g in gates.values())
        if self.l0_lambda:
            loss = loss + self.l0_lambda * sample_size * l0
        with torch.no_grad():
            values = torch.cat([deterministic_gates(g.log_alpha) for g in gates.values()])
        logging_output.update(l0=float(l0.detach()), gates_open=int((values > 0).sum()),
                              gates_one=int((values == 1).sum()), gates_total=values.numel(), loss=loss.data)
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        n = len(logging_outputs)
        if n and "l0" in logging_outputs[0]:
            for key in ("l0", "gates_open", "gates_one"):  # the same model state in every output: average
                metrics.log_scalar(key, sum(log.get(key, 0) for log in logging_outputs) / n, round=2)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return False
