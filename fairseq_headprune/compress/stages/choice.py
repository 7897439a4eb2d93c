"""The choice stage: the shape and its heads. --speedup: of the shapes that reach it, the lowest Fisher estimate of the
loss increase within a decoder depth, the depths ranked by calibration NLL, the first few timed again as crude slices
and the one with the lowest calibration NLL after shrink's closed-form fits among those that measure the target.
--max-bleu-loss: the fastest shape of the (speed, Fisher estimate) frontier whose shrunk model loses at most X BLEU
on a held-out split of valid, found by bisection."""
from __future__ import annotations

import copy
import dataclasses
import os
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Tuple

from fairseq_headprune.prune import layers, levers, select
from fairseq_headprune.compress.choice import (KINDS_TIMED, RETIMED_ROUNDS, Candidate, finalists, fisher_choice,
                                               fisher_frontier, kept_by_depth, kind, label, moved_levers,
                                               pick_measured, reconstructed_nll, representatives,
                                               retime_candidates, structure_label, timing_verdict)
from fairseq_headprune.prune.reconstruct import TeacherTargets
from fairseq_headprune.prune.shrink import calibrate
from fairseq_headprune.prune.shrink_options import with_fit
from fairseq_headprune.compress.stages.common import HELDOUT, data_sha, max_tokens, timing_vocab_map
from fairseq_headprune.compress.model_card import timed_words
from fairseq_headprune.compress.stages.contract import Context, Inputs, Results, Stage
from fairseq_headprune.compress.stages.heldout import heldout_score, split_valid
from fairseq_headprune.compress.stages.points import points as reachable_points
from fairseq_headprune.compress.stages.results import Choice
from fairseq_headprune.compress.stages.shrink_recipe import (calibration_only_options, keep_layers_spec, settings,
                                                             shrink_heads, shrink_options)
from fairseq_headprune.prune.window_fit import WindowOptions
from fairseq_headprune.core.surgery import remove_layers
from fairseq_headprune.errors import UserError


@dataclass(frozen=True)
class ChoiceInputs(Inputs):
    """What the choice reads: the target, the reachable points (compress.stages.points), the calibration sentences
    by content; with a quality bound the held-out sentences, the shrink's settings and valid by content; the map's
    options where every slice is timed with it (None otherwise: earlier runs' choices still resume)."""
    target: str
    points: List[Dict]
    calibration: List
    data: str
    heldout: Optional[int] = None
    shrink: Optional[Dict] = None
    valid: Optional[str] = None
    vocab_map: Optional[Dict] = None


def inputs(context: Context, results: Results) -> ChoiceInputs:
    loaded, o = context.loaded, context.options
    bounded = o.quality_bound() is not None
    calibration = [o.calibration_subset, o.calibration_sentences, o.calibration_max_tokens, {"seed": o.sample_seed}]
    return ChoiceInputs(o.target, reachable_points(context, results), calibration,
                        data_sha(loaded, o.calibration_subset), o.heldout_sentences if bounded else None,
                        settings(loaded, o) if bounded else None, data_sha(loaded, "valid") if bounded else None,
                        asdict(o.vocab_map_options) if o.vocab_map else None)


def gradients(loaded, options):
    """Each calibration sentence's head-mask gradients, and the calibration they were taken on."""
    with max_tokens(loaded, options.calibration_max_tokens):
        calibration = calibrate(loaded, calibration_only_options(options))
    pad = loaded.task.target_dictionary.pad()
    return select.sentence_gradients(loaded.model, calibration.samples, pad), calibration


