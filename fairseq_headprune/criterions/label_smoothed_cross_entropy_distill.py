"""`label_smoothed_cross_entropy_distill`: token-level distillation from a frozen teacher (Hinton et al. 2015;
for translation Kim & Rush 2016's word-level KD), mixed with the label-smoothed loss on the references.

    loss = (1 - w) · LS-CE(student, references) + w · T² · Σ_t KL(p_T(teacher) || p_T(student))

summed over non-pad target tokens as fairseq sums every loss (it divides by sample_size itself); p_T is the
softmax at temperature T, and T² keeps the KL's gradient on the scale of the cross-entropy's (Hinton et al.).
With w = 1 and a student identical to its teacher the loss is exactly zero.

`--distill-hidden-weight β` adds β · Σ_t mean over decoder layers and channels of (h_student - h_teacher)², the
output of every decoder layer pulled towards the teacher's (the layer distillation of CoFi, Xia et al. 2022, which
found it to matter for structured pruning). A head-pruned student has the teacher's layers and widths, so the
states compare one to one, with no learned projection. A student with fewer decoder layers (prune.layers) names
the teacher layer each of its layers is compared with: `--distill-hidden-layers 3,4,6` (1-indexed, one per student
layer; `shrink --keep-layers` records the map its reconstruction used as `layers.teacher_outputs`).

The teacher is any fairseq checkpoint whose dictionaries are the student's (its architecture may differ: it
is the unpruned model, the student lost heads). It is loaded once, in eval mode (no dropout), with no gradient,
and kept outside the criterion's module tree: fairseq's trainer neither switches it to train mode, nor hands its
weights to the optimizer, nor writes them into every checkpoint.
"""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)

from fairseq_headprune.errors import UserError


@dataclass
class LabelSmoothedCrossEntropyDistillConfig(LabelSmoothedCrossEntropyCriterionConfig):
    teacher_path: str = field(default="", metadata={"help": "the frozen teacher checkpoint (the unpruned model)"})
    distill_weight: float = field(
        default=0.9, metadata={"help": "w: weight of the KL to the teacher; 1 - w weighs the label-smoothed loss"})
    distill_temperature: float = field(default=1.0, metadata={"help": "T: softmax temperature of both models"})
    distill_hidden_weight: float = field(
        default=0.0, metadata={"help": "β: weight of the squared distance of the decoder layers' outputs to the "
                                       "teacher's (mean over layers and channels, summed over target tokens)"})
    distill_hidden_layers: str = field(
        default="", metadata={"help": "the teacher's decoder layer (1-indexed) compared with each student layer, "
                                      "comma-separated (a student with fewer layers); default: one to one"})


def distillation_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, keep: torch.Tensor,
                    temperature: float) -> torch.Tensor:
    """T² · Σ over kept positions of KL(softmax(teacher/T) || softmax(student/T)), in float32 at least."""
    t = float(temperature)
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    s = F.log_softmax(student_logits.to(dtype) / t, dim=-1)
    p = F.log_softmax(teacher_logits.to(dtype) / t, dim=-1)
    kl = (p.exp() * (p - s)).sum(-1)
    return (kl * keep).sum() * (t * t)


def parse_hidden_layers(text: str):
    """"3,4,6" -> [3, 4, 6]; "" -> None (one to one)."""
    if not str(text or "").strip():
        return None
    try:
        layers = [int(x) for x in str(text).split(",")]
    except ValueError:
        raise UserError(f"--distill-hidden-layers takes teacher layer numbers, e.g. 3,4,6, not {text!r}") from None
    if any(i < 1 for i in layers):
        raise UserError(f"--distill-hidden-layers: layers are numbered from 1, not {text}")
    return layers


def hidden_distance(student_states, teacher_states, keep: torch.Tensor, teacher_layers=None) -> torch.Tensor:
    """Σ over kept target positions of the mean over layers and channels of (student - teacher)²; the states are
    fairseq's decoder `inner_states` without the first (the embeddings), each (time, batch, channels). Student
    layer j is compared with teacher layer teacher_layers[j-1] (1-indexed), or with layer j when None."""
    if teacher_layers is not None:
        if len(teacher_layers) != len(student_states) - 1 or max(teacher_layers) > len(teacher_states) - 1:
            raise UserError(f"--distill-hidden-layers {','.join(map(str, teacher_layers))}: one teacher layer (of "
                            f"{len(teacher_states) - 1}) for each of the student's {len(student_states) - 1}")
        teacher_states = [teacher_states[0]] + [teacher_states[t] for t in teacher_layers]
    if len(student_states) != len(teacher_states):
        raise UserError(f"--distill-hidden-weight compares decoder layers one to one: the student has "
                        f"{len(student_states) - 1}, the teacher {len(teacher_states) - 1}")
    layers = list(zip(student_states[1:], teacher_states[1:]))
    dtype = torch.promote_types(student_states[-1].dtype, torch.float32)  # float32 at least, as the KL
    total = sum(((s.to(dtype) - t.to(dtype)) ** 2).mean(-1) for s, t in layers)  # (time, batch)
    return (total.transpose(0, 1) * keep).sum() / max(len(layers), 1)


