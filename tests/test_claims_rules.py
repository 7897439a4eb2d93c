"""Every claim rule at its exact boundary, on synthetic rows (no model, no files): the value at the threshold
and the nearest value on the other side each get the verdict the rule states. A `>` turned into `>=`, a moved
tolerance or a shifted window flips one of these."""
import pytest

from fairseq_headprune.report import claims as cl

ALL = ["enc-self", "enc-dec", "dec-self"]


def test_thresholds_are_the_documented_ones():
    assert (cl.C3_TOLERANCE, cl.C3_MIN_PERCENT) == (0.5, 20.0)
    assert (cl.C5_MARGIN, cl.C5_WINDOW) == (10.0, (0.0, 50.0))
    assert (cl.VOITA_TOLERANCE, cl.VOITA_MIN_SHARE) == (0.25, 50.0)


# ------------------------------------------------------------------------------------------------ C1

def single_rows(n, drops, gains=0, insignificant_drops=0):
    """Encoder self-attention heads of one layer: `drops` significant drops, then significant gains, then
    insignificant drops, the rest unchanged."""
    rows = [{"key": "baseline", "bleu": 30.0}]
    for i in range(n):
        if i < drops:
            delta, significant = -1.0, True
        elif i < drops + gains:
            delta, significant = 1.0, True
        elif i < drops + gains + insignificant_drops:
            delta, significant = -2.0, False
        else:
            delta, significant = 0.0, False
        rows.append({"key": f"enc-self:1:{i + 1}", "type": "enc-self", "layer": 1, "head": i + 1,
                     "bleu": 30.0 + delta, "delta": delta, "significant": significant})
    return rows


def test_c1_boundary_is_strictly_more_than_half():
    assert cl.claim_single_heads(single_rows(8, 4), 8).verdict == cl.NOT_SUPPORTED  # 4 of 8 removable: 50%
    assert cl.claim_single_heads(single_rows(8, 3), 8).verdict == cl.SUPPORTED  # 5 of 8
    assert cl.claim_single_heads(single_rows(9, 4), 9).verdict == cl.SUPPORTED  # 5 of 9
    assert cl.claim_single_heads(single_rows(9, 5), 9).verdict == cl.NOT_SUPPORTED  # 4 of 9


def test_c1_only_significant_drops_count_against():
    # 7 significant gains and 7 large insignificant drops of 8: all removable
    assert cl.claim_single_heads(single_rows(8, 1, gains=3, insignificant_drops=4), 8).verdict == cl.SUPPORTED
    rows = single_rows(8, 4)
    rows[1]["significant"] = False  # one of the four drops is not significant: 5 of 8
    assert cl.claim_single_heads(rows, 8).verdict == cl.SUPPORTED


def test_c1_incomplete_until_every_head_is_in():
    assert cl.claim_single_heads(single_rows(7, 0), 8).verdict == cl.INCOMPLETE
    assert cl.claim_single_heads(single_rows(8, 0), 8).verdict == cl.SUPPORTED
    assert cl.claim_single_heads([{"key": "baseline", "bleu": 30.0}], 8).verdict == cl.INCOMPLETE


# ------------------------------------------------------------------------------------------------ C2

def keep_one_rows(layers, bad, heads=2):
    """`bad` of `layers` layers lose significantly with every single head; in the others the best head is fine."""
    rows = [{"key": "baseline", "bleu": 30.0}]
    for layer in range(1, layers + 1):
        for h in range(1, heads + 1):
            delta = -3.0 - h if layer <= bad else (-0.2 if h == 1 else -4.0)
            rows.append({"key": f"keep:enc-dec:{layer}:{h}", "type": "enc-dec", "layer": layer, "head": h,
                         "bleu": 30.0 + delta, "delta": delta, "significant": delta < -1})
    return rows


def test_c2_boundary_is_strictly_more_than_half_of_the_layers():
    per_layer = {("enc-dec", layer): 2 for layer in range(1, 7)}
    assert cl.claim_keep_one(keep_one_rows(6, 3), 6, heads_per_layer=per_layer).verdict == cl.NOT_SUPPORTED
    assert cl.claim_keep_one(keep_one_rows(6, 2), 6, heads_per_layer=per_layer).verdict == cl.SUPPORTED
    # the best head of a layer decides, even when another of its heads alone loses significantly
    assert cl.claim_keep_one(keep_one_rows(6, 0), 6, heads_per_layer=per_layer).ours.startswith("6 of 6 layers")


