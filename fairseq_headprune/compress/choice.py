"""The choice of compress --speedup: which shape (heads per stack, the decoder's depth, the FFNs' share) to build, as
plain functions on shape points and the model, apart from the stage that calls them (compress.stages.choice).

A point is a dict {enc_heads, dec_heads[, dec_layers][, ffn_percent]} with the fields the choice adds as it goes
(predicted_speedup from the cost table, fisher_estimate and heads from fisher_choice, depth_nll, measured_speedup,
calibration_nll). The order: the Fisher estimate ranks shapes within a depth, the calibration NLL of each depth's
best shape ranks the depths (candidate_order); the first few are timed as crude slices, a shape that missed the
target has its half-FFN variant timed next (ffn_variants), a depth whose timed shapes all missed it gets its next
shape (retime_candidates), and of those that measured the target the lowest calibration NLL after shrink's
closed-form fits wins (reconstructed_nll, pick_measured).
"""
from __future__ import annotations

import copy
import math
from typing import Callable, Dict, List, Optional, Tuple

from fairseq_headprune.prune import layers, levers, select, shrink
from fairseq_headprune.prune.shrink_options import Budget
from fairseq_headprune.core.heads import Head, HeadLayout, format_head_spec, parse_head_spec
from fairseq_headprune.core.masking import head_masks
from fairseq_headprune.core.surgery import remove_layers


HEADS_AND_DEPTH = ("enc_heads", "dec_heads", "dec_layers")  # what the choice ranks (the FFN share: timed after)
SHAPE_FIELDS = HEADS_AND_DEPTH + ("ffn_percent", "enc_layers")  # what a point sets (the others: its scores)


def per_stack_points(model) -> List[Dict[str, int]]:
    """Every per-stack shape with at least one head removed, as cost-table points {enc_heads, dec_heads}."""
    layout = HeadLayout.of(model)
    points = []
    for shape in select.per_stack_shapes(layout.heads):
        if select.removed_count(layout.heads, shape):
            points.append({"enc_heads": shape["encoder"], "dec_heads": shape["decoder"]})
    return points


def lever_points(model) -> List[Dict]:
    """Every point the choice moves: the per-stack shapes at the model's depth (per_stack_points), every per-stack
    shape (none removed included) at every shallower decoder depth {enc_heads, dec_heads, dec_layers}, and each of
    these shapes (the unpruned one included) with every FFN at each value the FFN lever is measured at
    {..., ffn_percent}."""
    shapes = select.per_stack_shapes(HeadLayout.of(model).heads)  # a shallower model's layers hold the same heads
    depth = len(model.decoder.layers)
    heads_and_depth = per_stack_points(model) + [{"enc_heads": s["encoder"], "dec_heads": s["decoder"],
                                                  "dec_layers": d} for d in range(depth - 1, 0, -1) for s in shapes]
    whole = {"enc_heads": max(s["encoder"] for s in shapes), "dec_heads": max(s["decoder"] for s in shapes)}
    return heads_and_depth + [{**p, "ffn_percent": float(v)} for v in levers.FFN.values(100)
                              for p in [whole] + heads_and_depth]


def shapes_reaching(points: List[Dict], target: float) -> List[Dict]:
    """The shapes the choice ranks (heads and depth, every FFN whole), each with its half-FFN variant's prediction
    (`ffn_predicted_speedup`): those predicted to reach the target as they are; none doing so, those whose FFN
    variant is (the FFNs alone among them: the unpruned heads and depth). Which FFN units go is not ranked with the
    heads: a shape's variant is timed (ffn_variants) and compared by its NLL after shrink's fits
    (reconstructed_nll)."""
    def shape(p):
        return tuple(p.get(f) for f in HEADS_AND_DEPTH)

    ffn = {shape(p): p["predicted_speedup"] for p in points if "ffn_percent" in p}
    whole = {shape(p): p for p in points if "ffn_percent" not in p}
    as_they_are = [{**p, "ffn_predicted_speedup": ffn.get(key, p["predicted_speedup"])} for key, p in whole.items()
                   if p["predicted_speedup"] >= target]
    if as_they_are:
        return as_they_are
    for key in ffn:
        whole.setdefault(key, {f: v for f, v in zip(HEADS_AND_DEPTH, key) if v is not None} |
                         {"predicted_speedup": 1.0})
    return [{**p, "ffn_predicted_speedup": ffn[key]} for key, p in whole.items()
            if key in ffn and ffn[key] >= target]


