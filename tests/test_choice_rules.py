"""The choice's rules as plain functions on shape points (compress.choice, prune.levers): which shapes are timed
again, which measured shape is taken, how the cost table's noise is pooled."""
from __future__ import annotations

import pytest
from fairseq_headprune.prune import levers
from fairseq_headprune.errors import UserError


def test_smoothing_pools_timing_noise():
    def rows(p_last=0.001):
        sign = [{"p": 0.001}, {"p": 0.001}, {"p": p_last}]
        return [{"field": "dec_heads", "value": v, "time_saved": t, "sign_test": s}
                for (v, t), s in zip(((1, 0.30), (2, 0.35), (3, 0.05)), sign)]

    monotone = rows()
    levers.smooth(monotone)
    assert [r["saved"] for r in monotone] == [0.325, 0.325, 0.05]  # keeping fewer heads never saves less
    noise = rows(p_last=0.3)  # a saving no more often faster than slower counts for nothing
    levers.smooth(noise)
    assert [r["saved"] for r in noise] == [0.325, 0.325, 0.0]
    levers.smooth(noise, significance=1.0)
    assert noise[2]["saved"] == 0.05
    assert levers.sign_test([2, 2, 2, 2, 2], [1, 1, 1, 1, 1]) == {"faster_batches": 5, "batches": 5, "p": 0.03125}
    assert levers.sign_test([2, 1, 2, 1], [1, 2, 1, 2])["p"] == 0.6875
    with pytest.raises(UserError, match="no shape reaches it"):
        levers.refuse_unreachable(9.0, ({"enc_heads": 1, "dec_heads": 1}, 1.4), {"rows": [], "whole": {}}, "fairseq")


def test_of_the_shapes_timed_again_the_choice_takes_the_lowest_nll_that_measured_the_target():
    """Fisher estimates of different cut models do not compare: of the timed shapes that reach the target, the one
    whose own calibration NLL is lowest (on the bundled model at 1.3x: 8/4 and decoder 5 layers x 6 heads both
    measured it, the order had put 8/4 first), among those clearing it by the timing's noise when any does; none
    reaching it, the fastest; the NLL computed only to choose."""
    from fairseq_headprune.compress.choice import pick_measured

    def timed():
        return [{"name": "8/4", "measured_speedup": 1.45}, {"name": "6/6", "measured_speedup": 1.23},
                {"name": "5x8/6", "measured_speedup": 1.38}, {"name": "1x1/1", "measured_speedup": 4.3}]

    nll = {"8/4": 0.93, "5x8/6": 0.83, "1x1/1": 9.9}
    asked = []

    def calibration_nll(p):
        asked.append(p["name"])
        return nll[p["name"]]

    chosen, confirmed = pick_measured(timed(), 1.3, calibration_nll)
    assert (chosen["name"], confirmed, chosen["calibration_nll"]) == ("5x8/6", True, 0.83)
    assert sorted(asked) == ["1x1/1", "5x8/6", "8/4"]
    chosen, confirmed = pick_measured(timed(), 5.0, calibration_nll)
    assert (chosen["name"], confirmed) == ("1x1/1", False) and "calibration_nll" not in chosen
    asked.clear()
    chosen, confirmed = pick_measured(timed(), 2.0, calibration_nll)
    assert (chosen["name"], confirmed, asked) == ("1x1/1", True, [])
    # a slice that reaches the target by less than the timing's noise (3%) is taken only when none clears it
    chosen, confirmed = pick_measured(timed(), 1.37, calibration_nll)  # 5x8/6's 1.38x: within 3% of 1.37
    assert (chosen["name"], confirmed) == ("8/4", True)
    asked.clear()
    only = [dict(p) for p in timed() if p["name"] != "1x1/1"]
    chosen, confirmed = pick_measured(only, 1.37, calibration_nll)  # 8/4 alone clears it: no NLL needed
    assert (chosen["name"], confirmed, asked) == ("8/4", True, [])
    chosen, confirmed = pick_measured(only, 1.42, calibration_nll)  # 8/4's 1.45x: within 3%, and no other
    assert (chosen["name"], confirmed) == ("8/4", True)


