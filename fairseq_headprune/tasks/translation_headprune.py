"""The `translation_headprune` task: fairseq's translation task whose models carry a ξ mask on every head.

Any transformer-family model it builds, stock or ours, gets the masks before its checkpoint's weights load
(masks are non-persistent buffers, so stock state dicts load unchanged); `--mask-heads` then sets ξ_h = 0.
`--gated-types` adds Voita et al.'s Hard Concrete gate on every head of those types (fairseq_headprune.core.gates;
train them with the label_smoothed_cross_entropy_l0 criterion). A stock checkpoint loads into a gated model
(the gates start at their initial value), and a gated checkpoint loads with or without the flag.
Bad flags raise UserError, as fairseq's own classes raise; `fairseq-headprune` and, through the hook this package
installs (fairseq_headprune.errors.report_user_errors), fairseq's own commands show it as one line, exit code 2.
Every other task has its `NAME_headprune` twin with the same options (fairseq_headprune.tasks.any_task).
"""
from dataclasses import dataclass

from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from fairseq_headprune.tasks.any_task import HeadpruneOptions, HeadpruneTaskMixin


@dataclass
class TranslationHeadpruneConfig(HeadpruneOptions, TranslationConfig):  # TranslationConfig's fields first
    pass


@register_task("translation_headprune", dataclass=TranslationHeadpruneConfig)
class TranslationHeadpruneTask(HeadpruneTaskMixin, TranslationTask):
    base_task_name = "translation"
    cfg: TranslationHeadpruneConfig
