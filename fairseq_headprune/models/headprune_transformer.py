"""The `headprune_transformer` architecture family: fairseq's transformer with ξ masks on all three attention
types. Stock `transformer` checkpoints need none of this (the `translation_headprune` task installs the same
masks on them); these names exist to train with masks from the start and for the papers' model shapes.

`--kept-heads` (JSON {TYPE: {LAYER: [original head ids]}}, layers not listed keep all heads) gives the model a
physically pruned shape when it is built, before fairseq loads weights: it is how checkpoints written by
`fairseq_io.pruned_checkpoint.save_pruned_checkpoint` reload; `--kept-ffn` (JSON {"enc"|"dec": {LAYER: UNITS}})
does the same for FFNs narrowed by `shrink --ffn-keep` (prune.ffn, core.surgery)."""
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerModel
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_fr_big,
)

from fairseq_headprune.core.masking import install_head_masks
from fairseq_headprune.core.surgery import apply_kept_ffn, apply_kept_heads


@register_model("headprune_transformer")
class HeadpruneTransformerModel(TransformerModel):
    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument(
            "--kept-heads", type=str, default="", metavar="JSON",
            help='heads each pruned layer keeps, as JSON {"enc-dec": {"6": [1, 3]}, ...} (original 1-indexed ids; '
            "layers not listed keep all heads); written by save_pruned_checkpoint",
        )
        parser.add_argument(
            "--kept-ffn", type=str, default="", metavar="JSON",
            help='FFN hidden units each narrowed layer keeps, as JSON {"dec": {"3": 256}, ...} (layers not listed '
            "keep the configured width); written by save_pruned_checkpoint",
        )

    @classmethod
    def build_model(cls, args, task):
        model = super().build_model(args, task)
        install_head_masks(model)
        apply_kept_heads(model, getattr(args, "kept_heads", "") or "")
        apply_kept_ffn(model, getattr(args, "kept_ffn", "") or "")
        return model


@register_model_architecture("headprune_transformer", "headprune_transformer")
def headprune_transformer(args):
    base_architecture(args)


@register_model_architecture("headprune_transformer", "headprune_transformer_iwslt_de_en")
def headprune_transformer_iwslt_de_en(args):
    transformer_iwslt_de_en(args)


@register_model_architecture("headprune_transformer", "headprune_transformer_iwslt_de_en_8head")
def headprune_transformer_iwslt_de_en_8head(args):
    """Michel et al.'s IWSLT De-En model: 6+6 layers, d=512, FFN 1024, 8 heads, pre-norm."""
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", 8)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 8)
    args.encoder_normalize_before = getattr(args, "encoder_normalize_before", True)
    args.decoder_normalize_before = getattr(args, "decoder_normalize_before", True)
    transformer_iwslt_de_en(args)


@register_model_architecture("headprune_transformer", "headprune_transformer_vaswani_wmt_en_fr_big")
def headprune_transformer_vaswani_wmt_en_fr_big(args):
    """The shape of fairseq's pretrained WMT14 En-Fr model (Ott et al. 2018), used by Michel et al."""
    transformer_vaswani_wmt_en_fr_big(args)