def test_c2_a_layer_counts_once_every_head_was_tried():
    per_layer = {("enc-dec", layer): 2 for layer in range(1, 7)}
    rows = keep_one_rows(6, 0)
    assert cl.claim_keep_one(rows[:-1], 6, heads_per_layer=per_layer).verdict == cl.INCOMPLETE
    assert cl.claim_keep_one(rows, 7).verdict == cl.INCOMPLETE  # a layer missing altogether


# ------------------------------------------------------------------------------------------------ C3

def curve(order, types, points):
    return [{"key": f"{order}:{p}", "order": order, "types": list(types), "percent_pruned": float(p), "bleu": b}
            for p, b in points]


def test_c3_exactly_the_tolerance_below_is_still_within():
    # 30.0 - 0.5 = 29.5 exactly (both are binary fractions)
    assert cl.prunable_percent([(0.0, 30.0), (10.0, 29.5), (20.0, 29.5), (30.0, 10.0)], 0.5) == 20.0
    assert cl.prunable_percent([(0.0, 30.0), (10.0, 29.5), (20.0, 29.4999), (30.0, 10.0)], 0.5) == 10.0
    # a dip stops the count even when BLEU recovers later
    assert cl.prunable_percent([(0.0, 30.0), (10.0, 29.0), (20.0, 30.0)], 0.5) == 0.0
    assert cl.prunable_percent([(10.0, 30.0), (20.0, 30.0)], 0.5) is None  # no unpruned point


def test_c3_exactly_the_minimum_share_is_supported():
    at_20 = cl.claim_prunable(curve("importance", ALL, [(0, 30.0), (10, 29.8), (20, 29.5), (30, 25.0)]))
    assert at_20.verdict == cl.SUPPORTED and at_20.ours.startswith("20% of heads pruned, BLEU 29.50 vs 30.00")
    below = cl.claim_prunable(curve("importance", ALL, [(0, 30.0), (10, 29.8), (20, 29.4999), (30, 25.0)]))
    assert below.verdict == cl.NOT_SUPPORTED and below.ours.startswith("10% of heads pruned")
    # 19.9% (a step that is not a round number) is below the minimum
    odd = cl.claim_prunable(curve("importance", ALL, [(0, 30.0), (19.9, 29.6), (25, 20.0)]))
    assert odd.verdict == cl.NOT_SUPPORTED


def test_c3_reads_only_the_whole_model_importance_curve():
    rows = (curve("importance", ALL, [(0, 30.0), (10, 29.0), (20, 29.0)])
            + curve("importance", ["enc-self"], [(0, 30.0), (10, 30.0), (20, 30.0), (30, 30.0)])
            + curve("random", ALL, [(0, 30.0), (10, 30.0), (20, 30.0), (30, 30.0)]))
    claim = cl.claim_prunable(rows)
    assert claim.verdict == cl.NOT_SUPPORTED and claim.ours.startswith("0% of heads pruned")
    assert "random order: 30%" in claim.ours


# ------------------------------------------------------------------------------------------------ C4

def test_c4_means_over_shared_levels_only():
    rows = (curve("importance", ["enc-self"], [(0, 30.0), (50, 20.0), (100, 0.0)])
            + curve("importance", ["dec-self"], [(0, 30.0), (50, 22.0), (100, 0.0)])
            # enc-dec is worse only at a level the other two curves lack: it must not count
            + curve("importance", ["enc-dec"], [(0, 30.0), (25, 0.0), (50, 24.0), (100, 0.0)]))
    sensitivity = cl.type_sensitivity_from_pruning(rows)
    assert sensitivity == {"enc-self": pytest.approx(50 / 3), "dec-self": pytest.approx(52 / 3),
                           "enc-dec": pytest.approx(54 / 3)}
    assert cl.claim_enc_dec_sensitive(rows, None).verdict == cl.NOT_SUPPORTED
    rows[-2]["bleu"] = 19.9  # enc-dec at 50%: now the lowest mean, by 0.1 BLEU / 3
    assert cl.claim_enc_dec_sensitive(rows, None).verdict == cl.SUPPORTED


