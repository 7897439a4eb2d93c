"""The choice of compress --speedup: which shape (heads per stack, the decoder's depth, the FFNs' share, the
vocabulary map) to build, as plain functions on candidates and the model, apart from the stage that calls them
(compress.stages.choice).

The cost table prices points, as the run's identity and records hold them: a dict {enc_heads, dec_heads[,
dec_layers][, ffn_percent][, vocab_map]} (core.shape.Shape.record and the map's flag; lever_points). The choice
weighs Candidates: a Shape, the map, and what the choice learns of it as it goes (the predicted speed-up, the
Fisher estimate and heads from fisher_choice, kind_nll, the timing, calibration_nll); `record()` is the dict its
record keeps. The candidates are every combination of the levers the cost table predicts to reach the target
(lever_points, shapes_reaching). The Fisher estimate ranks the
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
import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from fairseq_headprune.prune import layers, levers, select, shrink
from fairseq_headprune.prune.reconstruct import TeacherTargets
from fairseq_headprune.prune.shrink_options import Budget
from fairseq_headprune.core.heads import Head, HeadLayout, format_head_spec, parse_head_spec
from fairseq_headprune.core.shape import Shape
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


@dataclass
class Candidate:
    """A shape the choice weighs (`shape`; `vocab_map`: decoded with the map) and what the choice learns of it on
    the way, each None until learnt: the cost table's predicted speed-up; the heads removed (their spec and count)
    and the Fisher estimate of the loss increase (fisher_choice); the decoder layers kept (a depth cut); its
    structure's NLL after the fits (kind_nll); its timing (speed-up, interval, verdict, the load it ran under); its
    own NLL after the fits where the pick computed it, or the shape it was passed over for; with a quality bound,
    its held-out score and loss and its shrink."""
    shape: Shape
    vocab_map: bool = False
    predicted_speedup: Optional[float] = None
    fisher_estimate: Optional[float] = None
    heads_removed: Optional[int] = None
    heads: Optional[str] = None
    layers_kept: Optional[Dict] = None
    kind_nll: Optional[float] = None
    measured_speedup: Optional[float] = None
    measured_interval: Optional[Dict] = None
    verdict: Optional[str] = None
    timing_load: Optional[float] = None
    calibration_nll: Optional[float] = None
    passed_over_for: Optional[str] = None
    heldout_score: Optional[float] = None
    heldout_loss: Optional[float] = None
    shrunk: Optional[Dict] = None

    @classmethod
    def of(cls, record: Dict) -> "Candidate":
        """A candidate from the point its record keeps (a field absent: not learnt)."""
        return cls(Shape.of_record(record), bool(record.get(levers.MAP)),
                   **{name: record[name] for name in learnt_fields() if name in record})

    def record(self) -> Dict:
        """The point as the record keeps it: the shape's fields, the map's flag, what was learnt."""
        learnt = {name: getattr(self, name) for name in learnt_fields() if getattr(self, name) is not None}
        return {**self.shape.record(), **({levers.MAP: 1} if self.vocab_map else {}), **learnt}


def learnt_fields() -> List[str]:
    """The fields of a Candidate the choice fills in as it goes (all but its shape and map)."""
    return [f.name for f in dataclasses.fields(Candidate)[2:]]


def kind(c: Candidate) -> Tuple:
    """What a candidate cuts besides heads: (decoder depth, FFN share, map on); its first two, the structure. The
    Fisher estimate compares shapes of one structure; a kind whose timed shapes all missed the target is timed
    again with its next shape."""
    return c.shape.dec_layers, c.shape.ffn_percent, c.vocab_map


def representatives(scored: List[Candidate]) -> Dict[Tuple, Candidate]:
    """Each structure's first shape in the choice's order, with the map where the structure has shapes with it:
    the shape whose NLL after the fits ranks the structure (kind_nll). The map changes the decoding, not the NLL,
    and lets a structure keep more heads at the same speed, so the pick (the lowest NLL) takes a structure's shape
    with the map before the one without; ranking a structure by its shape without the map misjudged a 5-layer
    decoder with half FFNs on De-En (NLL 1.107 without, 0.997 with)."""
    mapped = {kind(c)[:2] for c in scored if c.vocab_map}
    first: Dict[Tuple, Candidate] = {}
    for c in candidate_order(scored):
        if c.vocab_map == (kind(c)[:2] in mapped):
            first.setdefault(kind(c)[:2], c)
    return first


KINDS_TIMED = 6  # the structures (depth, FFN share) whose first shapes, with and without the map, are timed first


def finalists(scored: List[Candidate], structures: int = KINDS_TIMED) -> List[Candidate]:
    """The first timing's shapes, in the choice's order: the first (candidate_order) of every kind of cut of the
    `structures` structures that rank first (their kind_nll), and the fastest predicted. A few slices however many
    candidates reach the target, drawn from the structures the NLL after the fits ranks best, whatever their
    depth."""
    first: Dict[Tuple, Candidate] = {}
    for c in candidate_order(scored):
        first.setdefault(kind(c), c)
    ranked: List[Tuple] = []
    for c in sorted(first.values(), key=choice_rank):
        if kind(c)[:2] not in ranked:
            ranked.append(kind(c)[:2])
    out = [c for c in first.values() if kind(c)[:2] in ranked[:structures]]
    fastest = max(scored, key=lambda c: c.predicted_speedup)
    return sorted(out + ([fastest] if fastest not in out else []), key=choice_rank)


def kept_by_depth(steps: List[Dict], depth: int, depths) -> Dict[int, List[int]]:
    """The decoder layers kept at each depth, from the steps of shrink's greedy removal (layers.select_by_loss,
    down to the shallowest): at depth d, every layer but the first depth - d removed. The same layers a greedy
    run down to d alone removes: each step reads only the layers left."""
    removed = [int(step["removed"].split(":")[1]) for step in steps]
    return {d: [i for i in range(1, depth + 1) if i not in removed[:depth - d]] for d in depths}


def choice_rank(c: Candidate) -> Tuple[float, float, float]:
    """The order the choice tries the candidates in: the structures by the calibration NLL after the fits of their
    first shape (kind_nll), then the Fisher estimate within a structure, the faster first."""
    return c.kind_nll or 0.0, c.fisher_estimate, -c.predicted_speedup


def removes_more(c: Candidate, other: Candidate) -> bool:
    """`c` removes all `other` removes and more: no more heads kept in either stack, no more decoder layers (a
    depth's layers are nested in the deeper ones': one greedy order), no more FFN units, and not the same shape."""
    mine, theirs = ([math.inf if getattr(x.shape, f) is None else getattr(x.shape, f) for f in SHAPE_FIELDS]
                    for x in (c, other))
    return mine != theirs and all(m <= t for m, t in zip(mine, theirs))


def candidate_order(candidates: List[Candidate]) -> List[Candidate]:
    """The candidates as the choice tries them: the shapes no other candidate removes less than first, each group
    by choice_rank. The joint Fisher estimate Σ_x (Σ_removed g_x,h)² can fall when heads whose gradients cancel
    are added; a shape that removes more than another one that also reaches the target is tried only after it."""
    return sorted(candidates, key=lambda c: (any(removes_more(c, o) for o in candidates), choice_rank(c)))


def fisher_choice(model, grads, candidates: List[Candidate]) -> List[Candidate]:
    """Each candidate's heads (every layer's, in the greedy order of its Fisher block, as shrink's per-stack fill)
    and the Fisher estimate of the loss increase of removing them all: Σ_x (Σ_removed g_x,h)²."""
    import torch

    layout = HeadLayout.of(model)
    orders = {k: select.layer_removal_order(g) for k, g in grads.items()}
    out = []
    for c in candidates:
        kept = {"encoder": c.shape.enc_heads, "decoder": c.shape.dec_heads}
        columns = [(k, i) for k in grads for i in orders[k][:len(layout.heads[k]) - kept[select.stack_of(k)]]]
        estimate = float((torch.stack([grads[k][:, i] for k, i in columns], 1).sum(1) ** 2).sum()) if columns else 0.
        heads = sorted(Head(k[0], k[1], layout.heads[k][i]) for k, i in columns)
        out.append(dataclasses.replace(c, fisher_estimate=estimate, heads_removed=len(heads),
                                       heads=format_head_spec(heads)))
    return out


def reconstructed_nll(model, c: Candidate, calibration, options, pad: int,
                      held: Optional[TeacherTargets] = None) -> float:
    """A candidate's calibration NLL as shrink's closed-form fits leave it (`options`: shrink's, no window fit): its
    decoder layers removed, its heads masked, its FFN units removed (mask Fisher, after the heads), every changed
    sublayer refit towards the unpruned model. The measure the pick compares shapes by: a narrowed FFN's refit takes
    back most of what removing its units costs, so an NLL before any fit misjudges the FFN lever against the others
    (after recovery, a narrowed FFN costs little valid loss: results/compress-de-en). `held`: the unpruned model's
    targets on these samples (reconstruct.TeacherTargets), shared by the shapes fitted."""
    kept = c.layers_kept
    cut = remove_layers(copy.deepcopy(model), kept) if kept else model
    selection = shrink.Selection(parse_head_spec(c.heads) if c.heads else [], "the choice's", False,
                                 Budget("remove", 0.0, False))
    student = shrink.build_student(cut, selection, calibration, options, pad, teacher=model if kept else None,
                                   kept_layers=kept, held=held).student
    return round(layers.calibration_loss(student, calibration.samples, pad), 6)


def timing_verdict(c: Candidate, target: float) -> str:
    """engines.timing.target_verdict of a timed candidate (its interval; one timed before intervals: its
    median)."""
    interval = c.measured_interval or {"low": c.measured_speedup, "ratio": c.measured_speedup}
    return target_verdict(interval, target)


def pick_measured(timed: List[Candidate], target: float,
                  nll: Callable[[Candidate], float]) -> Tuple[Candidate, bool]:
    """Of the timed candidates whose interval's lower end clears the target (none: whose median does), the lowest
    `nll` (recorded as `calibration_nll`, computed only when several are eligible, once per structure: the map
    changes the decoding, not the NLL; one that removes more than another eligible one is passed over, recorded as
    `passed_over_for`), the map off before on at equal NLL, then the faster; and True. None reaching it at the
    median: the fastest, and False. The map is thus taken only where it lets a shape with a lower NLL reach the
    target; what it costs in translations is checked at the export (--vocab-map-max-loss)."""
    verdicts = [timing_verdict(c, target) for c in timed]
    eligible = ([c for c, v in zip(timed, verdicts) if v == "met"]
                or [c for c, v in zip(timed, verdicts) if v != "missed"])
    if not eligible:
        return max(timed, key=lambda c: c.measured_speedup), False
    for c in eligible:  # one that removes all another eligible one removes, and more, cannot have the lower NLL
        kept = next((o for o in eligible if removes_more(c, o)), None)  # (as candidate_order ranks them)
        if kept is not None:
            c.passed_over_for = label(kept)
    eligible = [c for c in eligible if c.passed_over_for is None]
    if len(eligible) > 1:
        computed: Dict[str, float] = {}
        for c in eligible:
            structure = structure_label(c)
            if structure not in computed:
                computed[structure] = nll(c)
            c.calibration_nll = computed[structure]
    return min(eligible, key=lambda c: (c.calibration_nll or 0.0, c.vocab_map, -c.measured_speedup)), True


RETIMED_ROUNDS = 2  # further timing rounds for the kinds whose timed shapes all missed the target


def retime_candidates(scored: List[Candidate], timed: List[Candidate], target: float) -> List[Candidate]:
    """The shapes to time next: of each kind (depth, FFN share, map) whose timed shapes all missed the target (the
    interval's lower end below it), the first one in the choice's order, not timed yet, whose predicted speed-up
    scaled by that kind's measured/predicted ratio (the least of its timed shapes) reaches the target. The cost
    table multiplies lever costs measured one at a time: it can overrate a deep cut that keeps most heads (a shallow
    decoder's attention holds more of its time) and underrate narrowed FFNs in a cut decoder (where they hold more
    of it); the kind's own timing corrects its next prediction."""
    ratio: Dict[Tuple, float] = {}
    reached = set()
    for c in timed:
        ratio[kind(c)] = min(ratio.get(kind(c), math.inf), c.measured_speedup / c.predicted_speedup)
        if timing_verdict(c, target) == "met":
            reached.add(kind(c))
    labels = {label(c) for c in timed}
    out = []
    for cut in ratio.keys() - reached:
        for c in candidate_order([o for o in scored if kind(o) == cut]):
            if label(c) not in labels and c.predicted_speedup * ratio[cut] >= target:
                out.append(c)
                break
    return sorted(out, key=choice_rank)


def moved_levers(candidates: List[Candidate], whole: Dict[str, int]) -> List[str]:
    """The names of the levers some candidate sets below the whole, or turns on (what the choice chose among)."""
    points = [c.shape.record() for c in candidates]
    moved = [lever.name for lever in levers.LEVERS
             if any(lever.field in p and p[lever.field] < whole.get(lever.field, 100.0) for p in points)]
    return moved + ([levers.MAP_LEVER.name] if any(c.vocab_map for c in candidates) else [])


def fisher_frontier(candidates: List[Candidate]) -> List[Candidate]:
    """The shapes no other beats on both predicted speed and Fisher estimate (lower is better), fastest first."""
    frontier: List[Candidate] = []
    for c in sorted(candidates, key=lambda c: (-c.predicted_speedup, c.fisher_estimate)):
        if not frontier or c.fisher_estimate < frontier[-1].fisher_estimate:
            frontier.append(c)
    return frontier


def structure_label(c: Candidate) -> str:
    """A candidate's label without the map: the shape an NLL after the fits is computed for (the map changes the
    decoding, not the NLL; a structure's heads at given counts are one Fisher order's)."""
    return label(dataclasses.replace(c, vocab_map=False))


def label(c: Candidate) -> str:
    """The candidate as the log, the records' keys and the finalists' table name it: "8/4, decoder 3 layers, FFN
    50%, vocabulary map"."""
    shape = c.shape
    heads = f"{shape.enc_heads}/{shape.dec_heads}"
    heads = heads if shape.enc_layers is None else f"{heads}, encoder {shape.enc_layers} layers"
    heads = heads if shape.dec_layers is None else f"{heads}, decoder {shape.dec_layers} layers"
    heads = heads if shape.ffn_percent >= 100 else f"{heads}, FFN {shape.ffn_percent:g}%"
    return heads if not c.vocab_map else f"{heads}, vocabulary map"
