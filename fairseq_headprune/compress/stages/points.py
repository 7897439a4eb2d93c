"""The shapes a run chooses among: every point (heads per stack, decoder depth, FFN share, the map) with the speed
the cost table predicts for it, the target's reachable ones (or --shape's point), a target none reaches refused in
one line. The cost-table stage announces them, the choice reads them, the record keeps them."""
from __future__ import annotations

import copy
from typing import Callable, Dict, List

from fairseq_headprune.prune import levers
from fairseq_headprune.compress.choice import SHAPE_FIELDS, lever_points, shapes_reaching
from fairseq_headprune.core.shape import shape_words
from fairseq_headprune.compress.stages.contract import Context, Results
from fairseq_headprune.errors import UserError


def reachable(loaded, options, table: Dict, log: Callable, trim: Dict[str, float]) -> List[Dict]:
    """Every point (heads per stack at every decoder depth, every FFN share, the map as options.map_state says)
    with its predicted speed (each with the `trim` every shape of the run takes); the target's reachable ones, or a
    refusal in one line."""
    levers.smooth(table["rows"], options.significance)
    state = map_state(options, table, log)
    points = lever_points(loaded.model, state)
    for p in points:
        p["predicted_speedup"] = round(levers.predict(table, {**p, **trim}), 4)
    points.sort(key=lambda p: -p["predicted_speedup"])
    order = ", ".join(f"{name} {speed:.2f}x" for name, speed in levers.lever_order(table))
    log(f"cost table ({options.engine}, equal work): what half of each lever buys alone: {order}"
        + ("; every shape predicted with the vocabulary map (--vocab-map)" if state == "on" else "")
        + (f"; every shape predicted with the output layer trimmed to {trim[levers.VOCAB]:.1f}% of the target words "
           "(--keep-vocab)" if trim else ""))
    if options.shape is not None:
        return [given_point(loaded, options, table, points, log, trim)]
    if options.speedup is not None:
        reach = shapes_reaching(points, options.speedup)
        if not reach:
            best = points[0]
            fields = {lever.field for lever in levers.levers_for(trim) if lever.removable} | {levers.MAP}
            levers.refuse_unreachable(options.speedup,
                                      ({k: v for k, v in {**best, **trim}.items() if k in fields},
                                       best["predicted_speedup"]), table, options.engine)
        log(f"{len(reach)} of {len(points)} shapes (heads per stack, decoder depth, FFN share"
            + (", the map" if state == "weighed" else "") + f") reach {options.speedup:g}x (predicted): fastest "
            f"{shape_words(points[0])} {points[0]['predicted_speedup']:.2f}x")
        return reach
    return points


def smoothed(context: Context, results: Results) -> Dict:
    """A copy of the table held, its rows smoothed at this run's --significance (levers.smooth): what the choice
    predicted from, as the record and the card give it."""
    table = copy.deepcopy(results["cost-table"].record)
    levers.smooth(table["rows"], context.options.significance)
    return table


def announce_points(context: Context, results: Results) -> None:
    """The table's points logged, or the run's refusal in one line, before any long work."""
    reachable(context.loaded, context.options, smoothed(context, results), context.log, context.trim)


def points(context: Context, results: Results) -> List[Dict]:
    """The same points without a word (what the choice and the record read)."""
    return reachable(context.loaded, context.options, smoothed(context, results), lambda line: None, context.trim)


def map_state(options, table: Dict, log: Callable) -> str:
    """The map in this run's points: options.map_state(), except that a map the choice would weigh is left out
    when it changed the unpruned model's translations of the timing sentences by more than --vocab-map-max-loss
    BLEU (the bound the export's check applies to the map it ships)."""
    state = options.map_state()
    if state != "weighed":
        return state
    row = next((r for r in table["rows"] if r["field"] == levers.MAP), None)
    changes = (row or {}).get("translations", {})
    loss = changes.get("bleu_without", 0.0) - changes.get("bleu_with", 0.0)
    if row is None or loss > options.vocab_map_bound.vocab_map_max_loss:
        log("choice: the vocabulary map is not weighed: "
            + ("the cost table has no row for it" if row is None else
               f"it lost {loss:.2f} BLEU on the timing sentences, more than --vocab-map-max-loss "
               f"{options.vocab_map_bound.vocab_map_max_loss:g}"))
        return "off"
    return state


def given_point(loaded, options, table: Dict, points: List[Dict], log: Callable, trim: Dict[str, float]) -> Dict:
    """--shape's point with its prediction (the map as --vocab-map says, the output layer as `trim`)."""
    given = {**shape_point(loaded, options), **({levers.MAP: 1} if options.vocab_map else {})}
    point, note = next((dict(p) for p in points if {k: v for k, v in p.items() if k in SHAPE_FIELDS + (levers.MAP,)}
                        == given), None), ""
    if point is None:  # an FFN share the table did not measure, or the encoder's depth (no row)
        point, priced = dict(given), {k: v for k, v in {**given, **trim}.items() if k != "enc_layers"}
        if "enc_layers" in given:
            note = ", the encoder's depth not counted (the cost table has no row for it)"
        try:
            point["predicted_speedup"] = round(levers.predict(table, priced), 4)
        except ValueError:  # below the table's FFN rows: the FFN's share left out of the prediction
            note += ", the FFN's share not counted (below the cost table's rows)"
            point["predicted_speedup"] = round(levers.predict(
                table, {k: v for k, v in priced.items() if k != "ffn_percent"}), 4)
    log(f"--shape {options.shape}: {shape_words(point)}, predicted "
        f"{point['predicted_speedup']:.2f}x{note} (the target {options.speedup:g}x)")
    return point


def shape_point(loaded, options) -> Dict[str, int]:
    """--shape as a choice point {enc_heads, dec_heads[, dec_layers][, ffn_percent][, enc_layers]}, or one line
    where this model cannot take it (a stack's heads or layers out of range, nothing removed)."""
    shape, model = options.given_shape(), loaded.model
    shape.check(model, "--shape")
    whole = levers.stack_sizes(model)
    point = shape.point({**whole, "enc_layers": len(model.encoder.layers)})
    if point == {"enc_heads": whole["enc_heads"], "dec_heads": whole["dec_heads"]}:
        raise UserError(f"--shape {options.shape} is the unpruned model's: nothing to remove")
    return point
