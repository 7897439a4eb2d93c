"""I_h = E_x |∂L(x)/∂ξ_h|: checked against finite differences and against heads that cannot matter."""
import copy

import pytest
import torch

from fairseq_headprune.criterions.head_importance import HeadImportanceCriterion
from fairseq_headprune.core.heads import Head
from fairseq_headprune.core.importance import ImportanceAccumulator, normalize_by_layer
from fairseq_headprune.core.masking import install_head_masks, row_head_masks
from helpers import load_stock, sample_batch, zero_head_columns


@pytest.fixture(scope="module")
def stock(stock_checkpoint, tiny_data):
    return load_stock(stock_checkpoint, tiny_data)


def sentence_nll(model, batch, pad):
    """Summed token NLL of every sentence of the batch (the L(x) of the definition)."""
    logits = model(**batch["net_input"])[0]
    lprobs = torch.log_softmax(logits, dim=-1)
    target = batch["target"]
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return nll.masked_fill(target.eq(pad), 0).sum(1)


def criterion_gradients(model, task, batch):
    criterion = HeadImportanceCriterion(task, sentence_avg=False)
    loss, _, _ = criterion(model, batch)
    loss.backward()
    leaves = criterion._pending
    criterion.accumulate()
    return {key: leaf.grad.clone() for key, leaf in leaves.items()}, criterion.accumulator


def test_gradient_matches_finite_differences_per_sentence(stock, monkeypatch):
    """Central differences in float64, eps 1e-5: agreement to 1e-6 relative (truncation error ~1e-10).

    fairseq computes softmaxes in float32 whatever the model's dtype; they are kept in float64 here, or their
    rounding (~1e-7) would swamp the differences."""
    from fairseq import utils

    monkeypatch.setattr(utils, "softmax", lambda x, dim, onnx_trace=False: torch.softmax(x, dim=dim))
    monkeypatch.setattr(utils, "log_softmax", lambda x, dim, onnx_trace=False: torch.log_softmax(x, dim=dim))
    model, task = stock
    model = copy.deepcopy(model).double()
    install_head_masks(model)
    batch = sample_batch(task, n=4)
    pad = task.target_dictionary.pad()
    grads, _ = criterion_gradients(model, task, batch)
    eps = 1e-5
    for head in [Head("enc-self", 1, 2), Head("enc-self", 4, 7), Head("enc-dec", 2, 3), Head("dec-self", 3, 1)]:
        key = (head.type, head.layer)
        diffs = []
        for sign in (+1, -1):
            with torch.no_grad(), row_head_masks(model, 4) as rows:
                rows[key][:, head.head - 1] = 1 + sign * eps
                diffs.append(sentence_nll(model, batch, pad))
        finite = (diffs[0] - diffs[1]) / (2 * eps)
        analytic = grads[key][:, head.head - 1]
        assert analytic.abs().max() > 1e-4, "a trained head should have a non-zero gradient"
        torch.testing.assert_close(analytic, finite, rtol=1e-6, atol=1e-9)


def test_head_with_zero_out_proj_columns_has_zero_importance(stock):
    model, task = stock
    dead = Head("enc-dec", 1, 3)
    model = zero_head_columns(model, *dead)
    install_head_masks(model)
    for p in model.parameters():
        p.requires_grad_(False)
    _, accumulator = criterion_gradients(model, task, sample_batch(task, n=8))
    scores = accumulator.mean()
    assert scores[(dead.type, dead.layer)][dead.head - 1].item() == 0.0
    assert (scores[(dead.type, dead.layer)] > 0).sum() == 3
    assert all((s > 0).all() for key, s in scores.items() if key != (dead.type, dead.layer))


def test_accumulator_takes_absolute_value_per_sentence():
    acc = ImportanceAccumulator()
    leaf = torch.ones(2, 3, requires_grad=True)
    (leaf * torch.tensor([[1.0, -2.0, 0.0], [-1.0, 2.0, 0.5]])).sum().backward()
    acc.add({("enc-self", 1): leaf})
    assert acc.sentences == 2
    assert acc.mean()[("enc-self", 1)].tolist() == [1.0, 2.0, 0.25]  # not |1 - 1| = 0: signs do not cancel


def test_normalize_by_layer_gives_unit_l2_norm_per_layer():
    scores = {("enc-self", 1): torch.tensor([3.0, 4.0]), ("dec-self", 1): torch.tensor([0.0, 2.0])}
    normalized = normalize_by_layer(scores)
    assert normalized[("enc-self", 1)].tolist() == pytest.approx([0.6, 0.8])
    assert normalized[("dec-self", 1)].tolist() == pytest.approx([0.0, 1.0])