def build(folder: str, inputs: ChoiceInputs, context: Context, results: Results) -> Choice:
    """The chosen shape with the candidates it was chosen among and the rule that chose it."""
    loaded, options, log = context.loaded, context.options, context.log
    points = [Candidate.of(p) for p in copy.deepcopy(inputs.points)]
    timing, rounds = context.timing, context.rounds
    grads, calibration = gradients(loaded, options)
    provenance = {**calibration.provenance(), "data": os.path.abspath(loaded.cfg.task.data)}
    if options.speedup is None:
        scored = fisher_choice(loaded.model, grads, quality_points(points, levers.stack_sizes(loaded.model)))
        return Choice.of({**by_quality(folder, loaded, options, scored, provenance, log),
                          "levers": moved_levers(scored, levers.stack_sizes(loaded.model))})
    scored, layer_order = scored_by_depth(loaded, grads, calibration, points, log)
    pad = loaded.task.target_dictionary.pad()
    held = TeacherTargets(loaded.model, calibration.samples, pad)  # every shape's fits aim at the same targets

    def after_fits(point: Dict) -> float:
        return nll_after_fits(loaded, options, point, calibration, pad, held)

    fits = ranked_by_structure(scored, after_fits, log) if options.shape is None else {}
    mapped = any(c.vocab_map for c in scored)
    best, confirmed, timed = confirm(loaded, options, timing, rounds, scored, after_fits, log,
                                     vocab_map=timing_vocab_map(loaded, options, folder) if mapped else None,
                                     fits=fits, trim=context.trim)
    rule = choice_rule(options, scored)
    log(f"choice: {best.shape.words(best.vocab_map)}, {timed_words(best.record())} measured (predicted "
        f"{best.predicted_speedup:.2f}x): {rule}"
        + ("" if confirmed else "; it measured below the target" if options.shape is not None
           else "; none of them measured it: the fastest of them")
        + f" ({calibration.sentences} sentences of '{calibration.subset}')")
    return Choice.of({"chosen": best.record(), "candidates": [compact(c) for c in scored],
                      "timed": [c.record() for c in timed],
                      "confirmed": confirmed, "levers": moved_levers(scored + timed, levers.stack_sizes(loaded.model)),
                      "layer_order": layer_order, "why": why_words(best, timed, options.speedup),
                      "chosen_by": rule if confirmed or options.shape is not None
                      else "none of the shapes timed measured the target: the fastest of them",
                      "calibration": provenance})


def quality_points(candidates: List[Candidate], whole: Dict[str, int]) -> List[Candidate]:
    """The candidates a quality bound's bisection probes: the Fisher frontier compares heads only, so those that
    remove heads and cut no depth or FFN (with --vocab-map every point maps: the map alone shrinks nothing)."""
    return [c for c in candidates if c.shape.dec_layers is None and c.shape.ffn_percent >= 100
            and (c.shape.enc_heads < whole["enc_heads"] or c.shape.dec_heads < whole["dec_heads"])]


def compact(c: Candidate) -> Dict:
    """A candidate as the record keeps it: its shape and scores, without its head spec and kept layers (thousands
    of candidates; the chosen and the timed shapes keep theirs)."""
    return {k: v for k, v in c.record().items() if k not in ("heads", "layers_kept")}


def choice_rule(options, scored: List[Candidate]) -> str:
    """The rule that chose, in words (the card's and the log's)."""
    shipped_map = ("; every slice timed with the vocabulary map the model ships (--vocab-map)" if options.vocab_map
                   else "")
    if options.shape is not None:
        return (f"given by --shape {options.shape} (its heads by the Fisher estimate in the kept layers, its "
                "layers by the calibration loss)" + shipped_map)
    depths = len({c.shape.dec_layers for c in scored})
    mapped = any(c.vocab_map for c in scored)
    weighed = mapped and not options.vocab_map
    return (f"of the {len(scored)} shapes predicted to reach {options.speedup:g}x (heads per stack at {depths} "
            "decoder depth(s), every FFN at 100, 75, 50 or 25% of its units"
            + (", with and without the vocabulary map" if weighed else "")
            + f"), the first shape of each kind of cut (decoder depth, FFN share{', map' if weighed else ''}) of "
              f"the {KINDS_TIMED} structures (depth and FFN share) whose first shape keeps the lowest calibration "
              "NLL after shrink's closed-form fits (the heads within a structure by the Fisher estimate of the loss "
              "increase, removing no more than another shape first), and the fastest, timed as slices of the "
              "shape that ships (then, for a kind whose timed shapes all missed the target, its next shape whose "
              "prediction scaled by the kind's measured/predicted ratio reaches it); of those whose 95% interval "
              "clears the target (none doing so: whose median does), the lowest calibration NLL after the fits "
              "(layers removed, heads masked, FFN units removed, every changed sublayer refit; no window fit)"
            + ("; the map only where it lets a shape with a lower NLL reach the target" if weighed else "")
            + shipped_map)


