"""Issue 17's science fixes, each pinned by a test that failed before it (FLOPs, positional function, fp16
importance, masks that cannot be honoured, bootstrap resample size, per-position importance, claims)."""
import pytest

from fairseq_headprune.core import flops
from fairseq_headprune.core.shape import ModelShape

# ---------------------------------------------------------------------------------------------- FLOP count
# A model small enough to price by hand: d=4, 2 heads of dim 2 everywhere (width 4), 1+1 layers, FFN 8, vocab 10.
TINY = ModelShape.uniform(enc_layers=1, dec_layers=1, heads=2, embed_dim=4, ffn=8, vocab=10)


def test_flops_by_hand():
    """One sentence, source 3 tokens, 2 decoding steps, beam 2 (multiply-adds, then x2).

    encoder:  q/k/v/out 4*3*4*4=192, scores+sums 2*3*3*4=72, FFN 2*3*4*8=192             -> 456
    enc-dec keys/values for each of the 2 beam rows: 2 rows * 2*3*4*4                    -> 192
    per row and step: self q/k/v/out 4*4*4=64, cross q/out 2*4*4=32, cross scores+sums
    2*3*4=24, FFN 2*4*8=64 = 184; 2 steps = 368; self scores+sums over 1 then 2 keys
    2*(1+2)*4=24; 392 per row, 2 rows                                                   -> 784
    output layer: 2 rows * 2 steps * 4*10                                                -> 160
    total 1592 multiply-adds = 3184 FLOPs.
    reorder before step 2 (copies, not FLOPs): keys+values of 1 cached position, 2 rows,
    width 4: 2*2*1*4=16; encoder_out+encoder_embedding 2 rows * 2*3*4=48                 -> 64 elements."""
    cost = flops.decode_cost(TINY, [3], [2], beam=2)
    assert cost.flops == 3184
    assert cost.reorder_elements == 64
    assert flops.decode_flops(TINY, [3], [2], beam=2) == 3184


def test_flops_encoder_keys_values_per_beam_row():
    """fairseq expands the encoder output per beam row before enc-dec attention projects it: the projection
    grows with the beam (the old count priced it once per sentence)."""
    one, five = (flops.decode_flops(TINY, [3], [2], beam=b) for b in (1, 5))
    enc = 2 * 456  # encoder FLOPs, the only part not multiplied by the beam
    assert five - enc == 5 * (one - enc)


def test_flops_of_a_pruned_shape_and_per_head_costs():
    """Removing enc-dec head 1 halves that module's width: 2*3*4*2 (k/v) + 2*4*2 + 2*3*2 (per step) saved per
    row, x2 rows, x2 FLOPs; flops_per_head says the same, and the ratio is base over pruned."""
    pruned = TINY.without([("enc-dec", 1, 1)])
    assert pruned.heads[("enc-dec", 1)] == 1 and TINY.heads[("enc-dec", 1)] == 2
    saved_macs = 2 * (2 * 3 * 4 * 2 + 2 * (2 * 4 * 2 + 2 * 3 * 2))
    assert flops.decode_flops(pruned, [3], [2], beam=2) == 3184 - 2 * saved_macs
    assert flops.flops_per_head(TINY, [3], [2], beam=2)[("enc-dec", 1)] == 2 * saved_macs
    assert flops.flop_ratio(TINY, pruned, [3], [2], beam=2) == 3184 / (3184 - 2 * saved_macs)
    with pytest.raises(ValueError):
        TINY.without([("enc-dec", 1, 1), ("enc-dec", 1, 2), ("enc-dec", 1, 3)])


def test_flops_batches_pad_the_source():
    """Batched with a 5-token source, a 3-token one is encoded (and attended) at length 5."""
    assert flops.padded_sources([3, 5, 2], batch_size=2) == [5, 5, 2]
    assert flops.decode_flops(TINY, [3, 5], [2, 2], beam=2, batch_size=2) == 2 * flops.decode_flops(
        TINY, [5], [2], beam=2)


