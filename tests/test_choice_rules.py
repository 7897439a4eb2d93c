"""The choice's rules as plain functions on shape points (compress.choice, prune.levers): which shapes are timed
again, which measured shape is taken, how the cost table's noise is pooled."""
from __future__ import annotations

import dataclasses

import pytest
from fairseq_headprune.prune import levers
from fairseq_headprune.errors import UserError
from fairseq_headprune.compress.choice import Candidate
from fairseq_headprune.core.shape import Shape
from fairseq_headprune.prune.vocab_map import VocabMapBound


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


def test_of_the_finalists_the_choice_takes_the_lowest_nll_whose_interval_clears_the_target():
    """Fisher estimates of different cut models do not compare: of the timed shapes whose 95% interval clears the
    target (none doing so: whose median does), the one whose own calibration NLL is lowest; none reaching it at the
    median, the fastest; the NLL computed only to choose, once per structure (the map changes the decoding, not the
    NLL), and at equal NLL the map off."""
    from fairseq_headprune.compress.choice import label, pick_measured

    def point(enc, dec, speed, low, depth=None, mapped=False):
        return Candidate(Shape(enc, dec, dec_layers=depth), mapped, measured_speedup=speed,
                         measured_interval={"ratio": speed, "low": low, "high": speed + 0.05})

    def timed():
        return [point(8, 4, 1.45, 1.40), point(6, 6, 1.23, 1.20), point(8, 6, 1.38, 1.31, depth=5),
                point(1, 1, 4.3, 4.1, depth=1)]

    deep, tiny = "8/6, decoder 5 layers", "1/1, decoder 1 layers"
    nll = {"8/4": 0.93, deep: 0.83, tiny: 9.9}
    asked = []

    def calibration_nll(c):
        asked.append(label(c))
        return nll[label(c)]

    chosen, confirmed = pick_measured(timed(), 1.3, calibration_nll)
    assert (label(chosen), confirmed, chosen.calibration_nll) == (deep, True, 0.83)
    assert sorted(asked) == ["8/4", deep]  # 1/1 at 1 layer removes more than 8/4: passed over, never scored
    # the 5-layer shape's median clears 1.35, its lower end (1.31) does not: of those whose lower end does, 8/4
    chosen, confirmed = pick_measured(timed(), 1.35, calibration_nll)
    assert (label(chosen), confirmed) == ("8/4", True)
    chosen, confirmed = pick_measured(timed(), 5.0, calibration_nll)
    assert (label(chosen), confirmed, chosen.calibration_nll) == (tiny, False, None)
    asked.clear()  # none clears 4.2 at its lower end: 1/1 does at its median, alone (no NLL needed)
    chosen, confirmed = pick_measured(timed(), 4.2, calibration_nll)
    assert (label(chosen), confirmed, asked) == (tiny, True, [])
    # the same structure with and without the map: one NLL, the map off at equal NLL
    pair = [point(8, 4, 1.45, 1.40), point(8, 4, 1.55, 1.50, mapped=True)]
    asked.clear()
    chosen, confirmed = pick_measured(pair, 1.3, calibration_nll)
    assert (asked, chosen.vocab_map, [c.calibration_nll for c in pair]) == (["8/4"], False, [0.93, 0.93])
    chosen, _ = pick_measured(pair, 1.45, calibration_nll)  # only the mapped one clears it
    assert chosen.vocab_map and chosen.record()["vocab_map"] == 1
    # a finalist that removes more than another eligible one (fewer heads, the same depth) is passed over unscored
    more = [point(8, 4, 1.45, 1.40), point(8, 2, 1.9, 1.8), point(8, 6, 2.0, 1.9, depth=2)]
    asked.clear()
    nll.update({"8/2": 0.5, "8/6, decoder 2 layers": 1.1})
    chosen, _ = pick_measured(more, 1.3, calibration_nll)
    assert sorted(asked) == ["8/4", "8/6, decoder 2 layers"] and more[1].passed_over_for == "8/4"
    assert label(chosen) == "8/4" and more[1].calibration_nll is None