def why_words(best: Candidate, timed: List[Candidate], target: float) -> str:
    """Two sentences: why the winner won, against the finalists it was timed beside."""
    others = [p for p in timed if p is not best]
    cleared = [p for p in others if timing_verdict(p, target) != "missed"]
    first = (f"{label(best)} measured {timed_words(best.record())} against the target {target:g}x "
             f"({timing_verdict(best, target)}), one of {len(timed)} finalists timed as they ship")
    if best.calibration_nll is not None and cleared:
        runner = min((p for p in cleared if p.calibration_nll is not None), key=lambda p: p.calibration_nll,
                     default=None)
        second = (f"Of the {len(cleared) + 1} that reached it, it keeps the lowest calibration NLL after the "
                  f"closed-form fits ({best.calibration_nll:.4f}"
                  + (f"; next {label(runner)} at {runner.calibration_nll:.4f}" if runner else "") + ").")
    elif timing_verdict(best, target) == "missed":
        second = "None of them reached it: it is the fastest."
    elif cleared and all(p.passed_over_for for p in cleared):
        second = f"The {len(cleared)} others that reached it remove all it removes and more: passed over unscored."
    elif cleared:
        second = "The others that reached it did so at the median only, not at their interval's lower end."
    else:
        second = "No other finalist reached it."
    return f"{first}. {second}"


def scored_by_depth(loaded, grads, calibration, points: List[Candidate],
                    log: Callable) -> Tuple[List[Candidate], Optional[Dict]]:
    """fisher_choice at each decoder depth among the points: on the model with the layers shrink's importance
    selection removes (one greedy run down to the shallowest depth, on the same calibration sentences: its
    order gives every depth's layers) and that model's own head-mask gradients (as shrink's head search in
    the kept layers). Returns the scored points and the greedy layer order (None without a depth cut)."""
    model, pad = loaded.model, loaded.task.target_dictionary.pad()
    whole = levers.stack_sizes(model)
    full = whole["dec_layers"]
    groups: Dict[int, List[Candidate]] = {}
    for c in points:
        groups.setdefault(c.shape.dec_layers or full, []).append(c)
    order, kept = None, {}
    enc = {c.shape.enc_layers for c in points if c.shape.enc_layers is not None}  # --shape only: one shape
    if enc:
        counts = layers.parse_keep_layers(keep_layers_spec(min(groups) if min(groups) < full else None, *enc))
        chosen = layers.select_by_loss(model, counts,
                                       layers.CutLoss(model, calibration.samples, pad), log)
        order, kept = chosen.as_json(), {min(groups): {s: list(v) for s, v in chosen.kept.items()}}
    elif min(groups) < full:
        chosen = layers.select_by_loss(model, {"dec": min(groups)},
                                       layers.CutLoss(model, calibration.samples, pad), log)
        order = chosen.as_json()
        kept = {d: {"dec": v} for d, v in kept_by_depth(chosen.steps, full, [d for d in groups if d < full]
                                                        ).items()}
    scored = []
    for depth in sorted(groups, reverse=True):
        cut = remove_layers(copy.deepcopy(model), kept[depth]) if depth in kept else model
        removes = any(c.shape.enc_heads < whole["enc_heads"] or c.shape.dec_heads < whole["dec_heads"]
                      for c in groups[depth])
        own = grads if cut is model else (select.sentence_gradients(cut, calibration.samples, pad)
                                          if removes else {})
        out = fisher_choice(cut, own, groups[depth])
        if depth in kept:
            for c in out:
                c.layers_kept = kept[depth]
        scored += out
    return scored, order