def as_timed(point: Dict, target: float) -> Dict:
    """What is timed of a shape: itself, or its half-FFN variant when only that is predicted to reach the target."""
    return point if "ffn_percent" in point or point["predicted_speedup"] >= target else with_ffn(point)


def kept_by_depth(steps: List[Dict], depth: int, depths) -> Dict[int, List[int]]:
    """The decoder layers kept at each depth, from the steps of shrink's greedy removal (layers.select_by_loss,
    down to the shallowest): at depth d, every layer but the first depth - d removed. The same layers a greedy
    run down to d alone removes: each step reads only the layers left."""
    removed = [int(step["removed"].split(":")[1]) for step in steps]
    return {d: [i for i in range(1, depth + 1) if i not in removed[:depth - d]] for d in depths}


TIMED_AGAIN = 4  # candidates (besides the fastest) whose crude slices the choice times again


def choice_rank(point: Dict) -> Tuple[float, float, float]:
    """The order the choice tries the candidates in: the depths by the calibration NLL of their best shape, then
    the Fisher estimate within a depth (comparable there only), the faster first."""
    return point.get("depth_nll", 0.0), point["fisher_estimate"], -point["predicted_speedup"]


def removes_more(point: Dict, other: Dict) -> bool:
    """`point` removes all `other` removes and more: no more heads kept in either stack, no more decoder layers (a
    depth's layers are nested in the deeper ones': one greedy order), no more FFN units, and not the same shape."""
    mine, theirs = ([p.get(f, math.inf) for f in SHAPE_FIELDS] for p in (point, other))
    return mine != theirs and all(m <= t for m, t in zip(mine, theirs))


def candidate_order(points: List[Dict]) -> List[Dict]:
    """The candidates as the choice tries them: the shapes no other candidate removes less than first, each group
    by choice_rank. The joint Fisher estimate Σ_x (Σ_removed g_x,h)² can fall when heads whose gradients cancel
    are added; a shape that removes more than another one that also reaches the target is tried only after it."""
    return sorted(points, key=lambda p: (any(removes_more(p, q) for q in points), choice_rank(p)))


def fisher_choice(model, grads, points: List[Dict]) -> List[Dict]:
    """Each point's heads (every layer's, in the greedy order of its Fisher block, as shrink's per-stack fill) and
    the Fisher estimate of the loss increase of removing them all: Σ_x (Σ_removed g_x,h)²."""
    import torch

    layout = HeadLayout.of(model)
    orders = {k: select.layer_removal_order(g) for k, g in grads.items()}
    out = []
    for point in points:
        kept = {"encoder": point["enc_heads"], "decoder": point["dec_heads"]}
        columns = [(k, i) for k in grads for i in orders[k][:len(layout.heads[k]) - kept[select.stack_of(k)]]]
        estimate = float((torch.stack([grads[k][:, i] for k, i in columns], 1).sum(1) ** 2).sum()) if columns else 0.
        heads = sorted(Head(k[0], k[1], layout.heads[k][i]) for k, i in columns)
        out.append({**point, "fisher_estimate": estimate, "heads_removed": len(heads),
                    "heads": format_head_spec(heads)})
    return out


def masked_nll(model, heads: str, samples, pad: int) -> float:
    """The calibration NLL of the model with these heads masked (a head spec; "" for none), its masks as they were
    after."""
    with head_masks(model, parse_head_spec(heads) if heads else []):
        return round(layers.calibration_loss(model, samples, pad), 6)


def reconstructed_nll(model, point: Dict, calibration, options, pad: int) -> float:
    """A candidate's calibration NLL as shrink's closed-form fits leave it (`options`: shrink's, no window fit): its
    decoder layers removed, its heads masked, its FFN units removed (mask Fisher, after the heads), every changed
    sublayer refit towards the unpruned model. The measure the pick compares shapes by: a narrowed FFN's refit takes
    back most of what removing its units costs, so an NLL before any fit misjudges the FFN lever against the others
    (after recovery, a narrowed FFN costs little valid loss: results/compress-de-en)."""
    kept = point.get("layers_kept")
    cut = remove_layers(copy.deepcopy(model), kept) if kept else model
    selection = shrink.Selection(parse_head_spec(point["heads"]) if point["heads"] else [], "the choice's", False,
                                 Budget("remove", 0.0, False))
    student = shrink.build_student(cut, selection, calibration, options, pad, teacher=model if kept else None,
                                   kept_layers=kept).student
    return round(layers.calibration_loss(student, calibration.samples, pad), 6)


