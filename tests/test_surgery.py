"""Physical head removal: the pruned model computes what the masked model computes, and reloads as a checkpoint."""
import argparse
import copy
import math
import os

import pytest
import torch
from fairseq.modules.multihead_attention import MultiheadAttention
from omegaconf import OmegaConf
from torch import nn

from conftest import run_fairseq
from fairseq_headprune.errors import UserError
from fairseq_headprune.core.heads import Head, HeadLayout, HeadSpecError, attention_modules
from fairseq_headprune.fairseq_io.loading import PACKAGE_DIR
from fairseq_headprune.core.masking import HeadMaskedMultiheadAttention, install_head_masks, set_head_masks
from fairseq_headprune.models.headprune_transformer import HeadpruneTransformerModel
from fairseq_headprune.core.shape import kept_heads, kept_heads_json
from fairseq_headprune.core.surgery import (
    HeadlessAttention,
    apply_kept_heads,
    head_rows,
    prune_model,
    remove_heads,
    select_linear,
)
from fairseq_headprune.fairseq_io.pruned_checkpoint import pruned_model_cfg, save_pruned_checkpoint
from helpers import beam_hypotheses, incremental_logits, load_stock, sample_batch, teacher_forced_logits

# 4 enc layers x 8 heads, 3 dec layers x 4 heads: enc-self 1 and 3 keep 6 and 5 heads, enc-dec 3 (the decoder's
# alignment layer) and dec-self 2 lose all of theirs
HEADS = (
    [Head("enc-self", 1, h) for h in (1, 8)]
    + [Head("enc-self", 3, h) for h in (2, 3, 4)]
    + [Head("enc-dec", 1, 2)]
    + [Head("enc-dec", 3, h) for h in (1, 2, 3, 4)]
    + [Head("dec-self", 1, 3)]
    + [Head("dec-self", 2, h) for h in (1, 2, 3, 4)]
)
EXPECTED_KEPT = {
    "enc-self": {"1": [2, 3, 4, 5, 6, 7], "3": [1, 5, 6, 7, 8]},
    "enc-dec": {"1": [1, 3, 4], "3": []},
    "dec-self": {"1": [1, 2, 4], "2": []},
}


# ------------------------------------------------------------------------------------------- pure functions


def test_head_rows():
    assert head_rows([0, 2], 3).tolist() == [0, 1, 2, 6, 7, 8]
    assert head_rows([2, 0], 2).tolist() == [4, 5, 0, 1]  # in the order given
    empty = head_rows([], 4)
    assert empty.shape == (0,) and empty.dtype == torch.long


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_select_linear_rows_keep_their_bias_entries(dtype):
    torch.manual_seed(0)
    linear = nn.Linear(5, 6).to(dtype)
    linear.bias.requires_grad_(False)
    new = select_linear(linear, torch.tensor([4, 1]), dim=0)
    assert (new.in_features, new.out_features) == (5, 2) and new.weight.shape == (2, 5)
    assert torch.equal(new.weight, linear.weight[[4, 1]]) and torch.equal(new.bias, linear.bias[[4, 1]])
    assert new.weight.dtype == dtype and new.weight.device == linear.weight.device
    assert new.weight.requires_grad and not new.bias.requires_grad  # flags follow the original
    x = torch.randn(3, 5, dtype=dtype)
    torch.testing.assert_close(new(x), linear(x)[:, [4, 1]])
    with torch.no_grad():
        new.weight.zero_()
    assert linear.weight.abs().sum() > 0, "the original must not share storage with the copy"
    assert isinstance(new.weight, nn.Parameter) and new.weight.is_leaf


def test_select_linear_columns_keep_the_whole_bias():
    torch.manual_seed(0)
    linear = nn.Linear(6, 4)
    new = select_linear(linear, [0, 5], dim=1)
    assert (new.in_features, new.out_features) == (2, 4)
    assert torch.equal(new.weight, linear.weight[:, [0, 5]]) and torch.equal(new.bias, linear.bias)
    x = torch.randn(3, 6)
    zeroed = x.clone()
    zeroed[:, 1:5] = 0
    torch.testing.assert_close(new(x[:, [0, 5]]), linear(zeroed), atol=1e-6, rtol=0)
    no_bias = select_linear(nn.Linear(6, 4, bias=False), [2], dim=1)
    assert no_bias.bias is None and no_bias.weight.shape == (4, 1)