def test_a_depth_whose_timed_shapes_all_missed_the_target_is_timed_again_with_fewer_heads():
    """The cost table misjudges a depth cut with heads (De-En at 2x: decoder 3 layers x 6-7 heads predicted 2.0x,
    measured 1.8x): such a depth gets its next shape whose prediction, scaled by the depth's worst measured/predicted
    ratio, reaches the target, instead of being left for the next depth; a depth that reached it, none."""
    from fairseq_headprune.compress.choice import retime_candidates

    def point(dec, fisher, speed, depth, nll):
        return {"enc_heads": 8, "dec_heads": dec, "fisher_estimate": fisher, "predicted_speedup": speed,
                "dec_layers": depth, "depth_nll": nll}

    d3 = [point(7, 1.0, 2.02, 3, 1.5), point(6, 2.0, 2.05, 3, 1.5), point(5, 3.0, 2.15, 3, 1.5),
          point(4, 4.0, 2.25, 3, 1.5), point(3, 5.0, 2.4, 3, 1.5)]
    d4 = [point(3, 1.0, 2.13, 4, 1.9), point(2, 2.0, 2.3, 4, 1.9)]
    scored = d3 + d4
    timed = [dict(d3[0], measured_speedup=1.79), dict(d3[1], measured_speedup=1.82),
             dict(d4[0], measured_speedup=2.10)]
    for t, p in zip(timed, (d3[0], d3[1], d4[0])):
        p.update(t)
    # depth 3's worst ratio 1.79 / 2.02 = 0.886: 5 heads (2.15 -> 1.905) falls short, 4 heads (2.25 -> 1.994) too,
    # 3 heads (2.4 -> 2.127) reaches 2.0; depth 4 reached the target and gets nothing
    assert retime_candidates(scored, timed, 2.0) == [d3[4]]
    assert retime_candidates(scored, timed, 1.9) == [d3[2]]  # 5 heads: 2.15 x 0.886 = 1.905
    timed.append(dict(d3[4], measured_speedup=2.2))
    d3[4].update(timed[-1])
    assert retime_candidates(scored, timed, 2.0) == []  # every depth timed reached it
    assert retime_candidates(scored, timed[:2], 3.0) == []  # no shape of the depth can reach it