def test_flops_shape_of_a_fairseq_model(stock_checkpoint):
    """ModelShape.of reads the stock checkpoint's asymmetric shape (4 enc layers x 8 heads, 3 dec x 4)."""
    import torch
    from fairseq import checkpoint_utils

    models, _cfg, _task = checkpoint_utils.load_model_ensemble_and_task([str(stock_checkpoint)])
    shape = ModelShape.of(models[0])
    assert shape.embed_dim == 32 and shape.enc_ffn == (64,) * 4 and shape.dec_ffn == (64,) * 3
    assert shape.heads[("enc-self", 4)] == 8 and shape.heads[("enc-dec", 3)] == 4
    assert shape.head_dims[("enc-self", 1)] == 4 and shape.head_dims[("dec-self", 1)] == 8
    assert torch.is_tensor(next(models[0].parameters()))


def test_flops_follow_what_fairseq_beam_search_does(stock):
    """The count's assumptions, watched on a real beam search (beam 3, one sentence): enc-dec k_proj sees one
    row per beam hypothesis, and the decoder self-attention cache is reordered before every step but the
    first."""
    import torch

    from helpers import _GenArgs, sample_batch

    model, task = stock
    batch = sample_batch(task, n=1)
    rows, reorders = [], []
    attn = model.decoder.layers[0].encoder_attn
    hook = attn.k_proj.register_forward_hook(lambda _m, inputs, _out: rows.append(inputs[0].size(1)))
    original = type(model.decoder.layers[0].self_attn).reorder_incremental_state

    def counting(self, state, order):
        if self is model.decoder.layers[0].self_attn:
            reorders.append(int(order.numel()))
        return original(self, state, order)

    type(model.decoder.layers[0].self_attn).reorder_incremental_state = counting
    try:
        generator = task.build_generator([model], _GenArgs(3))
        with torch.no_grad():
            hyp = task.inference_step(generator, [model], batch)[0]
    finally:
        hook.remove()
        type(model.decoder.layers[0].self_attn).reorder_incremental_state = original
    assert rows == [3]  # projected once, for each of the 3 beam rows (the old count priced 1)
    steps = max(len(h["tokens"]) for h in hyp)  # the search ran at least as many steps as its longest hypothesis
    assert len(reorders) >= steps - 1 and set(reorders) == {3}

def test_flops_without_predicts_the_physically_pruned_model(stock):
    """ModelShape.without (what FLOP-budget pruning prices) gives the shape ModelShape.of reads from the model
    surgery actually prunes, a layer emptied entirely included; so their FLOPs are equal."""
    import copy

    from fairseq_headprune.core.heads import Head
    from fairseq_headprune.core.masking import install_head_masks
    from fairseq_headprune.core.surgery import prune_model

    model, _task = stock
    model = copy.deepcopy(model)
    install_head_masks(model)
    heads = [Head("enc-self", 1, h) for h in (1, 3, 8)] + [Head("enc-dec", 2, h) for h in range(1, 5)]
    heads.append(Head("dec-self", 3, 2))
    before = ModelShape.of(model)
    after = ModelShape.of(prune_model(model, heads))
    assert before.without(heads) == after
    assert after.heads[("enc-dec", 2)] == 0 and after.heads[("enc-self", 1)] == 5
    lens = ([7, 12], [9, 5])
    assert flops.decode_flops(before.without(heads), *lens, beam=4) == flops.decode_flops(after, *lens, beam=4)
    assert flops.flop_ratio(before, after, *lens, beam=4) > 1

# ------------------------------------------------------------------------------------- positional function
def test_positional_argmax_leaves_eos_out():
    """A head that sends the last real token to EOS (right after it) with weight 0.9 and 0.1 to the token
    before: its maximum over keys other than EOS is -1, not +1 (confidence already leaves EOS out)."""
    import torch

    from fairseq_headprune.analysis import head_functions as hf

    pad, eos = 1, 2
    src = torch.tensor([[pad, 10, 11, 12, eos]])  # left-padded, EOS last, as fairseq batches
    n = src.size(1)
    w = torch.zeros(1, 1, n, n)
    for q in (1, 2):
        w[0, 0, q, q + 1] = 1.0  # ordinary +1 heads for the first two tokens
    w[0, 0, 3, 4], w[0, 0, 3, 2] = 0.9, 0.1  # the last token: EOS, then -1
    w[0, 0, 4, 3] = 1.0  # EOS as a query is not counted either way
    out = hf.positional_rare_counts(w, src, pad, eos, torch.ones(20))
    assert out["queries"] == 3
    assert out["next"] == [2] and out["prev"] == [1]
    # rare: the argmax leaves EOS out too, so the last token's maximum is token 11, the rarest (as the first's)
    counts = torch.ones(20)
    counts[11] = 0.5
    assert hf.positional_rare_counts(w, src, pad, eos, counts)["rare"] == [2]