def ranked_by_structure(scored: List[Candidate], after_fits: Callable[[Candidate], float],
                        log: Callable) -> Dict[str, float]:
    """Each point's `kind_nll` (when several structures compete): the calibration NLL after shrink's closed-form
    fits (`after_fits`: nll_after_fits, the pick's measure) of its structure's first shape
    (choice.representatives). An NLL before any fit ranked the depths by their heads alone: a deeper decoder with
    narrowed FFNs, whose refit takes back most of what the units cost, ranked below a shallower one it beats after
    the fits (and after recovery: results/compress-de-en/nll-vs-recovery.md). Returns the NLLs computed, by
    structure_label (the pick reuses them)."""
    firsts = representatives(scored)
    if len(firsts) < 2:
        return {}
    nll = {}
    for structure, first in firsts.items():
        nll[structure] = after_fits(first)
        log(f"choice: {label(first)} comes first of its structure's "
            f"{sum(kind(p)[:2] == structure for p in scored)} shapes: calibration NLL after the closed-form fits "
            f"{nll[structure]:.4f}")
    for c in scored:
        c.kind_nll = nll[kind(c)[:2]]
    return {structure_label(first): nll[structure] for structure, first in firsts.items()}


def confirm(loaded, options, timing, rounds: int, scored: List[Candidate],
            after_fits: Callable[[Candidate], float], log: Callable, vocab_map: Optional[str] = None,
            fits: Optional[Dict[str, float]] = None,
            trim: Optional[Dict[str, float]] = None) -> Tuple[Candidate, bool, List[Candidate]]:
    """The finalists (choice.finalists: the first shape of each kind of cut of the structures that rank first, and
    the fastest) timed as slices of the shape that ships in one interleaved run (a point with the map decodes with
    `vocab_map`, as the model built will); then, in at most RETIMED_ROUNDS more runs, the next shape of each kind
    whose timed shapes all missed the target (retime_candidates). Of those whose interval clears the target, the
    lowest calibration NLL after shrink's closed-form fits (pick_measured; reconstructed_nll: comparable across
    depths, head counts and FFN widths, where the Fisher estimates of different cut models are not; those `fits`
    holds by structure_label, the structures' ranking computed, reused); none clearing it, the fastest timed. Every
    slice takes `trim` ({"vocab_percent": P}: as many target words as --keep-vocab keeps)."""
    target = options.speedup
    batch = list(scored) if options.shape is not None else finalists(scored)
    timed: List[Candidate] = []
    for _ in range(1 + RETIMED_ROUNDS):
        shapes = {label(c): dataclasses.replace(c.shape, **(trim or {})) for c in batch}
        measured = levers.time_shapes(loaded, options.engine, timing, rounds, shapes, log, vocab_map=vocab_map,
                                      mapped=[label(c) for c in batch if c.vocab_map],
                                      threads=options.deploy_threads)
        for c in batch:
            c.measured_speedup = measured["speedup"][label(c)]
            c.measured_interval = measured["interval"][label(c)]
            c.verdict = timing_verdict(c, target)
            c.timing_load = measured["load_average"]
        if (measured["load_average"] or 0.0) > levers.LOADED:
            log(f"choice: timed under a 1-minute load average of {measured['load_average']:.1f} (another "
                "CPU-bound process beside the timing): slices time lower under load, and the shape taken "
                "can move with it (docs/compress.md, Limits); a quiet machine gives the choice its figures")
        timed += batch
        if options.shape is not None:
            break
        seen = {label(p) for p in timed}
        batch = [p for p in retime_candidates(scored, timed, target) if label(p) not in seen]
        if not batch:
            break
    best, confirmed = pick_measured(timed, options.speedup,
                                    lambda p: (fits or {}).get(structure_label(p)) or after_fits(p))
    log("choice: timed " + ", ".join(
        f"{label(c)} {timed_words(c.record())}" + (f" (calibration NLL after the closed-form fits "
                                                   f"{c.calibration_nll:.4f})" if c.calibration_nll is not None
                                                   else "")
        for c in timed))
    return best, confirmed, timed