def with_ffn(point: Dict) -> Dict:
    """The point's variant with every FFN narrowed to the FFN lever's share, priced by its own slice once timed."""
    return {**{k: v for k, v in point.items() if k not in ("measured_speedup", "measured_interval", "timing_load")},
            "ffn_percent": float(levers.FFN.values(100)[-1]),
            "predicted_speedup": point.get("ffn_predicted_speedup", point["predicted_speedup"])}


def ffn_variants(timed: List[Dict], target: float) -> List[Dict]:
    """The FFN variants to time next: of every shape just timed that keeps its FFNs whole and measured below the
    target. The cost table prices the FFN on the whole model, where it holds a smaller share of the time than in a
    cut decoder, where the FFNs buy more than the whole model's row says: its own slice
    prices it where it is cut."""
    return [with_ffn(p) for p in timed if "ffn_percent" not in p and p["measured_speedup"] < target]


MARGIN = 0.03  # a slice must clear the target by this share to be taken when any does: the timing's noise


def pick_measured(timed: List[Dict], target: float, nll: Callable[[Dict], float]) -> Tuple[Dict, bool]:
    """Of the timed candidates whose `measured_speedup` clears the target by MARGIN (none doing so: reaches it),
    the lowest `nll` (recorded as `calibration_nll`; computed only when several are eligible), and True; none
    reaching it, the fastest, and False. The lowest-loss shape among those that reach the target is the slowest, the
    likeliest to measure below it once built. Slices and
    their models usually differ by a few percent, now and then by more (docs/compress.md, Limits;
    results/compress-de-en): the margin covers the usual noise, not every case."""
    reached = [p for p in timed if p["measured_speedup"] >= target]
    if not reached:
        return max(timed, key=lambda p: p["measured_speedup"]), False
    clear = [p for p in reached if p["measured_speedup"] >= target * (1 + MARGIN)] or reached
    if len(clear) > 1:
        for p in clear:
            p["calibration_nll"] = nll(p)
    return min(clear, key=lambda p: p.get("calibration_nll", 0.0)), True


RETIMED_ROUNDS = 2  # further timing rounds for depths whose timed shapes all measured below the target


def retime_candidates(scored: List[Dict], timed: List[Dict], target: float) -> List[Dict]:
    """The shapes to time next: at each decoder depth whose timed shapes all measured below the target, the first
    one in the choice's order, not timed yet, whose predicted speed-up scaled by that depth's measured/predicted
    ratio (the least of its timed shapes) reaches the target. The cost table sums lever costs measured one at a
    time, and it can overrate a depth cut with heads (a shallow decoder keeping most of its heads can measure below
    its prediction); without this the choice leaves such a depth for the next one instead of trying fewer heads."""
    ratio: Dict[Optional[int], float] = {}
    reached = set()
    for p in timed:
        depth = p.get("dec_layers")
        ratio[depth] = min(ratio.get(depth, math.inf), p["measured_speedup"] / p["predicted_speedup"])
        if p["measured_speedup"] >= target:
            reached.add(depth)
    labels = {label(p) for p in timed}
    out = []
    for depth in ratio.keys() - reached:
        for p in candidate_order([q for q in scored if q.get("dec_layers") == depth]):
            if (label(as_timed(p, target)) not in labels
                    and max(p["predicted_speedup"], p.get("ffn_predicted_speedup", 0.0)) * ratio[depth] >= target):
                out.append(as_timed(p, target))
                break
    return sorted(out, key=choice_rank)


def moved_levers(points: List[Dict], whole: Dict[str, int]) -> List[str]:
    """The names of the levers some candidate sets below the whole (what the choice chose among)."""
    return [lever.name for lever in levers.LEVERS
            if any(lever.field in p and p[lever.field] < whole.get(lever.field, 100.0) for p in points)]


def fisher_frontier(points: List[Dict]) -> List[Dict]:
    """The shapes no other beats on both predicted speed and Fisher estimate (lower is better), fastest first."""
    frontier: List[Dict] = []
    for p in sorted(points, key=lambda p: (-p["predicted_speedup"], p["fisher_estimate"])):
        if not frontier or p["fisher_estimate"] < frontier[-1]["fisher_estimate"]:
            frontier.append(p)
    return frontier


def label(point: Dict) -> str:
    heads = f"{point['enc_heads']}/{point['dec_heads']}"
    heads = heads if "enc_layers" not in point else f"{heads}, encoder {point['enc_layers']} layers"
    heads = heads if "dec_layers" not in point else f"{heads}, decoder {point['dec_layers']} layers"
    return heads if "ffn_percent" not in point else f"{heads}, FFN {point['ffn_percent']:g}%"