# ------------------------------------------------------------------------- importance: loss scale, per token
@pytest.fixture(scope="module")
def stock(stock_checkpoint, tiny_data):
    from helpers import load_stock

    return load_stock(stock_checkpoint, tiny_data)


def _importance(model, task, batch, backward=lambda loss: loss.backward(), per_position=False):
    from fairseq_headprune.criterions.head_importance import HeadImportanceCriterion

    criterion = HeadImportanceCriterion(task, sentence_avg=False, **({"per_position": True} if per_position else {}))
    loss, _, _ = criterion(model, batch)
    backward(loss)
    criterion.accumulate()
    return criterion.accumulator


def _maskable_frozen(model):
    import copy

    from fairseq_headprune.core.masking import install_head_masks

    model = copy.deepcopy(model)
    install_head_masks(model)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def test_importance_divides_out_the_fp16_loss_scale(stock):
    """fairseq's fp16 optimizer backpropagates scaler.scale(loss) = 1024 x loss: I_h must not grow 1024-fold.
    A batch whose scaled gradients overflow is skipped (the optimizer skips it too)."""
    import torch
    from fairseq.optim.dynamic_loss_scaler import DynamicLossScaler

    from helpers import sample_batch

    model, task = stock
    model = _maskable_frozen(model)
    batch = sample_batch(task, n=4)
    plain = _importance(model, task, batch).mean()
    scaler = DynamicLossScaler(init_scale=1024.0)
    scaled = _importance(model, task, batch, backward=lambda loss: scaler.scale(loss).backward())
    for key, value in plain.items():
        torch.testing.assert_close(scaled.mean()[key], value, rtol=1e-5, atol=1e-12)
    assert scaled.sentences == 4 and scaled.skipped == 0
    overflow = _importance(model, task, batch, backward=lambda loss: (loss * float("inf")).backward())
    assert overflow.skipped == 1 and overflow.sentences == 0 and not overflow.sums


def test_per_position_importance_is_the_mean_of_per_token_absolute_gradients(stock):
    """per_position=True: sum over target tokens of |dl_t/dxi_h|, over the number of tokens; checked against
    one backward per (sentence, token) with a single shared xi. By the triangle inequality the per-token sums
    are at least the per-sentence ones, and larger wherever a head helps one token and hurts another."""
    import torch

    from fairseq_headprune.core.masking import row_head_masks
    from helpers import sample_batch

    model, task = stock
    model = _maskable_frozen(model)
    batch = sample_batch(task, n=3)
    pad = task.target_dictionary.pad()
    acc = _importance(model, task, batch, per_position=True)
    tokens = int(batch["target"].ne(pad).sum())
    assert acc.tokens == tokens == int(batch["ntokens"]) and acc.sentences == 3

    expected = {}
    for b in range(3):
        one = {k: v[b : b + 1] if torch.is_tensor(v) and v.dim() else v for k, v in batch["net_input"].items()}
        target = batch["target"][b]
        with row_head_masks(model, 1, requires_grad=True) as leaves:
            logits = model(**one)[0]
        lprobs = torch.log_softmax(logits.float(), dim=-1)[0]
        for t in range(target.size(0)):
            if target[t] == pad:
                continue
            grads = torch.autograd.grad(-lprobs[t, target[t]], list(leaves.values()), retain_graph=True)
            for key, g in zip(leaves, grads):
                expected[key] = expected.get(key, 0) + g[0].double().abs()
    mean = acc.mean()
    for key, total in expected.items():
        torch.testing.assert_close(mean[key], total / tokens, rtol=1e-4, atol=1e-9)

    sentence = _importance(model, task, batch)
    larger = 0
    for key, per_token in acc.sums.items():
        assert bool((per_token >= sentence.sums[key] * (1 - 1e-6)).all())
        larger += int((per_token > sentence.sums[key] * 1.01).sum())
    assert larger > 0