def test_c4_needs_two_shared_levels_then_falls_back_to_single_heads():
    rows = (curve("importance", ["enc-self"], [(0, 30.0), (50, 20.0)])
            + curve("importance", ["dec-self"], [(0, 30.0), (50, 22.0)])
            + curve("importance", ["enc-dec"], [(0, 30.0), (40, 1.0)]))
    assert cl.type_sensitivity_from_pruning(rows) is None  # only 0% is shared
    single = [{"key": "baseline", "bleu": 30.0}] + [
        {"key": f"{t}:1:1", "type": t, "layer": 1, "head": 1, "delta": d, "bleu": 30.0 + d, "significant": False}
        for t, d in (("enc-self", -0.30), ("enc-dec", -0.25), ("dec-self", -0.10))]
    claim = cl.claim_enc_dec_sensitive(rows, single)
    assert claim.verdict == cl.NOT_SUPPORTED and "single-head" in claim.rule


# ------------------------------------------------------------------------------------------------ C5

def dynamics_rows(first, last, first_at_50=None, last_at_50=None):
    """Three epochs pruned at 0, 10, ..., 60%: the first and last epochs keep `first` / `last` % of their BLEU
    over 10-40%, and first_at_50 / last_at_50 at 50%; 0% keeps 100 and 60% keeps 0 (both outside the window)."""
    rows = []
    for epoch, kept, at_50 in ((1, first, first_at_50), (2, 50.0, 50.0), (3, last, last_at_50)):
        at_50 = kept if at_50 is None else at_50
        for p, retained in ((0, 100.0), (10, kept), (20, kept), (30, kept), (40, kept), (50, at_50), (60, 0.0)):
            rows.append({"key": f"{epoch}:{p}", "epoch": epoch, "percent_pruned": float(p),
                         "bleu": retained / 4, "bleu_retained": retained})
    return rows


def test_c5_exactly_the_margin_is_supported():
    assert cl.claim_dynamics(dynamics_rows(60.0, 70.0)).verdict == cl.SUPPORTED
    assert cl.claim_dynamics(dynamics_rows(60.0, 69.99)).verdict == cl.NOT_SUPPORTED


def test_c5_window_excludes_0_and_includes_50():
    # over 10-50%: first 60, last (4 x 65 + 90) / 5 = 70 -> exactly the margin
    claim = cl.claim_dynamics(dynamics_rows(60.0, 65.0, last_at_50=90.0))
    assert claim.verdict == cl.SUPPORTED and "epoch 1 keeps 60%" in claim.ours and "epoch 3 keeps 70%" in claim.ours
    # (with 50% left out the last epoch would keep 65; with 0% or 60% let in, the difference would be 8.3)
    assert cl.claim_dynamics(dynamics_rows(60.0, 64.0, last_at_50=90.0)).verdict == cl.NOT_SUPPORTED  # 69.2
    # 60% pruned is outside: the last epoch's 0 there does not pull it down
    rows = dynamics_rows(50.0, 60.0)
    assert cl.claim_dynamics(rows).verdict == cl.SUPPORTED
    # an epoch pruned only at 0% has no step in the window
    first_only_at_0 = [r for r in dynamics_rows(50.0, 60.0) if not (r["epoch"] == 1 and r["percent_pruned"] > 0)]
    assert cl.claim_dynamics(first_only_at_0).verdict == cl.INCOMPLETE


def test_c5_compares_the_first_and_the_last_epoch_by_number():
    rows = dynamics_rows(60.0, 70.0)
    for r in rows:  # epoch numbers 2, 10, 9 given in that order: 2 is the first, 10 the last
        r["epoch"] = {1: 2, 2: 9, 3: 10}[r["epoch"]]
    claim = cl.claim_dynamics(list(reversed(rows)))
    assert claim.verdict == cl.SUPPORTED and "epoch 2 keeps 60%" in claim.ours and "epoch 10 keeps 70%" in claim.ours


# ------------------------------------------------------------------------------------------------ C6

def speed(unpruned_by_batch, pruned_by_batch, std=1.0):
    def model(rate):
        return {"sentences_per_s": rate, "sentences_per_s_std": std, "tokens_per_s": 10 * rate}

    rows = {}
    for b in unpruned_by_batch:
        rows[b] = {"unpruned": model(unpruned_by_batch[b]), "masked": model(unpruned_by_batch[b]),
                   "pruned": {**model(pruned_by_batch[b]), "speedup": pruned_by_batch[b] / unpruned_by_batch[b],
                              # equal work (what C6 reads): the masked model wrote the same tokens
                              "speedup_over_masked": pruned_by_batch[b] / unpruned_by_batch[b],
                              "speedup_over_masked_std": 0.0, "same_tokens_as_masked": True}}
    return {"heads_pruned": 4, "heads_total": 8, "batch_sizes": rows, "flop_bound_speedup": 1.3, "flop_ratio": 1.3}