def test_a_depth_whose_timed_shapes_all_missed_the_target_is_timed_again_with_fewer_heads():
    """The cost table misjudges a depth cut with heads (De-En at 2x: decoder 3 layers x 6-7 heads predicted 2.0x,
    measured 1.8x): such a depth gets its next shape whose prediction, scaled by the depth's worst measured/predicted
    ratio, reaches the target, instead of being left for the next depth; a depth that reached it, none."""
    from fairseq_headprune.compress.choice import retime_candidates

    def point(dec, fisher, speed, depth, nll):
        return Candidate(Shape(8, dec, dec_layers=depth), fisher_estimate=fisher, predicted_speedup=speed,
                         kind_nll=nll)

    d3 = [point(7, 1.0, 2.02, 3, 1.5), point(6, 2.0, 2.05, 3, 1.5), point(5, 3.0, 2.15, 3, 1.5),
          point(4, 4.0, 2.25, 3, 1.5), point(3, 5.0, 2.4, 3, 1.5)]
    d4 = [point(3, 1.0, 2.13, 4, 1.9), point(2, 2.0, 2.3, 4, 1.9)]
    scored = d3 + d4
    for c, speed in zip((d3[0], d3[1], d4[0]), (1.79, 1.82, 2.10)):
        c.measured_speedup = speed
    timed = [d3[0], d3[1], d4[0]]
    # depth 3's worst ratio 1.79 / 2.02 = 0.886: 5 heads (2.15 -> 1.905) falls short, 4 heads (2.25 -> 1.994) too,
    # 3 heads (2.4 -> 2.127) reaches 2.0; depth 4 reached the target and gets nothing
    assert retime_candidates(scored, timed, 2.0) == [d3[4]]
    assert retime_candidates(scored, timed, 1.9) == [d3[2]]  # 5 heads: 2.15 x 0.886 = 1.905
    d3[4].measured_speedup = 2.2
    timed.append(d3[4])
    assert retime_candidates(scored, timed, 2.0) == []  # every depth timed reached it
    assert retime_candidates(scored, timed[:2], 3.0) == []  # no shape of the depth can reach it


def test_the_finalists_are_the_first_of_every_ffn_share_and_map_state_and_the_fastest():
    """The joint choice: the candidates are every combination the cost table predicts to reach the target; the
    finalists timed are the first in the choice's order of each kind of cut (depth, FFN share, map) of the
    structures (depth, FFN share) that rank first, and the fastest; a kind whose timed shapes all missed the target
    gets its next shape of that kind, scaled by its own measured/predicted ratio."""
    from fairseq_headprune.compress.choice import finalists, kind, label, retime_candidates, shapes_reaching

    def point(dec, depth, fisher, speed, ffn=100.0, mapped=False):
        return Candidate(Shape(8, dec, ffn, dec_layers=depth), mapped, fisher_estimate=fisher,
                         predicted_speedup=speed, kind_nll={3: 1.5, 4: 1.2}[depth])

    points = [point(3, 4, 1.0, 2.1), point(4, 4, 0.5, 1.9), point(5, 4, 0.2, 1.7),
              point(4, 4, 0.5, 2.05, ffn=50.0), point(5, 4, 0.2, 1.95, ffn=50.0),
              point(6, 4, 0.1, 2.0, ffn=25.0), point(5, 4, 0.2, 2.02, mapped=True),
              point(2, 3, 0.3, 2.6), point(1, 3, 0.4, 2.9, ffn=25.0, mapped=True)]
    reach = [Candidate.of(p) for p in shapes_reaching([c.record() for c in points], 2.0)]  # the records' points
    assert reach == [c for c in points if c.predicted_speedup >= 2.0]
    assert "8/2, decoder 3 layers" in [label(p) for p in finalists(reach)]  # every structure: fewer than 6
    chosen = finalists(reach, structures=3)
    # the three structures that rank first (depth 4: NLL 1.2; by their first shape's Fisher estimate: FFN 25%,
    # 100%, 50%): the first shape of each of their kinds, with and without the map; and the fastest
    assert [label(p) for p in chosen] == ["8/6, decoder 4 layers, FFN 25%", "8/5, decoder 4 layers, vocabulary map",
                                          "8/4, decoder 4 layers, FFN 50%", "8/3, decoder 4 layers",
                                          "8/1, decoder 3 layers, FFN 25%, vocabulary map"]
    assert kind(chosen[-1]) == (3, 25.0, True)
    timed = [dataclasses.replace(c, measured_speedup=s) for c, s in zip(chosen, (1.9, 2.3, 1.8, 2.2, 3.4))]
    # FFN 50% at depth 4 missed (1.8 of 2.05): no other shape of its kind is predicted to reach 2.0 once scaled
    # (none left); FFN 25% missed (1.9 of 2.0) and has no other shape of its kind: nothing to time again
    assert retime_candidates(reach, timed, 2.0) == []
    more = reach + [point(2, 4, 0.9, 2.4, ffn=50.0)]
    assert [label(p) for p in retime_candidates(more, timed, 2.0)] == ["8/2, decoder 4 layers, FFN 50%"]


