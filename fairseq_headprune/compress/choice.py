"""The choice of compress --speedup: which shape (heads per stack, the decoder's depth, the FFNs' share, the
vocabulary map) to build, as plain functions on shape points and the model, apart from the stage that calls them
(compress.stages.choice).

A point is a dict {enc_heads, dec_heads[, dec_layers][, ffn_percent][, vocab_map]} with the fields the choice adds
as it goes (predicted_speedup from the cost table, fisher_estimate and heads from fisher_choice, kind_nll,
measured_speedup and measured_interval, verdict, calibration_nll). The candidates are every combination of the
levers the cost table predicts to reach the target (lever_points, shapes_reaching). The Fisher estimate ranks the
heads within a structure (a decoder depth and an FFN share); the calibration NLL after shrink's closed-form fits of
each structure's first shape ranks the structures (representatives, candidate_order). The finalists, the first shape
of each kind of cut (structure and map) of the KINDS_TIMED best structures, and the fastest predicted, are timed as
slices of the shape that ships (finalists); a kind whose timed shapes all missed the target gets its next shape,
scaled by what its timing read (retime_candidates); and of those whose interval clears the target, the lowest
calibration NLL after shrink's closed-form fits wins, the map taken only where it is what lets a better shape reach
the target (pick_measured).
"""
from __future__ import annotations

import copy
import math
from typing import Callable, Dict, List, Optional, Tuple

from fairseq_headprune.prune import layers, levers, select, shrink
from fairseq_headprune.prune.reconstruct import TeacherTargets
from fairseq_headprune.prune.shrink_options import Budget
from fairseq_headprune.core.heads import Head, HeadLayout, format_head_spec, parse_head_spec
from fairseq_headprune.core.surgery import remove_layers
from fairseq_headprune.engines.timing import target_verdict


HEADS_AND_DEPTH = ("enc_heads", "dec_heads", "dec_layers")  # what the Fisher estimate ranks, at a depth
SHAPE_FIELDS = HEADS_AND_DEPTH + ("ffn_percent", "enc_layers")  # what a point sets besides the map
MAP_STATES = {"off": ({},), "on": ({levers.MAP: 1},), "weighed": ({}, {levers.MAP: 1})}  # the map in the points


def per_stack_points(model) -> List[Dict[str, int]]:
    """Every per-stack shape with at least one head removed, as cost-table points {enc_heads, dec_heads}."""
    layout = HeadLayout.of(model)
    points = []
    for shape in select.per_stack_shapes(layout.heads):
        if select.removed_count(layout.heads, shape):
            points.append({"enc_heads": shape["encoder"], "dec_heads": shape["decoder"]})
    return points


def lever_points(model, vocab_map: str = "off") -> List[Dict]:
    """Every point the choice moves, jointly: each per-stack shape of heads (none removed included) at each decoder
    depth down to 1, with every FFN at each share the FFN lever is measured at (100% unmarked), and the vocabulary
    map as `vocab_map` says (MAP_STATES: "off", "on" for every point, "weighed": each point with and without it).
    A point that changes nothing is left out."""
    shapes = select.per_stack_shapes(HeadLayout.of(model).heads)  # a shallower model's layers hold the same heads
    depth = len(model.decoder.layers)
    heads = [{"enc_heads": s["encoder"], "dec_heads": s["decoder"]} for s in shapes]
    structures = heads + [{**h, "dec_layers": d} for d in range(depth - 1, 0, -1) for h in heads]
    shares = [{}] + [{"ffn_percent": float(v)} for v in levers.FFN.values(100)]
    whole = levers.stack_sizes(model)
    points = [{**p, **f, **m} for m in MAP_STATES[vocab_map] for f in shares for p in structures]
    return [p for p in points if changes_model(p, whole)]


def changes_model(point: Dict, whole: Dict[str, int]) -> bool:
    """A point removes a head, a layer or FFN units, or turns the map on."""
    return (point["enc_heads"] < whole["enc_heads"] or point["dec_heads"] < whole["dec_heads"]
            or any(f in point for f in ("dec_layers", "enc_layers", "ffn_percent", levers.MAP)))


def shapes_reaching(points: List[Dict], target: float) -> List[Dict]:
    """The candidates: the points the cost table predicts to reach the target."""
    return [p for p in points if p["predicted_speedup"] >= target]


def kind(point: Dict) -> Tuple:
    """What a point cuts besides heads: (decoder depth, FFN share, map on); its first two, the structure. The
    Fisher estimate compares shapes of one structure; a kind whose timed shapes all missed the target is timed
    again with its next shape."""
    return point.get("dec_layers"), point.get("ffn_percent", 100.0), bool(point.get(levers.MAP))


