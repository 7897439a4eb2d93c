"""A masked head's output is zeroed before out_proj on every code path fairseq takes."""
import copy

import pytest
import torch

from fairseq_headprune.core.heads import Head, HeadLayout, attention_modules
from fairseq_headprune.core.masking import (
    HeadMaskedMultiheadAttention,
    current_masked_heads,
    head_masks,
    install_head_masks,
    row_head_masks,
    set_head_masks,
)
from helpers import (
    beam_hypotheses,
    incremental_logits,
    load_stock,
    sample_batch,
    teacher_forced_logits,
    zero_head_columns,
)

# one head of each attention type, on layers of the asymmetric model (4 enc layers x 8 heads, 3 dec x 4)
CASES = [Head("enc-self", 2, 3), Head("enc-dec", 3, 2), Head("dec-self", 1, 4)]


@pytest.fixture(scope="module")
def stock(stock_checkpoint, tiny_data):
    return load_stock(stock_checkpoint, tiny_data)


def masked_copy(model, heads):
    masked = copy.deepcopy(model)
    install_head_masks(masked)
    set_head_masks(masked, heads)
    return masked


def test_layout_of_asymmetric_stock_model(stock):
    layout = HeadLayout.of(stock[0])
    assert layout.describe() == (
        "the model has enc-self 4 layers x 8 heads, enc-dec 3 layers x 4 heads, dec-self 3 layers x 4 heads"
    )
    assert len(layout.all_heads()) == 4 * 8 + 3 * 4 + 3 * 4


@pytest.mark.parametrize("head", CASES, ids=str)
def test_mask_equals_zeroed_out_proj_columns(stock, head):
    model, task = stock
    batch = sample_batch(task)
    masked = masked_copy(model, [head])
    reference = zero_head_columns(model, *head)  # stock module: enc-self/dec-self take the fused path here
    unmasked = teacher_forced_logits(model, batch)
    expected = teacher_forced_logits(reference, batch)
    assert not torch.allclose(unmasked, expected, atol=1e-3), "the head must matter for this test to mean anything"
    torch.testing.assert_close(teacher_forced_logits(masked, batch), expected, atol=1e-5, rtol=0)
    # incremental decoding: Python path, cached keys/values, static keys/values of encoder-decoder attention
    torch.testing.assert_close(incremental_logits(masked, batch), incremental_logits(reference, batch),
                               atol=1e-5, rtol=0)
    got, want = beam_hypotheses(masked, task, batch), beam_hypotheses(reference, task, batch)
    assert [tokens for tokens, _ in got] == [tokens for tokens, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-5)


def test_unmasked_model_keeps_stock_outputs_and_state_dict(stock):
    model, task = stock
    batch = sample_batch(task)
    masked = masked_copy(model, [])
    assert torch.equal(teacher_forced_logits(masked, batch), teacher_forced_logits(model, batch))
    assert masked.state_dict().keys() == model.state_dict().keys()  # ξ is a non-persistent buffer
    for attn in attention_modules(masked).values():
        assert isinstance(attn, HeadMaskedMultiheadAttention)
        assert "head_mask" in dict(attn.named_buffers()) and "head_mask" not in dict(attn.named_parameters())


def test_several_heads_and_current_masked_heads(stock):
    model, task = stock
    heads = [Head("enc-self", 1, 1), Head("enc-self", 1, 8), Head("enc-dec", 2, 1), Head("dec-self", 3, 2)]
    masked = masked_copy(model, heads)
    assert current_masked_heads(masked) == heads
    reference = model
    for h in heads:
        reference = zero_head_columns(reference, *h)
    batch = sample_batch(task)
    torch.testing.assert_close(teacher_forced_logits(masked, batch), teacher_forced_logits(reference, batch),
                               atol=1e-5, rtol=0)
    set_head_masks(masked, [])
    assert current_masked_heads(masked) == []
    assert torch.equal(teacher_forced_logits(masked, batch), teacher_forced_logits(model, batch))


def test_all_heads_of_a_layer_masked_gives_finite_outputs(stock):
    model, task = stock
    heads = [Head("enc-dec", 2, h) for h in range(1, 5)] + [Head("enc-self", 4, h) for h in range(1, 9)]
    masked = masked_copy(model, heads)
    batch = sample_batch(task)
    assert torch.isfinite(teacher_forced_logits(masked, batch)).all()
    assert all(tokens for tokens, _ in beam_hypotheses(masked, task, batch))


def test_row_masks_give_each_row_its_own_mask(stock):
    """Rows of one batch with different masks equal separate runs with one global mask each."""
    model, task = stock
    batch = sample_batch(task, n=3)
    masked = masked_copy(model, [])
    per_row = [Head("enc-self", 2, 3), Head("enc-dec", 3, 2), Head("dec-self", 1, 4)]
    with row_head_masks(masked, 3) as rows:
        for row, head in enumerate(per_row):
            rows[(head.type, head.layer)][row, head.head - 1] = 0
        together = teacher_forced_logits(masked, batch)
    for row, head in enumerate(per_row):
        alone = teacher_forced_logits(zero_head_columns(model, *head), batch)
        torch.testing.assert_close(together[row], alone[row], atol=1e-5, rtol=0)
    assert all(attn.row_head_mask is None for attn in attention_modules(masked).values())


def test_head_masks_restore_what_the_model_held(stock):
    """A block's masks are its own: the masks set before it are back after it, however it ends."""
    model, _ = stock
    before = [Head("enc-self", 1, 1), Head("dec-self", 3, 2)]
    masked = masked_copy(model, before)
    with head_masks(masked, CASES):
        assert set(current_masked_heads(masked)) == set(CASES)
    assert current_masked_heads(masked) == before
    with pytest.raises(RuntimeError), head_masks(masked, []):
        assert current_masked_heads(masked) == []
        raise RuntimeError("a failure inside the block")
    assert current_masked_heads(masked) == before