def test_a_shape_that_removes_more_than_another_candidate_is_tried_after_it():
    """The joint Fisher estimate can fall as heads whose gradients cancel are added (En-Fr: 7/3 below 8/3 at the
    same predicted speed, the encoder's heads buying nothing): the choice tries the shape that removes less first."""
    from fairseq_headprune.compress.choice import candidate_order, removes_more

    def point(enc, dec, fisher, speed, dec_layers=None, kind_nll=None):
        return Candidate(Shape(enc, dec, dec_layers=dec_layers), fisher_estimate=fisher, predicted_speedup=speed,
                         kind_nll=kind_nll)

    whole_depth = point(8, 3, 5.0, 1.5273)
    cancelled = point(7, 3, 4.0, 1.5272)  # removes 8/3's heads and one encoder head more, a lower estimate
    faster = point(8, 2, 9.0, 1.85)
    shallow = point(8, 4, 1.0, 1.6, dec_layers=5, kind_nll=2.0)  # fewer layers, more heads: neither contains it
    shallow_fewer = point(8, 3, 0.5, 1.7, dec_layers=5, kind_nll=2.0)
    assert removes_more(cancelled, whole_depth) and removes_more(faster, whole_depth)
    assert not removes_more(whole_depth, cancelled) and not removes_more(whole_depth, dataclasses.replace(whole_depth))
    assert not removes_more(shallow, whole_depth) and not removes_more(whole_depth, shallow)
    assert removes_more(shallow_fewer, whole_depth) and removes_more(shallow_fewer, shallow)
    points = [cancelled, faster, shallow_fewer, shallow, whole_depth]
    assert candidate_order(points) == [whole_depth, shallow, cancelled, faster, shallow_fewer]


def test_a_map_the_choice_took_is_shipped_measured_and_reported():
    """The stages after the choice read the options as shipped: the map on where the choice weighed it and took it
    (the export ships it, its identity says so), as given otherwise."""
    from fairseq_headprune.compress.options import CompressOptions
    from fairseq_headprune.compress.stages.contract import shipped
    from fairseq_headprune.compress.stages import export
    from fairseq_headprune.compress.stages.results import Choice

    options = CompressOptions(out="out", speedup=2.0)
    assert options.map_state() == "weighed" and not options.vocab_map
    took = shipped(options, Choice.of({"chosen": {"enc_heads": 8, "dec_heads": 4, "vocab_map": 1}}))
    assert took.vocab_map and "vocab_map" in export.key(took).identity() and took.map_state() == "on"
    left = shipped(options, Choice.of({"chosen": {"enc_heads": 8, "dec_heads": 4}}))
    assert left is options and "vocab_map" not in export.key(left).identity()
    # the bound the export's check holds the map to is its input: a rerun with another bound checks it again
    given = CompressOptions(out="out", speedup=2.0, vocab_map=True)
    stricter = dataclasses.replace(given, vocab_map_bound=VocabMapBound(vocab_map_max_loss=0.1))
    assert export.key(given).identity() != export.key(stricter).identity()
    assert export.key(stricter).map_options()["vocab_map_bound"].vocab_map_max_loss == 0.1
    assert "vocab_map_bound" not in export.key(left).identity() and export.key(left).map_options() == {}
    assert CompressOptions(out="out", speedup=2.0, no_vocab_map=True).map_state() == "off"
    assert CompressOptions(out="out", speedup=2.0, engine="fairseq").map_state() == "off"
    assert CompressOptions(out="out", max_bleu_loss=0.5).map_state() == "off"