def test_c6_faster_beyond_both_deviations_strictly():
    assert cl.claim_speed(speed({"64": 100.0}, {"64": 102.0})).verdict == cl.NOT_SUPPORTED  # 101 == 101
    assert cl.claim_speed(speed({"64": 100.0}, {"64": 102.01})).verdict == cl.SUPPORTED
    assert cl.claim_speed(speed({"64": 100.0}, {"64": 102.0}, std=0.0)).verdict == cl.SUPPORTED


def test_c6_reads_the_largest_batch_size_as_a_number():
    # "8" sorts after "16" as text: the largest batch is 16, where the pruned model is not faster
    result = speed({"8": 100.0, "16": 100.0}, {"8": 150.0, "16": 100.0})
    assert cl.claim_speed(result).verdict == cl.NOT_SUPPORTED
    result = speed({"8": 100.0, "16": 100.0}, {"8": 100.0, "16": 150.0})
    assert cl.claim_speed(result).verdict == cl.SUPPORTED


# ------------------------------------------------------------------------------------------------ V

def voita(*points, base=30.0, total=48):
    full = {"method": "unpruned", "lambda": None, "heads_kept": total, "heads_total": total, "bleu": base}
    return [full] + [{"method": "l0", "lambda": lam, "heads_kept": kept, "heads_total": total, "bleu": bleu}
                     for lam, kept, bleu in points]


def test_v_exactly_the_tolerance_below_is_within():
    assert cl.claim_voita(voita((0.01, 20, 29.75))).verdict == cl.SUPPORTED  # 30 - 0.25 exactly
    assert cl.claim_voita(voita((0.01, 20, 29.7499))).verdict == cl.NOT_SUPPORTED
    assert cl.claim_voita(voita((0.01, 20, 29.76))).verdict == cl.SUPPORTED


def test_v_exactly_half_closed_is_not_more_than_half():
    assert cl.claim_voita(voita((0.01, 24, 30.0))).verdict == cl.NOT_SUPPORTED  # 24 of 48 closed: 50%
    claim = cl.claim_voita(voita((0.01, 23, 30.0)))
    assert claim.verdict == cl.SUPPORTED and claim.ours.startswith("25 of 48 heads closed (λ=0.01)")


def test_v_takes_the_most_pruned_point_within_the_tolerance():
    claim = cl.claim_voita(voita((0.01, 30, 30.1), (0.05, 20, 29.8), (0.1, 10, 29.0)))
    assert claim.verdict == cl.SUPPORTED and claim.ours.startswith("28 of 48 heads closed (λ=0.05)")
    assert "BLEU 29.80 vs 30.00 (-0.20)" in claim.ours


