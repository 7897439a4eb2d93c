"""fairseq_headprune.core.flops on an asymmetric shape priced by hand (no model): every length term (source squared,
the steps attended so far, the source attended at each step), the beam, the padding of a batch, and the cache
reorder. (tests/test_science_fixes.py prices a uniform shape; this one gives every term its own size.)"""
from types import SimpleNamespace

import pytest

from fairseq_headprune.core import flops
from fairseq_headprune.core.shape import ModelShape

# d = 2, vocabulary 5; encoder: 1 layer, 1 head of dim 2 (width 2), FFN 3; decoder: 1 layer, self-attention
# 2 heads of dim 1 (width 2), encoder-decoder 1 head of dim 2 (width 2), FFN 4
SHAPE = ModelShape(
    embed_dim=2, vocab=5, enc_ffn=(3,), dec_ffn=(4,),
    heads={("enc-self", 1): 1, ("dec-self", 1): 2, ("enc-dec", 1): 1},
    head_dims={("enc-self", 1): 2, ("dec-self", 1): 1, ("enc-dec", 1): 2},
)


def test_one_sentence_by_hand():
    """Source 4 tokens, 3 steps, beam 3 (multiply-adds, then x2).

    encoder:  q/k/v/out 4*4*2*2 = 64, scores+sums 2*4*4*2 = 64, FFN 2*4*2*3 = 48                 -> 176
    enc-dec keys/values, each of 3 beam rows: 3 * 2*4*2*2                                        ->  96
    per row and step: self q/k/v/out 4*2*2 = 16, cross q/out 2*2*2 = 8, cross scores+sums over
    the 4 source tokens 2*4*2 = 16, FFN 2*2*4 = 16: 56 x 3 steps = 168; self scores+sums over
    1, 2, 3 positions 2*(1+2+3)*2 = 24: 192 per row, 3 rows                                     -> 576
    output layer 3 rows * 3 steps * 2*5                                                          ->  90
    938 multiply-adds = 1876 FLOPs.
    reorder before steps 2 and 3: self keys+values of 1 then 2 positions, width 2, 3 rows:
    3*2*(1+2)*2 = 36; encoder_out and encoder_embedding (4 x 2 each), 3 rows, twice: 3*2*2*4*2 = 96 -> 132."""
    cost = flops.decode_cost(SHAPE, [4], [3], beam=3)
    assert cost.flops == 1876
    assert cost.reorder_elements == 132


def test_length_terms_alone():
    """The terms that grow with the lengths, each by hand: doubling the source adds its square term 4x."""
    base = flops.decode_cost(SHAPE, [4], [3], beam=3).flops
    longer_source = flops.decode_cost(SHAPE, [8], [3], beam=3).flops
    # source 8: encoder 4*8*2*2 + 2*64*2 + 2*8*2*3 = 128 + 256 + 96 = 480 (was 176);
    # enc-dec k/v 3*2*8*2*2 = 192 (was 96); cross scores+sums 2*8*2 = 32 per row and step (was 16): +16*3*3 = 144
    assert longer_source - base == 2 * ((480 - 176) + (192 - 96) + 144)
    one_more_step = flops.decode_cost(SHAPE, [4], [4], beam=3).flops
    # step 4 per row: 56 + self scores+sums over 4 positions 2*4*2 = 16 -> 72, x3 rows; output 3*2*5 = 30
    assert one_more_step - base == 2 * (3 * 72 + 30)


def test_batch_padding_by_hand():
    """Sources 4 and 2 with 3 and 1 steps. Alone, the second costs (s=2, t=1): encoder 4*2*2*2 + 2*4*2 + 2*2*2*3 =
    72, k/v 3*2*2*2*2 = 48, per row 16+8+2*2*2+16 + 2*1*2 = 52 (x3 = 156), output 30: 306 multiply-adds. In one batch
    it is encoded and attended at the padded length 4: 176 + 96 + 3*(56+4) + 30 = 482."""
    assert flops.decode_flops(SHAPE, [4, 2], [3, 1], beam=3, batch_size=1) == 1876 + 2 * 306
    assert flops.decode_flops(SHAPE, [4, 2], [3, 1], beam=3, batch_size=2) == 1876 + 2 * 482


def test_a_module_without_heads_costs_nothing_of_its_attention():
    """All enc-dec heads removed: no k/v projection (96), no cross q/out, scores and sums (24 per row and step)."""
    pruned = SHAPE.without([("enc-dec", 1, 1)])
    assert pruned.width("enc-dec", 1) == 0
    assert flops.decode_flops(pruned, [4], [3], beam=3) == 1876 - 2 * (96 + 24 * 3 * 3)
    assert flops.flop_ratio(SHAPE, pruned, [4], [3], beam=3) == pytest.approx(1876 / (1876 - 2 * (96 + 216)))


def test_reorder_ratio_counts_the_self_attention_cache_and_not_the_encoder_output():
    """One of the 2 decoder self-attention heads removed: the cache copies 36 -> 18 elements, the encoder output's
    96 stay (by hand in test_one_sentence_by_hand): 132 / 114."""
    pruned = SHAPE.without([("dec-self", 1, 1)])
    assert flops.reorder_ratio(SHAPE, pruned, [4], [3], beam=3) == pytest.approx(132 / 114)
    assert flops.reorder_ratio(SHAPE, SHAPE.without([("enc-dec", 1, 1)]), [4], [3], beam=3) == 1.0


def test_shape_read_from_a_model_object():
    """ModelShape.of reads widths from each attention module's own head count (a pruned model's are smaller)."""

    def attn(heads, dim):
        return SimpleNamespace(num_heads=heads, head_dim=dim)

    model = SimpleNamespace(
        encoder=SimpleNamespace(embed_tokens=SimpleNamespace(embedding_dim=2),
                                layers=[SimpleNamespace(self_attn=attn(1, 2), fc1=SimpleNamespace(out_features=3))]),
        decoder=SimpleNamespace(output_projection=SimpleNamespace(out_features=5),
                                layers=[SimpleNamespace(self_attn=attn(2, 1), encoder_attn=attn(1, 2),
                                                        fc1=SimpleNamespace(out_features=4))]),
    )
    assert ModelShape.of(model) == SHAPE
    assert flops.decode_flops(model, [4], [3], beam=3) == 1876