def test_the_card_says_why_the_winner_won_in_two_sentences():
    """Two sentences: the winner against the target, then why it and not another that reached it."""
    from fairseq_headprune.compress.stages.choice import why_words

    def point(dec, speed, low, **learnt):
        return Candidate(Shape(8, dec), measured_speedup=speed,
                         measured_interval={"ratio": speed, "low": low, "high": speed + 0.1, "level": 0.95,
                                            "batches": 5, "rounds": 3}, **learnt)

    best = point(4, 2.1, 2.05, calibration_nll=1.02)
    runner = point(3, 2.3, 2.2, calibration_nll=1.1)
    why = why_words(best, [best, runner, point(6, 1.8, 1.7)], 2.0)
    assert why.count(". ") == 1 and "one of 3 finalists" in why and "next 8/3 at 1.1000" in why
    alone = point(4, 2.1, 2.05)
    passed = point(2, 2.6, 2.5, passed_over_for="8/4")
    assert why_words(alone, [alone, passed], 2.0).endswith("remove all it removes and more: passed over unscored.")
    slow = point(4, 1.8, 1.7)
    assert why_words(slow, [slow], 2.0).endswith("None of them reached it: it is the fastest.")


def test_a_structure_is_ranked_by_its_first_shape_with_the_map_where_it_has_one():
    """The NLL after the fits of a structure's (decoder depth, FFN share) first shape ranks it; the map lets a
    structure keep more heads at the same speed, so its first shape with the map stands for it, as the pick would
    take it; a structure with no shape with the map, by its first without."""
    from fairseq_headprune.compress.choice import label, representatives

    def point(dec, fisher, speed, ffn=100.0, mapped=False):
        return Candidate(Shape(8, dec, ffn, dec_layers=4), mapped, fisher_estimate=fisher, predicted_speedup=speed)

    scored = [point(3, 1.0, 2.1), point(5, 0.2, 2.02, mapped=True), point(4, 0.6, 2.2, mapped=True),
              point(4, 0.5, 2.05, ffn=50.0), point(3, 0.9, 2.3, ffn=50.0)]
    firsts = representatives(scored)
    assert {k: label(p) for k, p in firsts.items()} == {
        (4, 100.0): "8/5, decoder 4 layers, vocabulary map", (4, 50.0): "8/4, decoder 4 layers, FFN 50%"}


def test_a_quality_bound_probes_only_shapes_that_remove_heads():
    """--max-bleu-loss with --vocab-map: the map-only point (every head kept) is no shape to shrink and probe (it
    once reached shrink as a request with no budget); depth and FFN points are not on the Fisher frontier."""
    from fairseq_headprune.compress.stages.choice import quality_points

    whole = {"enc_heads": 8, "dec_heads": 4, "dec_layers": 3}
    points = [{"enc_heads": 8, "dec_heads": 4, "vocab_map": 1}, {"enc_heads": 7, "dec_heads": 4, "vocab_map": 1},
              {"enc_heads": 8, "dec_heads": 3}, {"enc_heads": 6, "dec_heads": 4, "dec_layers": 2},
              {"enc_heads": 6, "dec_heads": 4, "ffn_percent": 50.0}]
    candidates = [Candidate.of(p) for p in points]
    assert quality_points(candidates, whole) == candidates[1:3]