# --------------------------------------------------------------------------- masks that cannot be honoured
def _masked_attention(self_attention=True, xformers=False):
    """A small fairseq attention module with head 1 masked; `xformers` marks it as xformers-configured (the
    package is not installed, so the flag is set after construction, as a built module would carry it)."""
    import torch
    from fairseq.modules.multihead_attention import MultiheadAttention

    from fairseq_headprune.core.masking import HeadMaskedMultiheadAttention

    torch.manual_seed(0)
    attn = MultiheadAttention(8, 2, self_attention=self_attention, encoder_decoder_attention=not self_attention)
    attn = HeadMaskedMultiheadAttention.convert(attn).eval()
    attn.use_xformers = xformers
    return attn, torch.randn(5, 3, 8)


def test_mask_with_before_softmax_raises_instead_of_being_ignored():
    """before_softmax=True returns logits and values before per-head outputs exist: the mask cannot apply.
    Unmasked, the call is stock; masked, it stops with UnsupportedMaskError (a UserError and a ValueError),
    also when before_softmax is passed positionally."""
    import torch
    from fairseq.modules.multihead_attention import MultiheadAttention

    from fairseq_headprune.errors import UserError
    from fairseq_headprune.core.masking import UnsupportedMaskError

    attn, x = _masked_attention()
    stock = MultiheadAttention(8, 2, self_attention=True).eval()
    stock.load_state_dict(attn.state_dict())
    unmasked, _ = attn(x, x, x, before_softmax=True)  # no mask: whatever stock fairseq returns
    assert torch.equal(unmasked, stock(x, x, x, before_softmax=True)[0])
    attn.head_mask[0] = 0
    with pytest.raises(UnsupportedMaskError, match="before_softmax"):
        attn(x, x, x, before_softmax=True)
    with pytest.raises(UnsupportedMaskError):
        attn(x, x, x, None, None, True, False, None, True)  # need_weights, static_kv, attn_mask, before_softmax
    assert issubclass(UnsupportedMaskError, UserError) and issubclass(UnsupportedMaskError, ValueError)
    out, _ = attn(x, x, x)  # an ordinary call still honours the mask
    assert out.shape == x.shape


def test_mask_on_an_xformers_module_is_not_rerouted(monkeypatch):
    """Unmasked, an xformers-configured module takes xformers, as stock fairseq; masked, the call stops
    instead of silently running fairseq's Python attention in its place. Calls that stock fairseq itself runs
    on the Python path (incremental decoding) are masked as usual."""
    from fairseq.modules.multihead_attention import MultiheadAttention

    from fairseq_headprune.core.masking import UnsupportedMaskError

    attn, x = _masked_attention(xformers=True)
    calls = []
    monkeypatch.setattr(MultiheadAttention, "_xformers_attn_forward",
                        lambda self, *a, **k: calls.append("xformers") or (a[0], None))
    attn(x, x, x)
    assert calls == ["xformers"]
    attn.head_mask[1] = 0
    with pytest.raises(UnsupportedMaskError, match="xformers"):
        attn(x, x, x)
    assert calls == ["xformers"]
    state = {}
    out, _ = attn(x[:1], x[:1], x[:1], incremental_state=state)  # a decoding step: Python path in stock too
    assert out.shape == (1, 3, 8) and calls == ["xformers"]


# ---------------------------------------------------------------------------------- bootstrap resample size
def test_bootstrap_resamples_have_the_size_sample_ratio_asks():
    """compare-mt draws int(n x sample_ratio) sentences per resample: 10 sentences give 5 at 0.5 (compare-mt's
    default), 2 at 0.25, 10 at 1.0, the constructor's default (existing results stay reproducible). The resamples
    are scored from `resample_ids` (tests/test_stats.py: each resample's BLEU is sacreBLEU's on those ids)."""
    import inspect

    from fairseq_headprune.stats import BleuBootstrap

    refs = [f"a b c d e {i}" for i in range(10)]
    hyps = [f"a b c x e {i}" for i in range(10)]
    assert inspect.signature(BleuBootstrap).parameters["sample_ratio"].default == 1.0
    for ratio, size in ((0.5, 5), (0.25, 2), (1.0, 10)):
        boot = BleuBootstrap(refs, refs, samples=3, sample_ratio=ratio)
        boot.test(hyps)
        assert boot.resample_ids.shape == (3, size)
    assert BleuBootstrap(refs, refs, samples=3).resample_ids.shape == (3, 10)
    with pytest.raises(ValueError):
        BleuBootstrap(refs, refs, sample_ratio=0.0)