def test_select_linear_empty_index():
    linear = nn.Linear(5, 6)
    rows = select_linear(linear, [], dim=0)
    assert rows.weight.shape == (0, 5) and rows.bias.shape == (0,) and rows(torch.randn(2, 5)).shape == (2, 0)
    cols = select_linear(linear, torch.tensor([], dtype=torch.long), dim=1)
    assert cols.in_features == 0 and cols.weight.shape == (6, 0)
    assert torch.equal(cols.bias, linear.bias)
    with pytest.raises(ValueError, match="dim must be"):
        select_linear(linear, [0], dim=2)


# ------------------------------------------------------------------------------------------- one module


def make_attention(kind: str, **kw) -> MultiheadAttention:
    torch.manual_seed(0)
    if kind == "self":
        attn = MultiheadAttention(16, 4, self_attention=True, **kw)
    else:
        attn = MultiheadAttention(16, 4, kdim=12, vdim=12, encoder_decoder_attention=True, **kw)
    with torch.no_grad():
        attn.out_proj.bias.normal_()  # fairseq initialises it to 0, which would hide a missing bias
    return attn.eval()


def masked_module(attn, removed):
    masked = HeadMaskedMultiheadAttention.convert(copy.deepcopy(attn))
    for h in removed:
        masked.head_mask[h - 1] = 0
    return masked


def run_paths(attn, kind: str):
    """Outputs of one module on fairseq's code paths: full sequence, incremental steps with a beam reorder."""
    torch.manual_seed(1)
    x = torch.randn(5, 3, 16)
    pad = torch.zeros(3, 5 if kind == "self" else 7, dtype=torch.bool)
    pad[1, -2:] = True
    outs = []
    with torch.no_grad():
        if kind == "self":
            causal = torch.triu(torch.full((5, 5), float("-inf")), 1)
            outs.append(attn(x, x, x, key_padding_mask=pad, attn_mask=causal)[0])
            state = {}
            for t in range(3):
                outs.append(attn(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state)[0])
                attn.reorder_incremental_state(state, torch.tensor([2, 0, 1]))
        else:
            enc = torch.randn(7, 3, 12)
            outs.append(attn(x, enc, enc, key_padding_mask=pad, static_kv=True)[0])
            state = {}
            for t in range(3):
                step = attn(x[t : t + 1], enc, enc, key_padding_mask=pad, incremental_state=state, static_kv=True)
                outs.append(step[0])
                attn.reorder_incremental_state(state, torch.tensor([1, 1, 0]))
    return outs


