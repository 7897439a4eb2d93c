"""The `translation_headprune` task: fairseq's translation task whose models carry a ξ mask on every head.

Any transformer-family model it builds, stock or ours, gets the masks before its checkpoint's weights load
(masks are non-persistent buffers, so stock state dicts load unchanged); `--mask-heads` then sets ξ_h = 0.
`--gated-types` adds Voita et al.'s Hard Concrete gate on every head of those types (fairseq_headprune.gates;
train them with the label_smoothed_cross_entropy_l0 criterion). A stock checkpoint loads into a gated model
(the gates start at their initial value), and a gated checkpoint loads with or without the flag.
Bad flags raise UserError, as fairseq's own classes raise; `fairseq-headprune` and, through the hook this package
installs (fairseq_headprune.errors.report_user_errors), fairseq's own commands show it as one line, exit code 2.
"""
from dataclasses import dataclass, field

from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from fairseq_headprune.errors import UserError
from fairseq_headprune.gates import INIT_LOG_ALPHA, TEMPERATURE
from fairseq_headprune.heads import ATTENTION_TYPES, HeadSpecError, parse_head_spec
from fairseq_headprune.masking import install_head_gates, install_head_masks, set_head_masks


@dataclass
class TranslationHeadpruneConfig(TranslationConfig):
    mask_heads: str = field(
        default="",
        metadata={
            "help": "heads to mask: comma-separated TYPE:LAYER:HEADS (TYPE enc-self|enc-dec|dec-self, "
            "1-indexed LAYER and HEADS; HEADS a number, a range 1-4 or a list 2+5), or @file.json"
        },
    )
    gated_types: str = field(
        default="",
        metadata={"help": "put a Hard Concrete gate on every head of these attention types (comma-separated, "
                  "from enc-self, enc-dec, dec-self): Voita et al. 2019"},
    )
    gate_temperature: float = field(
        default=TEMPERATURE, metadata={"help": "Hard Concrete temperature (reference code 0.33; Louizos et al. 2/3)"}
    )
    gate_init_log_alpha: float = field(
        default=INIT_LOG_ALPHA,
        metadata={"help": "initial log alpha of every gate (>= log 11 = 2.40: gates start at exactly 1 in eval)"},
    )
    gate_lr_scale: float = field(
        default=1.0,
        metadata={"help": "log alpha = SCALE x the trained parameter: with Adam, a learning-rate multiplier "
                  "for the gates only"},
    )


@register_task("translation_headprune", dataclass=TranslationHeadpruneConfig)
class TranslationHeadpruneTask(TranslationTask):
    cfg: TranslationHeadpruneConfig

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        install_head_masks(model)
        if self.cfg.gated_types:
            types = [t.strip() for t in self.cfg.gated_types.split(",") if t.strip()]
            bad = [t for t in types if t not in ATTENTION_TYPES]
            if bad or not (self.cfg.gate_temperature > 0 and self.cfg.gate_lr_scale > 0):
                what = (f"unknown attention type '{bad[0]}' (use {', '.join(ATTENTION_TYPES)})" if bad
                        else "--gate-temperature and --gate-lr-scale must be > 0")
                raise UserError(f"--gated-types: {what}")
            install_head_gates(model, types, self.cfg.gate_temperature, self.cfg.gate_init_log_alpha,
                               self.cfg.gate_lr_scale)
        if self.cfg.mask_heads:
            try:
                set_head_masks(model, parse_head_spec(self.cfg.mask_heads))
            except HeadSpecError as e:
                raise HeadSpecError(f"--mask-heads: {e}") from None
        return model