# ------------------------------------------------------------------------------------------------- claims
def _single(types_drops, n=8):
    """Single-head ablation rows: for each type, n heads of layer 1, the first `drops` significant drops."""
    rows = [{"key": "baseline", "bleu": 30.0}]
    for t, drops in types_drops.items():
        for i in range(n):
            delta = -1.0 if i < drops else 0.0
            rows.append({"key": f"{t}:1:{i + 1}", "type": t, "layer": 1, "head": i + 1, "bleu": 30.0 + delta,
                         "delta": delta, "significant": i < drops})
    return rows


def test_c1_verdict_follows_encoder_self_attention_with_the_pooled_share_beside():
    from fairseq_headprune.report import claims as cl

    # enc-self 5 of 8 removable (62%), all 16 heads: 5 of 16 (31%): the paper's scope decides
    claim = cl.claim_single_heads(_single({"enc-self": 3, "enc-dec": 8}), 16)
    assert claim.verdict == cl.SUPPORTED
    assert claim.ours.startswith("enc-self: 5 of 8 heads removable (62%") and "all types: 5 of 16" in claim.ours
    # enc-self exactly half (not more), all types 12 of 16
    claim = cl.claim_single_heads(_single({"enc-self": 4, "dec-self": 0}), 16)
    assert claim.verdict == cl.NOT_SUPPORTED and "all types: 12 of 16 heads removable (75%)" in claim.ours
    # no enc-self rows: the pooled share decides
    assert cl.claim_single_heads(_single({"enc-dec": 3}), 8).verdict == cl.SUPPORTED


def test_c3_quotes_the_papers_numbers_exactly():
    from fairseq_headprune.report import claims as cl

    assert "20% (WMT)" in cl.CLAIM_TEXT["C3"] and "40% (BERT)" in cl.CLAIM_TEXT["C3"]
    assert "60" not in cl.CLAIM_TEXT["C3"] and "20-" not in cl.CLAIM_TEXT["C3"]


def _speed(unpruned, masked, pruned, std=1.0, same=True, equal_work=True):
    def model(rate):
        return {"sentences_per_s": rate, "sentences_per_s_std": std, "tokens_per_s": 10 * rate}

    row = {"unpruned": model(unpruned), "masked": model(masked), "pruned": model(pruned)}
    row["pruned"]["speedup"] = pruned / unpruned
    if equal_work:
        row["pruned"].update(speedup_over_masked=pruned / masked, speedup_over_masked_std=0.01,
                             same_tokens_as_masked=same)
    return {"heads_pruned": 72, "heads_total": 144, "batch_sizes": {"1": row, "64": row}, "flop_ratio": 1.28}


def test_c6_is_judged_at_equal_work_only():
    """Pruned vs masked (same function, same hypotheses); a free-length speed-up over the unpruned model does not
    count, and a speed.json without the equal-work figure is incomplete, never judged on the free-length one."""
    from fairseq_headprune.report import claims as cl

    # 111 - 1 > 100 + 1 against the unpruned model, but not against the masked model (110 + 1)
    claim = cl.claim_speed(_speed(100.0, 110.0, 111.0))
    assert claim.verdict == cl.NOT_SUPPORTED and "equal-work" in claim.rule + claim.ours
    assert "batch 64: x1.01±0.01" in claim.ours and "FLOP ratio x1.28" in claim.ours
    assert cl.claim_speed(_speed(100.0, 100.0, 102.01)).verdict == cl.SUPPORTED
    assert cl.claim_speed(_speed(100.0, 100.0, 102.0)).verdict == cl.NOT_SUPPORTED  # 101 == 101
    free_length_only = cl.claim_speed(_speed(100.0, 100.0, 179.0, equal_work=False), "fairseq-headprune speed X")
    assert free_length_only.verdict == cl.INCOMPLETE and free_length_only.command == "fairseq-headprune speed X"
    assert cl.claim_speed(_speed(100.0, 100.0, 150.0, same=False)).verdict == cl.INCOMPLETE
    # the copy ratio is quoted beside the FLOP ratio when speed.json has it
    with_copies = {**_speed(100.0, 100.0, 150.0), "reorder_ratio": 1.6}
    assert "FLOP ratio x1.28, cache-reorder copy ratio x1.60" in cl.claim_speed(with_copies).ours