@pytest.mark.parametrize("kind", ["self", "enc-dec"])
def test_remove_heads_equals_masking_them(kind):
    attn = make_attention(kind)
    pruned = remove_heads(copy.deepcopy(attn), [2, 4])  # original 1-indexed ids
    assert (pruned.num_heads, pruned.embed_dim, pruned.head_ids, pruned.original_num_heads) == (2, 8, (1, 3), 4)
    assert pruned.q_proj.out_features == pruned.k_proj.out_features == pruned.v_proj.out_features == 8
    assert pruned.out_proj.in_features == 8 and pruned.out_proj.weight.shape == (16, 8)
    assert pruned.skip_embed_dim_check
    for got, want in zip(run_paths(pruned, kind), run_paths(masked_module(attn, [2, 4]), kind)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    remove_heads(pruned, [3])  # ids keep their meaning after a first removal
    assert pruned.head_ids == (1,) and pruned.num_heads == 1
    with pytest.raises(ValueError, match=r"heads \[2\] are not in this attention module"):
        remove_heads(pruned, [2])


def test_remove_heads_refuses_what_fairseq_cannot_run():
    with pytest.raises(NotImplementedError, match="add_bias_kv"):
        remove_heads(make_attention("self", add_bias_kv=True), [1])


def test_remove_heads_shrinks_the_head_mask():
    attn = HeadMaskedMultiheadAttention.convert(make_attention("self"))
    attn.head_mask[2] = 0  # head 3 masked
    remove_heads(attn, [2])
    assert attn.head_mask.tolist() == [1, 0, 1] and "head_mask" not in attn.state_dict()
    assert remove_heads(attn, []) is attn and attn.head_ids == (1, 3, 4)  # removing nothing changes nothing


@pytest.mark.parametrize("kind", ["self", "enc-dec"])
def test_all_heads_removed_gives_out_proj_bias_on_every_path(kind):
    attn = make_attention(kind)
    headless = remove_heads(copy.deepcopy(attn), [1, 2, 3, 4])
    assert isinstance(headless, HeadlessAttention) and headless.num_heads == 0 and headless.head_ids == ()
    assert headless.out_proj.weight.shape == (16, 0) and headless.q_proj.weight.shape[0] == 0
    masked = masked_module(attn, [1, 2, 3, 4])
    for got, want in zip(run_paths(headless, kind), run_paths(masked, kind)):
        assert torch.equal(got, want)  # out_proj of zeros is exactly its bias
        assert torch.equal(got, attn.out_proj.bias.expand_as(got))
    x = torch.randn(2, 3, 16)
    out, weights = headless(x, x, x, need_weights=True, need_head_weights=True)
    assert weights is None and torch.isfinite(out).all()


# ------------------------------------------------------------------------------------------- a model


@pytest.fixture(scope="module")
def stock(stock_checkpoint, tiny_data):
    return load_stock(stock_checkpoint, tiny_data)


@pytest.fixture(scope="module")
def pruned(stock):
    return prune_model(copy.deepcopy(stock[0]), HEADS)


def masked_copy(model, heads):
    masked = copy.deepcopy(model)
    install_head_masks(masked)
    set_head_masks(masked, heads)
    return masked


def same_beams(got, want):
    assert [tokens for tokens, _ in got] == [tokens for tokens, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-4)


def test_pruned_model_equals_masked_model(stock, pruned):
    model, task = stock
    batch = sample_batch(task)
    masked = masked_copy(model, HEADS)
    expected = teacher_forced_logits(masked, batch)
    assert not torch.allclose(teacher_forced_logits(model, batch), expected, atol=1e-2), "the heads must matter"
    torch.testing.assert_close(teacher_forced_logits(pruned, batch), expected, atol=1e-4, rtol=0)
    torch.testing.assert_close(incremental_logits(pruned, batch), incremental_logits(masked, batch), atol=1e-4, rtol=0)
    same_beams(beam_hypotheses(pruned, task, batch), beam_hypotheses(masked, task, batch))


def test_layout_kept_heads_and_parameter_count(stock, pruned):
    model = stock[0]
    layout = HeadLayout.of(pruned)
    assert layout.describe() == (
        "the model has enc-self 4 layers with [6, 8, 5, 8] heads, enc-dec 3 layers with [3, 4, 0] heads, "
        "dec-self 3 layers with [3, 0, 4] heads"
    )
    assert kept_heads(pruned) == EXPECTED_KEPT
    modules = attention_modules(model)
    expected = 0
    for h in HEADS:
        attn = modules[(h.type, h.layer)]
        d = attn.head_dim
        # q/k/v rows with their biases, out_proj input columns (its bias stays)
        expected += d * (attn.q_proj.in_features + attn.k_proj.in_features + attn.v_proj.in_features + 3)
        expected += d * attn.out_proj.out_features
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(model) - count(pruned) == expected
    assert isinstance(attention_modules(pruned)[("enc-dec", 3)], HeadlessAttention)


def test_fully_pruned_layers_give_finite_outputs_and_gradients(stock, pruned):
    model, task = stock
    batch = sample_batch(task)
    assert torch.isfinite(teacher_forced_logits(pruned, batch)).all()
    assert torch.isfinite(incremental_logits(pruned, batch)).all()
    trained = copy.deepcopy(pruned).train()
    trained(**batch["net_input"])[0].logsumexp(-1).sum().backward()
    grads = [p.grad for p in trained.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert trained.decoder.layers[2].encoder_attn.out_proj.bias.grad is not None  # the bias still trains


def test_prune_model_validates_before_changing_anything(pruned):
    model = copy.deepcopy(pruned)
    with pytest.raises(HeadSpecError, match="head enc-dec:3:2 was removed from this pruned model"):
        prune_model(model, [Head("enc-self", 2, 1), Head("enc-dec", 3, 2)])
    with pytest.raises(HeadSpecError, match="enc-self layer 2 has no head 9: heads are 1..8"):
        prune_model(model, [Head("enc-self", 2, h) for h in range(1, 10)])
    with pytest.raises(HeadSpecError, match="dec-self layer 4 does not exist"):
        prune_model(model, [Head("dec-self", 4, 1)])
    assert HeadLayout.of(model) == HeadLayout.of(pruned)  # nothing was removed by the failed calls


def test_kept_heads_rebuild_the_shape(stock, pruned):
    rebuilt = apply_kept_heads(copy.deepcopy(stock[0]), kept_heads_json(pruned))
    assert HeadLayout.of(rebuilt) == HeadLayout.of(pruned)
    assert kept_heads_json(stock[0]) == ""
    with pytest.raises(HeadSpecError, match="not valid JSON"):
        apply_kept_heads(copy.deepcopy(stock[0]), "{enc")
    with pytest.raises(HeadSpecError, match="has no head 5"):
        apply_kept_heads(copy.deepcopy(stock[0]), '{"enc-dec": {"1": [5]}}')
    with pytest.raises(HeadSpecError, match="enc-dec layer 4"):
        apply_kept_heads(copy.deepcopy(stock[0]), '{"enc-dec": {"4": []}}')


def test_kept_heads_option_defaults_to_empty():
    parser = argparse.ArgumentParser()
    HeadpruneTransformerModel.add_args(parser)
    assert parser.parse_args([]).kept_heads == ""
    assert parser.parse_args(["--kept-heads", '{"enc-dec": {"1": [2]}}']).kept_heads == '{"enc-dec": {"1": [2]}}'


@pytest.mark.parametrize("kind", ["namespace", "legacy-args", "dict", "dictconfig"])
def test_pruned_model_cfg_keeps_the_kind_of_config(kind):
    fields = {"arch": "transformer", "encoder_layers": 4}
    source = {
        "namespace": argparse.Namespace(_name="transformer", **fields),
        "legacy-args": argparse.Namespace(**fields),
        "dict": {"_name": "transformer", **fields},
        "dictconfig": OmegaConf.create({"_name": "transformer", **fields}),
    }[kind]
    cfg = pruned_model_cfg(source, '{"enc-dec":{"1":[1]}}')
    get = (lambda k: getattr(cfg, k, None)) if kind in ("namespace", "legacy-args") else cfg.get  # noqa: E731
    assert isinstance(cfg, argparse.Namespace if kind in ("namespace", "legacy-args") else dict)
    assert get("arch") == "headprune_transformer" and get("kept_heads") == '{"enc-dec":{"1":[1]}}'
    assert get("encoder_layers") == 4
    assert get("_name") == (None if kind == "legacy-args" else "headprune_transformer")
    assert (getattr(source, "arch", None) or source.get("arch")) == "transformer"  # the source is not modified


# ------------------------------------------------------------------------------------------- a checkpoint


@pytest.fixture(scope="module")
def pruned_checkpoint(pruned, stock_checkpoint, tmp_path_factory):
    return save_pruned_checkpoint(pruned, stock_checkpoint, tmp_path_factory.mktemp("pruned") / "pruned.pt")


def reload(path, data):
    from fairseq import checkpoint_utils, tasks

    task = tasks.setup_task(OmegaConf.create({"_name": "translation_headprune", "data": str(data)}))
    models, _cfg = checkpoint_utils.load_model_ensemble([str(path)], task=task)
    return models[0].eval()


def test_saved_checkpoint_records_the_pruned_shape(pruned_checkpoint, pruned):
    state = torch.load(pruned_checkpoint, map_location="cpu", weights_only=False)
    model_cfg = state["cfg"]["model"]
    assert isinstance(model_cfg, argparse.Namespace)
    assert model_cfg.arch == model_cfg._name == "headprune_transformer"
    assert model_cfg.kept_heads == kept_heads_json(pruned)
    assert state["model"]["decoder.layers.2.encoder_attn.out_proj.weight"].shape == (32, 0)
    assert state["model"]["encoder.layers.0.self_attn.q_proj.weight"].shape == (24, 32)
    # no temporary file left behind (the output path's lock file stays by design: checkpoint_io.output_lock)
    assert sorted(os.listdir(pruned_checkpoint.parent)) == [".pruned.pt.lock", "pruned.pt"]


def test_reload_with_fairseq_loader_equals_in_memory_model(pruned_checkpoint, pruned, stock, tiny_data):
    task = stock[1]
    reloaded = reload(pruned_checkpoint, tiny_data)
    assert isinstance(reloaded, HeadpruneTransformerModel)
    assert HeadLayout.of(reloaded) == HeadLayout.of(pruned)
    batch = sample_batch(task)
    torch.testing.assert_close(teacher_forced_logits(reloaded, batch), teacher_forced_logits(pruned, batch),
                               atol=1e-6, rtol=0)
    same_beams(beam_hypotheses(reloaded, task, batch), beam_hypotheses(pruned, task, batch))


def test_checkpoint_with_a_dict_model_config(pruned, stock_checkpoint, stock, tiny_data, tmp_path):
    """Hydra-style checkpoints store cfg["model"] as a dict: the pruned one stays a dict and reloads."""
    state = torch.load(stock_checkpoint, map_location="cpu", weights_only=False)
    state["cfg"]["model"] = dict(vars(state["cfg"]["model"]))
    torch.save(state, tmp_path / "dict.pt")
    path = save_pruned_checkpoint(pruned, tmp_path / "dict.pt", tmp_path / "pruned.pt")
    model_cfg = torch.load(path, map_location="cpu", weights_only=False)["cfg"]["model"]
    assert isinstance(model_cfg, dict) and model_cfg["kept_heads"] == kept_heads_json(pruned)
    reloaded = reload(path, tiny_data)
    assert HeadLayout.of(reloaded) == HeadLayout.of(pruned)
    batch = sample_batch(stock[1])
    torch.testing.assert_close(teacher_forced_logits(reloaded, batch), teacher_forced_logits(pruned, batch),
                               atol=1e-6, rtol=0)


def test_fairseq_generate_on_pruned_checkpoint_equals_in_memory_model(pruned_checkpoint, pruned, stock, tiny_data):
    task = stock[1]
    out = run_fairseq(["fairseq-generate", tiny_data, "--path", pruned_checkpoint, "--user-dir", PACKAGE_DIR,
                       "--task", "translation_headprune", "--gen-subset", "test", "--beam", "4", "--max-len-b", "60",
                       "--max-tokens", "3000"]).stdout
    generated = {}
    for line in out.splitlines():
        if line.startswith("H-"):
            sid, score, text = line.split("\t")
            generated[int(sid[2:])] = (float(score), text)
    assert len(generated) == len(task.dataset("test"))
    batch = sample_batch(task, n=8)
    for sid, (tokens, score) in zip(batch["id"].tolist(), beam_hypotheses(pruned, task, batch)):
        assert generated[sid][1] == task.target_dictionary.string(torch.tensor(tokens))
        assert generated[sid][0] == pytest.approx(score / math.log(2), abs=1e-4)  # fairseq-generate prints base 2


def test_reloaded_model_is_pruned_again_and_masked_by_original_ids(pruned_checkpoint, stock, tiny_data, tmp_path):
    model, task = stock
    batch = sample_batch(task)
    reloaded = reload(pruned_checkpoint, tiny_data)
    more = [Head("enc-self", 1, 5), Head("dec-self", 1, 1)]
    # a mask on the reloaded model addresses the same original heads as on the stock model
    masked = masked_copy(reloaded, more)
    reference = masked_copy(model, HEADS + more)
    torch.testing.assert_close(teacher_forced_logits(masked, batch), teacher_forced_logits(reference, batch),
                               atol=1e-4, rtol=0)
    with pytest.raises(HeadSpecError, match="head enc-self:1:8 was removed"):
        set_head_masks(masked, [Head("enc-self", 1, 8)])
    # second round of surgery, saved with the pruned checkpoint as source, reloads with the smaller shape
    again = prune_model(reloaded, more)
    torch.testing.assert_close(teacher_forced_logits(again, batch), teacher_forced_logits(reference, batch),
                               atol=1e-4, rtol=0)
    path = save_pruned_checkpoint(again, pruned_checkpoint, tmp_path / "again.pt")
    twice = reload(path, tiny_data)
    assert HeadLayout.of(twice) == HeadLayout.of(again)
    assert kept_heads(twice)["enc-self"]["1"] == [2, 3, 4, 6, 7] and kept_heads(twice)["dec-self"]["1"] == [2, 4]
    same_beams(beam_hypotheses(twice, task, batch), beam_hypotheses(reference, task, batch))


def test_save_is_atomic(pruned, stock_checkpoint, tmp_path, monkeypatch):
    out = tmp_path / "pruned.pt"
    out.write_bytes(b"previous")

    def crash(obj, f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)):
            with open(f, "wb") as handle:
                handle.write(b"half a checkpoint")
        else:
            f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        save_pruned_checkpoint(pruned, stock_checkpoint, out)
    assert out.read_bytes() == b"previous" and sorted(os.listdir(tmp_path)) == [".pruned.pt.lock", "pruned.pt"]


def test_save_rejects_a_model_from_another_checkpoint(stock_checkpoint, tmp_path):
    with pytest.raises(UserError, match="does not come from"):
        save_pruned_checkpoint(nn.Linear(2, 2), stock_checkpoint, tmp_path / "x.pt")
    assert not (tmp_path / "x.pt").exists()