def tuned(lam, bleu, enc_closed, enc_total=48, other_kept=96, other_closed=0, updates=300):
    """An L0 point with per-type counts (compare.jsonl's), fine-tuned for `updates` on the encoder self-attention."""
    kept = {"enc-self": enc_total - enc_closed, "enc-dec": other_kept // 2, "dec-self": other_kept // 2}
    closed = {"enc-self": enc_closed, "enc-dec": other_closed, "dec-self": 0}
    total = enc_total + other_kept + other_closed
    return {"method": "l0", "lambda": lam, "heads_kept": total - enc_closed - other_closed, "heads_total": total,
            "bleu": bleu, "updates": updates, "types": ["enc-self"], "kept_per_type": kept, "closed_per_type": closed}


def test_v_tolerance_is_measured_from_the_lambda_0_control_of_the_same_fine_tuning():
    full = {"method": "unpruned", "lambda": None, "heads_kept": 144, "heads_total": 144, "bleu": 30.0}
    control = tuned(0.0, 31.0, 0)
    assert cl.claim_voita([full, control, tuned(0.05, 30.75, 30)]).verdict == cl.SUPPORTED  # 31 - 0.25 exactly
    # 0.7 BLEU above the un-fine-tuned model, but 0.2501 below its own control
    assert cl.claim_voita([full, control, tuned(0.05, 30.7499, 30)]).verdict == cl.NOT_SUPPORTED
    # a control of another number of updates is not this model's baseline: the un-fine-tuned model is
    other = tuned(0.0, 31.0, 0, updates=600)
    assert cl.claim_voita([full, other, tuned(0.05, 29.75, 30)]).verdict == cl.SUPPORTED
    assert cl.claim_voita([full, control]).verdict == cl.INCOMPLETE  # controls only


def test_v_judges_the_encoder_share_when_points_have_per_type_counts():
    full = {"method": "unpruned", "lambda": None, "heads_kept": 144, "heads_total": 144, "bleu": 30.0}
    assert cl.claim_voita([full, tuned(0.05, 30.0, 24)]).verdict == cl.NOT_SUPPORTED  # 24 of 48: exactly half
    claim = cl.claim_voita([full, tuned(0.05, 30.0, 25)])
    assert claim.verdict == cl.SUPPORTED and "25 of 48 encoder self-attention heads closed" in claim.ours
    # more than half of all heads closed, but only half of the encoder's: not supported
    mostly_decoder = tuned(0.05, 30.0, 24, other_kept=40, other_closed=60)
    assert 100 * (1 - mostly_decoder["heads_kept"] / mostly_decoder["heads_total"]) > 50
    assert cl.claim_voita([full, mostly_decoder]).verdict == cl.NOT_SUPPORTED


def test_v_is_decided_by_the_encoder_only_sweep_when_there_is_one():
    full = {"method": "unpruned", "lambda": None, "heads_kept": 144, "heads_total": 144, "bleu": 30.0}
    # every head gated: the model that keeps BLEU closes only 10 encoder heads; gated alone, 30 of 48 close
    pooled = [full, tuned(0.0, 30.0, 0), tuned(0.01, 29.9, 10, other_kept=60, other_closed=36)]
    alone = [full, tuned(0.0, 30.1, 0), tuned(0.01, 29.9, 30), tuned(0.05, 28.0, 44)]
    assert cl.claim_voita(pooled, source="all.jsonl").verdict == cl.NOT_SUPPORTED
    claim = cl.claim_voita(pooled, source="all.jsonl", encoder_only=alone, encoder_source="enc.jsonl")
    assert claim.verdict == cl.SUPPORTED and claim.sources == ("enc.jsonl", "all.jsonl")
    assert claim.ours.startswith("encoder self-attention gated alone: 30 of 48 encoder self-attention heads closed")
    assert "All three types gated: encoder self-attention: 10 of 48" in claim.ours
    assert "vs 30.10 (-0.20) against the λ = 0 control" in claim.ours  # each sweep against its own control
    # and the other way round: the encoder-only sweep decides even when the pooled one would support the claim
    assert cl.claim_voita(alone, encoder_only=pooled).verdict == cl.NOT_SUPPORTED
    assert cl.claim_voita(None, encoder_only=alone).verdict == cl.SUPPORTED  # the pooled sweep is optional


def test_c1_judges_encoder_self_attention_heads():
    rows = single_rows(8, 4)  # enc-self: 4 of 8 removable
    for i in range(8):  # eight more heads of enc-dec, all removable: 12 of 16 pooled
        rows.append({"key": f"enc-dec:1:{i + 1}", "type": "enc-dec", "layer": 1, "head": i + 1, "bleu": 30.0,
                     "delta": 0.0, "significant": False})
    claim = cl.claim_single_heads(rows, 16)
    assert claim.verdict == cl.NOT_SUPPORTED and claim.ours.startswith("enc-self: 4 of 8 heads removable")


def test_c6_compares_with_the_masked_model_only_at_equal_work():
    result = speed({"64": 100.0}, {"64": 150.0})
    result["batch_sizes"]["64"]["masked"]["sentences_per_s"] = 149.5  # as fast as pruned within the noise
    assert cl.claim_speed(result).verdict == cl.NOT_SUPPORTED
    result["batch_sizes"]["64"]["masked"]["sentences_per_s"] = 147.99  # 150 - 1 > 147.99 + 1
    assert cl.claim_speed(result).verdict == cl.SUPPORTED
    result["batch_sizes"]["64"]["pruned"]["same_tokens_as_masked"] = False  # not equal work: no verdict
    assert cl.claim_speed(result).verdict not in (cl.SUPPORTED, cl.NOT_SUPPORTED)