def representatives(scored: List[Dict]) -> Dict[Tuple, Dict]:
    """Each structure's first shape in the choice's order, with the map where the structure has shapes with it:
    the shape whose NLL after the fits ranks the structure (kind_nll). The map changes the decoding, not the NLL,
    and lets a structure keep more heads at the same speed, so the pick (the lowest NLL) takes a structure's shape
    with the map before the one without; ranking a structure by its shape without the map misjudged a 5-layer
    decoder with half FFNs on De-En (NLL 1.107 without, 0.997 with)."""
    mapped = {kind(p)[:2] for p in scored if p.get(levers.MAP)}
    first: Dict[Tuple, Dict] = {}
    for p in candidate_order(scored):
        if bool(p.get(levers.MAP)) == (kind(p)[:2] in mapped):
            first.setdefault(kind(p)[:2], p)
    return first


KINDS_TIMED = 6  # the structures (depth, FFN share) whose first shapes, with and without the map, are timed first


def finalists(scored: List[Dict], structures: int = KINDS_TIMED) -> List[Dict]:
    """The first timing's shapes, in the choice's order: the first (candidate_order) of every kind of cut of the
    `structures` structures that rank first (their kind_nll), and the fastest predicted. A few slices however many
    points reach the target, drawn from the structures the NLL after the fits ranks best, whatever their depth."""
    first: Dict[Tuple, Dict] = {}
    for p in candidate_order(scored):
        first.setdefault(kind(p), p)
    ranked: List[Tuple] = []
    for p in sorted(first.values(), key=choice_rank):
        if kind(p)[:2] not in ranked:
            ranked.append(kind(p)[:2])
    out = [p for p in first.values() if kind(p)[:2] in ranked[:structures]]
    fastest = max(scored, key=lambda p: p["predicted_speedup"])
    return sorted(out + ([fastest] if fastest not in out else []), key=choice_rank)


def kept_by_depth(steps: List[Dict], depth: int, depths) -> Dict[int, List[int]]:
    """The decoder layers kept at each depth, from the steps of shrink's greedy removal (layers.select_by_loss,
    down to the shallowest): at depth d, every layer but the first depth - d removed. The same layers a greedy
    run down to d alone removes: each step reads only the layers left."""
    removed = [int(step["removed"].split(":")[1]) for step in steps]
    return {d: [i for i in range(1, depth + 1) if i not in removed[:depth - d]] for d in depths}


def choice_rank(point: Dict) -> Tuple[float, float, float]:
    """The order the choice tries the candidates in: the structures by the calibration NLL after the fits of their
    first shape (kind_nll), then the Fisher estimate within a structure, the faster first."""
    return point.get("kind_nll", 0.0), point["fisher_estimate"], -point["predicted_speedup"]


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


def reconstructed_nll(model, point: Dict, calibration, options, pad: int,
                      held: Optional[TeacherTargets] = None) -> float:
    """A candidate's calibration NLL as shrink's closed-form fits leave it (`options`: shrink's, no window fit): its
    decoder layers removed, its heads masked, its FFN units removed (mask Fisher, after the heads), every changed
    sublayer refit towards the unpruned model. The measure the pick compares shapes by: a narrowed FFN's refit takes
    back most of what removing its units costs, so an NLL before any fit misjudges the FFN lever against the others
    (after recovery, a narrowed FFN costs little valid loss: results/compress-de-en). `held`: the unpruned model's
    targets on these samples (reconstruct.TeacherTargets), shared by the shapes fitted."""
    kept = point.get("layers_kept")
    cut = remove_layers(copy.deepcopy(model), kept) if kept else model
    selection = shrink.Selection(parse_head_spec(point["heads"]) if point["heads"] else [], "the choice's", False,
                                 Budget("remove", 0.0, False))
    student = shrink.build_student(cut, selection, calibration, options, pad, teacher=model if kept else None,
                                   kept_layers=kept, held=held).student
    return round(layers.calibration_loss(student, calibration.samples, pad), 6)


def timing_verdict(point: Dict, target: float) -> str:
    """engines.timing.target_verdict of a timed point (its interval; a point timed before intervals: its median)."""
    interval = point.get("measured_interval") or {"low": point["measured_speedup"],
                                                   "ratio": point["measured_speedup"]}
    return target_verdict(interval, target)


