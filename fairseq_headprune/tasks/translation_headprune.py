"""The `translation_headprune` task: fairseq's translation task whose models carry a ξ mask on every head.

Any transformer-family model it builds, stock or ours, gets the masks before its checkpoint's weights load
(masks are non-persistent buffers, so stock state dicts load unchanged); `--mask-heads` then sets ξ_h = 0.
"""
import sys
from dataclasses import dataclass, field

from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from fairseq_headprune.heads import HeadSpecError, parse_head_spec
from fairseq_headprune.masking import install_head_masks, set_head_masks


@dataclass
class TranslationHeadpruneConfig(TranslationConfig):
    mask_heads: str = field(
        default="",
        metadata={
            "help": "heads to mask: comma-separated TYPE:LAYER:HEADS (TYPE enc-self|enc-dec|dec-self, "
            "1-indexed LAYER and HEADS; HEADS a number, a range 1-4 or a list 2+5), or @file.json"
        },
    )


@register_task("translation_headprune", dataclass=TranslationHeadpruneConfig)
class TranslationHeadpruneTask(TranslationTask):
    cfg: TranslationHeadpruneConfig

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        install_head_masks(model)
        if self.cfg.mask_heads:
            try:
                set_head_masks(model, parse_head_spec(self.cfg.mask_heads))
            except HeadSpecError as e:
                # fairseq's CLIs have no error handling of their own: a bad flag is a usage error (exit 2)
                print(f"error: --mask-heads: {e}", file=sys.stderr)
                raise SystemExit(2) from None
        return model