def load_teacher(path: str, task):
    """The teacher as fairseq-generate loads it (its own saved config, this task's dictionaries), frozen."""
    from fairseq import checkpoint_utils

    models, _cfg = checkpoint_utils.load_model_ensemble([path], task=task)
    teacher = models[0].eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


@register_criterion("label_smoothed_cross_entropy_distill", dataclass=LabelSmoothedCrossEntropyDistillConfig)
class LabelSmoothedCrossEntropyDistillCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, teacher_path="", distill_weight=0.9,
                 distill_temperature=1.0, distill_hidden_weight=0.0, distill_hidden_layers="", ignore_prefix_size=0,
                 report_accuracy=False):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        if not teacher_path:
            raise UserError("label_smoothed_cross_entropy_distill needs --teacher-path")
        if not 0.0 <= distill_weight <= 1.0:
            raise UserError(f"--distill-weight must be in [0, 1], not {distill_weight}")
        if not distill_temperature > 0:
            raise UserError(f"--distill-temperature must be > 0, not {distill_temperature}")
        if distill_hidden_weight < 0:
            raise UserError(f"--distill-hidden-weight must be >= 0, not {distill_hidden_weight}")
        self.distill_weight = distill_weight
        self.distill_hidden_weight = distill_hidden_weight
        self.distill_hidden_layers = parse_hidden_layers(distill_hidden_layers)
        self.distill_temperature = distill_temperature
        self.__dict__["teacher"] = load_teacher(teacher_path, task)  # not a submodule: see the module docstring

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        ls_loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
        teacher = self.__dict__["teacher"]
        if next(teacher.parameters()).device != net_output[0].device:
            teacher.to(net_output[0].device)
        with torch.no_grad():
            teacher_logits, teacher_extra = teacher(**sample["net_input"])
        target = model.get_targets(sample, net_output)
        student_logits = net_output[0]
        if self.ignore_prefix_size > 0:
            student_logits = student_logits[:, self.ignore_prefix_size:]
            teacher_logits = teacher_logits[:, self.ignore_prefix_size:]
            target = target[:, self.ignore_prefix_size:]
        keep = target.ne(self.padding_idx).float()
        kl = distillation_kl(student_logits, teacher_logits, keep, self.distill_temperature)
        w = self.distill_weight
        loss = (1.0 - w) * ls_loss + w * kl
        hidden = None
        if self.distill_hidden_weight > 0:
            states = net_output[1]["inner_states"], teacher_extra["inner_states"]
            if self.ignore_prefix_size > 0:
                states = tuple([h[self.ignore_prefix_size:] for h in s] for s in states)
            hidden = hidden_distance(*states, keep, self.distill_hidden_layers)
            loss = loss + self.distill_hidden_weight * hidden
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data, "nll_loss": nll_loss.data, "kl": kl.data, "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0), "sample_size": sample_size,
        }
        if hidden is not None:
            logging_output["hidden"] = hidden.data
        if self.report_accuracy:
            n_correct, total = self.compute_accuracy(model, net_output, sample)
            logging_output["n_correct"] = utils_item(n_correct)
            logging_output["total"] = utils_item(total)
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        kl = sum(log.get("kl", 0) for log in logging_outputs)
        ntokens = sum(log.get("ntokens", 0) for log in logging_outputs)
        if ntokens:
            metrics.log_scalar("kl", kl / ntokens, ntokens, round=4)  # nats per target token
            if any("hidden" in log for log in logging_outputs):
                hidden = sum(log.get("hidden", 0) for log in logging_outputs)
                metrics.log_scalar("hidden", hidden / ntokens, ntokens, round=4)


def utils_item(x):
    from fairseq import utils

    return utils.item(x.data if torch.is_tensor(x) else x)