def nll_after_fits(loaded, options, candidate: Candidate, calibration, pad: int,
                   held: Optional[TeacherTargets] = None) -> float:
    """A shape's calibration NLL after shrink's closed-form fits (choice.reconstructed_nll) with this run's
    shrink options: what the pick compares (benchmarks/nll_vs_recovery.py reads it too). `held`: the unpruned
    model's targets on the calibration (reconstruct.TeacherTargets), shared by every shape the choice fits."""
    shape = candidate.shape
    fits = with_fit(shrink_options(options, candidate.heads, shape.dec_layers, shape.ffn_percent, shape.enc_layers),
                    window=WindowOptions(steps=0))
    return reconstructed_nll(loaded.model, candidate, calibration, fits, pad, held)


def by_quality(folder: str, loaded, options, scored: List[Candidate], provenance: Dict, log: Callable) -> Dict:
    """The fastest shape on the (speed, Fisher estimate) frontier whose shrunk model (before recovery) loses at
    most --max-bleu-loss BLEU (or --max-chrf-loss chrF) on the held-out split of valid, in the engine: a bisection
    along the frontier (the loss falls as the shapes get slower), each probe a shrink with the full recipe and one
    decode."""
    o = options
    metric, bound = o.quality_bound()
    data, split = split_valid(loaded, os.path.join(folder, "data"), o.heldout_sentences)
    log(f"choice: valid split in two: sentences {split['heldout'][0]}-{split['heldout'][1] - 1} choose "
        f"(subset '{HELDOUT}'), {split['valid'][0]}-{split['valid'][1] - 1} early-stop the recovery")
    frontier = fisher_frontier(scored)
    base = heldout_score(loaded, options.engine, data, loaded.checkpoint, os.path.join(folder, "unpruned"), metric)
    probes: Dict[str, Candidate] = {}

    def loss(i: int) -> float:
        c = frontier[i]
        name = label(c).replace("/", "-")
        if name not in probes:
            cand = os.path.join(folder, "candidates", name)
            os.makedirs(cand, exist_ok=True)
            shrunk = shrink_heads(cand, loaded, options, c.heads)
            score = heldout_score(loaded, options.engine, data, shrunk["checkpoint"], os.path.join(cand, "decode"),
                                  metric)
            probes[name] = dataclasses.replace(c, heldout_score=score, heldout_loss=round(base - score, 2),
                                               shrunk=shrunk)
            log(f"choice: {label(c)} (predicted {c.predicted_speedup:.2f}x) loses "
                f"{base - score:.2f} {metric} on '{HELDOUT}' before recovery")
        return probes[name].heldout_loss

    lo, hi = 0, len(frontier) - 1  # the first (fastest) index within the bound; the loss falls with the index
    if loss(hi) > bound:
        raise UserError(f"{o.target}: even the mildest shape, {label(frontier[hi])}, "
                        f"loses {probes[label(frontier[hi]).replace('/', '-')].heldout_loss:.2f} {metric} on the "
                        "held-out split before recovery; give a larger bound, or --speedup")
    while lo < hi:
        mid = (lo + hi) // 2
        if loss(mid) <= bound:
            hi = mid
        else:
            lo = mid + 1
    best = probes[label(frontier[lo]).replace("/", "-")]
    log(f"choice: {best.shape.words(best.vocab_map)}, predicted "
        f"{best.predicted_speedup:.2f}x, "
        f"the fastest of {len(frontier)} frontier shapes within {bound:g} {metric} on '{HELDOUT}' "
        f"({len(probes)} shrunk and decoded)")
    return {"chosen": best.record(), "candidates": [c.record() for c in scored],
            "frontier": [c.record() for c in frontier], "probes": [c.record() for c in probes.values()],
            "heldout_unpruned": base, "metric": metric, "split": split, "data": data,
            "chosen_by": f"the fastest shape of the frontier (predicted speed against the Fisher estimate) whose "
                         f"shrunk model, before recovery, loses at most {bound:g} {metric} in {o.engine} on "
                         f"valid sentences {split['heldout'][0]}-{split['heldout'][1] - 1} (held out of the "
                         "recovery's early stopping)",
            "calibration": provenance}






STAGE = Stage("choice", inputs, build, Choice)