def pick_measured(timed: List[Dict], target: float, nll: Callable[[Dict], float]) -> Tuple[Dict, bool]:
    """Of the timed points whose interval's lower end clears the target (none: whose median does), the lowest `nll`
    (recorded as `calibration_nll`, computed only when several are eligible, once per structure: the map changes
    the decoding, not the NLL; a point that removes more than another eligible one is passed over, recorded as
    `passed_over_for`), the map off before on at equal NLL, then the faster; and True. None reaching it at
    the median: the fastest, and False. The map is thus taken only where it lets a shape with a lower NLL reach
    the target; what it costs in translations is checked at the export (--vocab-map-max-loss)."""
    verdicts = {label(p): timing_verdict(p, target) for p in timed}
    eligible = ([p for p in timed if verdicts[label(p)] == "met"]
                or [p for p in timed if verdicts[label(p)] != "missed"])
    if not eligible:
        return max(timed, key=lambda p: p["measured_speedup"]), False
    for p in eligible:  # one that removes all another eligible one removes, and more, cannot have the lower NLL
        kept = next((q for q in eligible if removes_more(p, q)), None)  # (as candidate_order ranks them)
        if kept is not None:
            p["passed_over_for"] = label(kept)
    eligible = [p for p in eligible if "passed_over_for" not in p]
    if len(eligible) > 1:
        computed: Dict[str, float] = {}
        for p in eligible:
            structure = structure_label(p)
            if structure not in computed:
                computed[structure] = nll(p)
            p["calibration_nll"] = computed[structure]
    return min(eligible, key=lambda p: (p.get("calibration_nll", 0.0), kind(p)[2], -p["measured_speedup"])), True


RETIMED_ROUNDS = 2  # further timing rounds for the kinds whose timed shapes all missed the target


def retime_candidates(scored: List[Dict], timed: List[Dict], target: float) -> List[Dict]:
    """The shapes to time next: of each kind (depth, FFN share, map) whose timed shapes all missed the target (the
    interval's lower end below it), the first one in the choice's order, not timed yet, whose predicted speed-up
    scaled by that kind's measured/predicted ratio (the least of its timed shapes) reaches the target. The cost
    table multiplies lever costs measured one at a time: it can overrate a deep cut that keeps most heads (a shallow
    decoder's attention holds more of its time) and underrate narrowed FFNs in a cut decoder (where they hold more
    of it); the kind's own timing corrects its next prediction."""
    ratio: Dict[Tuple, float] = {}
    reached = set()
    for p in timed:
        ratio[kind(p)] = min(ratio.get(kind(p), math.inf), p["measured_speedup"] / p["predicted_speedup"])
        if timing_verdict(p, target) == "met":
            reached.add(kind(p))
    labels = {label(p) for p in timed}
    out = []
    for cut in ratio.keys() - reached:
        for p in candidate_order([q for q in scored if kind(q) == cut]):
            if label(p) not in labels and p["predicted_speedup"] * ratio[cut] >= target:
                out.append(p)
                break
    return sorted(out, key=choice_rank)


def moved_levers(points: List[Dict], whole: Dict[str, int]) -> List[str]:
    """The names of the levers some candidate sets below the whole, or turns on (what the choice chose among)."""
    moved = [lever.name for lever in levers.LEVERS
             if any(lever.field in p and p[lever.field] < whole.get(lever.field, 100.0) for p in points)]
    return moved + ([levers.MAP_LEVER.name] if any(p.get(levers.MAP) for p in points) else [])


def fisher_frontier(points: List[Dict]) -> List[Dict]:
    """The shapes no other beats on both predicted speed and Fisher estimate (lower is better), fastest first."""
    frontier: List[Dict] = []
    for p in sorted(points, key=lambda p: (-p["predicted_speedup"], p["fisher_estimate"])):
        if not frontier or p["fisher_estimate"] < frontier[-1]["fisher_estimate"]:
            frontier.append(p)
    return frontier


def structure_label(point: Dict) -> str:
    """A point's label without the map: the shape an NLL after the fits is computed for (the map changes the
    decoding, not the NLL; a structure's heads at given counts are one Fisher order's)."""
    return label({k: v for k, v in point.items() if k != levers.MAP})


def label(point: Dict) -> str:
    heads = f"{point['enc_heads']}/{point['dec_heads']}"
    heads = heads if "enc_layers" not in point else f"{heads}, encoder {point['enc_layers']} layers"
    heads = heads if "dec_layers" not in point else f"{heads}, decoder {point['dec_layers']} layers"
    heads = heads if "ffn_percent" not in point else f"{heads}, FFN {point['ffn_percent']:g}%"
    return heads if not point.get(levers.MAP) else f"{heads}, vocabulary map"