def _l0(lam, kept, bleu, updates=300, enc_closed=None, total=144, types=("enc-self", "enc-dec", "dec-self")):
    point = {"method": "l0", "lambda": lam, "updates": updates, "types": list(types), "heads_kept": kept,
             "heads_total": total, "bleu": bleu, "kept_per_type": None, "closed_per_type": None}
    if enc_closed is not None:
        closed = total - kept
        rest = closed - enc_closed
        point["closed_per_type"] = {"enc-self": enc_closed, "enc-dec": rest // 2, "dec-self": rest - rest // 2}
        point["kept_per_type"] = {t: total // 3 - point["closed_per_type"][t] for t in point["closed_per_type"]}
    return point


FULL = {"method": "unpruned", "lambda": None, "updates": None, "types": None, "heads_kept": 144,
        "heads_total": 144, "bleu": 30.0, "kept_per_type": None, "closed_per_type": None}


def test_v_compares_with_the_lambda_0_control_of_the_same_updates():
    """The λ = 0 control fine-tuned as long gains 1.7 BLEU: against it λ = 0.008 loses 1.9, not 0.2."""
    from fairseq_headprune.report import claims as cl

    points = [FULL, _l0(0.0, 144, 31.7), _l0(0.008, 68, 29.8)]
    claim = cl.claim_voita(points)
    assert claim.verdict == cl.NOT_SUPPORTED
    assert "BLEU 29.80 vs 31.70 (-1.90) against the λ = 0 control" in claim.ours
    assert "un-fine-tuned model 30.00 (-0.20)" in claim.ours
    # a run of another length has no control of its own: the un-fine-tuned model is its baseline, and says so
    points.append(_l0(0.01, 60, 29.9, updates=600))
    claim = cl.claim_voita(points)
    assert claim.verdict == cl.SUPPORTED and "84 of 144 heads closed (λ=0.01, 600 updates)" in claim.ours
    assert "against the un-fine-tuned model (no λ = 0 control" in claim.ours


def test_v_judges_encoder_heads_and_reports_all_types_separately():
    """Voita's 38 of 48 is encoder heads: 80 of 144 closed (56%) with 20 of 48 encoder heads (42%) is not
    support; 25 of 48 encoder heads is."""
    from fairseq_headprune.report import claims as cl

    claim = cl.claim_voita([FULL, _l0(0.0, 144, 30.0), _l0(0.01, 64, 29.9, enc_closed=20)])
    assert claim.verdict == cl.NOT_SUPPORTED
    assert claim.ours.startswith("encoder self-attention: 20 of 48 encoder self-attention heads closed")
    assert "all types: 80 of 144 heads closed" in claim.ours
    claim = cl.claim_voita([FULL, _l0(0.0, 144, 30.0), _l0(0.01, 100, 29.9, enc_closed=25)])
    assert claim.verdict == cl.SUPPORTED and "25 of 48 encoder self-attention heads closed" in claim.ours


def test_l0_points_carry_updates_types_and_per_type_counts(tmp_path):
    import json

    from fairseq_headprune.report import claims as cl

    rows = [{"header": {"command": "compare", "total_heads": 144}},
            {"key": "baseline", "method": "unpruned", "heads_kept": 144, "bleu": 36.7},
            {"key": "l0:0", "method": "l0", "l0_lambda": 0.0, "updates": 300, "types": ["enc-self"],
             "heads_kept": 144, "kept_per_type": {"enc-self": 48, "enc-dec": 48, "dec-self": 48}, "masked": "",
             "bleu": 38.4},
            {"key": "l0:ab", "method": "l0", "l0_lambda": 0.05, "updates": 300, "types": ["enc-self"],
             "heads_kept": 134, "kept_per_type": {"enc-self": 38, "enc-dec": 48, "dec-self": 48},
             "masked": "enc-self:1:1-8,enc-self:2:1+2", "bleu": 38.3}]
    path = tmp_path / "compare.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    points = cl.l0_points(str(path))
    assert points[2]["updates"] == 300 and points[2]["types"] == ["enc-self"]
    assert points[2]["closed_per_type"] == {"enc-self": 10, "enc-dec": 0, "dec-self": 0}
    assert points[1]["closed_per_type"] == {"enc-self": 0, "enc-dec": 0, "dec-self": 0}
    claim = cl.claim_voita(points)
    assert "10 of 48 encoder self-attention heads closed" in claim.ours and "vs 38.40 (-0.10)" in claim.ours
    assert claim.verdict == cl.NOT_SUPPORTED  # 21% of the encoder heads