def test_a_shape_that_misses_the_target_has_its_ffn_variant_timed_next():
    """The FFN lever is priced where it is cut: each shape timed with its FFNs whole that measured below the target
    gets its variant with half of every FFN timed in the next round; one that reached it, or an FFN variant, none."""
    from fairseq_headprune.compress.choice import as_timed, ffn_variants, retime_candidates, shapes_reaching

    points = [{"enc_heads": 8, "dec_heads": 3, "dec_layers": 4, "predicted_speedup": 2.1},
              {"enc_heads": 8, "dec_heads": 3, "dec_layers": 4, "ffn_percent": 50.0, "predicted_speedup": 2.3},
              {"enc_heads": 8, "dec_heads": 4, "dec_layers": 4, "predicted_speedup": 1.9},
              {"enc_heads": 8, "dec_heads": 4, "dec_layers": 4, "ffn_percent": 50.0, "predicted_speedup": 2.05},
              {"enc_heads": 8, "dec_heads": 5, "dec_layers": 4, "predicted_speedup": 1.7},
              {"enc_heads": 8, "dec_heads": 5, "dec_layers": 4, "ffn_percent": 50.0, "predicted_speedup": 1.85},
              {"enc_heads": 8, "dec_heads": 8, "ffn_percent": 50.0, "predicted_speedup": 1.1}]
    def shapes(reach):
        return [(p["dec_heads"], p["predicted_speedup"], p["ffn_predicted_speedup"]) for p in reach]

    assert shapes(shapes_reaching(points, 1.8)) == [(3, 2.1, 2.3), (4, 1.9, 2.05)]  # as they are (not 5 heads)
    assert shapes(shapes_reaching(points, 2.2)) == [(3, 2.1, 2.3)]  # none as it is: those the FFN variant takes there
    assert shapes(shapes_reaching(points[-1:], 1.05)) == [(8, 1.0, 1.1)]  # the FFNs alone
    assert shapes_reaching(points, 2.5) == []
    reach = shapes_reaching(points, 1.8)
    timed = [dict(reach[0], measured_speedup=1.95, fisher_estimate=1.0),
             dict(reach[1], measured_speedup=2.02, fisher_estimate=0.5)]
    variants = ffn_variants(timed, 2.0)
    assert [(v["dec_heads"], v["ffn_percent"], v["predicted_speedup"]) for v in variants] == [(3, 50.0, 2.3)]
    assert "measured_speedup" not in variants[0]
    assert ffn_variants([dict(variants[0], measured_speedup=1.9)], 2.0) == []
    # a depth whose FFN variant measured the target is a depth that reached it: no fewer heads timed there
    assert retime_candidates(reach, [dict(variants[0], measured_speedup=2.4)], 2.0) == []
    # a shape only its FFN variant brings to the target is timed as that variant, and not twice
    reach = [dict(p, fisher_estimate=i) for i, p in enumerate(shapes_reaching(points, 2.2))] + [
        {"enc_heads": 8, "dec_heads": 2, "dec_layers": 4, "predicted_speedup": 2.15, "ffn_predicted_speedup": 2.5,
         "fisher_estimate": 9.0}]
    first = as_timed(reach[0], 2.2)
    assert first["ffn_percent"] == 50.0 and first["predicted_speedup"] == 2.3 and as_timed(first, 2.2) is first
    again = retime_candidates(reach, [dict(first, measured_speedup=2.0)], 2.2)  # 2.0 / 2.3: 2.5 -> 2.17 < 2.2
    assert again == []
    again = retime_candidates(reach, [dict(first, measured_speedup=2.1)], 2.2)  # 2.5 x 2.1 / 2.3 = 2.28
    assert [(p["dec_heads"], p.get("ffn_percent")) for p in again] == [(2, 50.0)]


def test_a_shape_that_removes_more_than_another_candidate_is_tried_after_it():
    """The joint Fisher estimate can fall as heads whose gradients cancel are added (En-Fr: 7/3 below 8/3 at the
    same predicted speed, the encoder's heads buying nothing): the choice tries the shape that removes less first."""
    from fairseq_headprune.compress.choice import candidate_order, removes_more

    def point(enc, dec, fisher, speed, **depth):
        return {"enc_heads": enc, "dec_heads": dec, "fisher_estimate": fisher, "predicted_speedup": speed, **depth}

    whole_depth = point(8, 3, 5.0, 1.5273)
    cancelled = point(7, 3, 4.0, 1.5272)  # removes 8/3's heads and one encoder head more, a lower estimate
    faster = point(8, 2, 9.0, 1.85)
    shallow = point(8, 4, 1.0, 1.6, dec_layers=5, depth_nll=2.0)  # fewer layers, more heads: neither contains it
    shallow_fewer = point(8, 3, 0.5, 1.7, dec_layers=5, depth_nll=2.0)
    assert removes_more(cancelled, whole_depth) and removes_more(faster, whole_depth)
    assert not removes_more(whole_depth, cancelled) and not removes_more(whole_depth, dict(whole_depth))
    assert not removes_more(shallow, whole_depth) and not removes_more(whole_depth, shallow)
    assert removes_more(shallow_fewer, whole_depth) and removes_more(shallow_fewer, shallow)
    points = [cancelled, faster, shallow_fewer, shallow, whole_depth]
    assert candidate_order(points) == [whole_depth, shallow, cancelled, faster, shallow_fewer]
