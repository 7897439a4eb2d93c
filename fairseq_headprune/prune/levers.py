"""The cost table: what each lever buys in speed on this model, on this machine, in the engine it is deployed in.

A lever is a structure `compress` can take away, as data: a name, the values it can be set to (what a layer keeps),
how a shape with that value is cut from the unpruned model (core.shape.Shape: the first heads of every
layer, evenly spaced layers, the first FFN units) and whether `shrink` can remove it from a trained model today.
Heads per stack (encoder, decoder: CTranslate2's one head count per stack), the decoder's depth (layers kept,
`shrink --keep-layers`) and every FFN's share of hidden units (`shrink --ffn-keep`: little on a small model whole,
more once its decoder is cut, where they hold more of the time) are removable;
the output layer is measured so that a missed target can say what it would buy, and plugs into the same table and
the same choice once shrink removes it. A lever whose field ends in `_percent` is set in percent of the whole; any
other counts what the model holds (heads per layer, layers), its whole read from the model (stack_sizes).

Each row of the table is one lever at one value, every other lever left whole: a crude slice of the unpruned model
(its translations mean nothing, its speed is that of any model of its shape) timed at equal work (every hypothesis
forced to the unpruned model's mean length) beside the unpruned model in the same engine, in the same rounds,
interleaved batch by batch (engines.timing.interleaved). A shape that moves several levers is predicted from the
shares of time each lever's row leaves, multiplied: the conservative side of adding the shares each saves (which
separate computations, as the encoder's and the decoder's, would justify), and never beyond what is possible when
noisy rows add up past the whole. The shapes chosen are timed again, and the final model is measured, never
predicted. The table is cached per model (sha256), engine, CPU model, timing data
and decoding options in a JSON file, so a second `compress` of the same model on the same machine skips it.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Collection, Dict, List, Mapping, Optional, Sequence, Tuple

from omegaconf import open_dict

from fairseq_headprune.core import flops
from fairseq_headprune.core.heads import attention_modules
from fairseq_headprune.core.shape import MAP_FIELD, ModelShape, Shape
from fairseq_headprune.core.surgery import crude_model
from fairseq_headprune.engines.ct2 import ct2_shape
from fairseq_headprune.engines.engine_model import EngineModel
from fairseq_headprune.engines.fairseq_engine import check_batches
from fairseq_headprune.engines.timing import (load_average, paired_speedup, sign_test, speedup_interval,
                                              timed_rounds)
from fairseq_headprune.errors import UserError
from fairseq_headprune.records.identity import decoding_identity, file_sha256
from fairseq_headprune.records.log import read_json, write_json_atomic

ENGINES = ("ct2-int8", "ct2-float32", "fairseq")
TIMING_BATCH = 16  # sentences per timing batch when the user gives no --batch-size (300 of valid: 19 batches)
MIN_PAIRED = 10  # paired batches every sign test sees at least (fewer rounds cannot reach p < 0.05 reliably)


# --------------------------------------------------------------------------------------------- levers as data


@dataclass(frozen=True)
class Lever:
    """One structure compress may take away. `field` is the Shape field a value sets; `unit` what a value
    counts; `removable`: the choice moves it (compress removes it from a trained model today)."""

    name: str
    field: str
    unit: str
    removable: bool
    percents: Tuple[float, ...] = ()  # the values measured, as shares of the whole (counted: () measures every count)

    @property
    def counted(self) -> bool:
        """Its values count what the model holds (heads, layers), not a percent of the whole."""
        return not self.field.endswith("_percent")

    def values(self, full: int) -> List[float]:
        """The values below the whole this lever is measured at, deepest last."""
        if self.counted:
            if not self.percents:
                return list(range(full - 1, 0, -1))
            return sorted({max(1, round(full * p / 100)) for p in self.percents if p < 100} - {full}, reverse=True)
        return [p for p in self.percents if p < 100]

    def whole(self, full: int) -> float:
        return full if self.counted else 100.0


FFN = Lever("FFN units", "ffn_percent", "% of every FFN's hidden units kept", True, (75.0, 50.0, 25.0))
LEVERS: Tuple[Lever, ...] = (
    Lever("encoder heads", "enc_heads", "heads kept in every encoder layer", True),
    Lever("decoder heads", "dec_heads", "heads kept in every decoder self- and cross-attention layer", True),
    Lever("decoder layers", "dec_layers", "decoder layers kept", True),
    FFN,
    Lever("output layer", "vocab_percent", "% of the target words kept", False, (50.0,)),
)


VOCAB = "vocab_percent"


def levers_for(trim: Mapping[str, float]) -> Tuple[Lever, ...]:
    """The levers a run measures: where `trim` gives {VOCAB: P} (compress --keep-vocab), the output layer at the P%
    of the target words the trim keeps, removable (the export trims it); otherwise LEVERS (the output layer at half,
    what it would buy)."""
    if VOCAB not in trim:
        return LEVERS
    output = Lever("output layer", VOCAB, "% of the target words kept (--keep-vocab)", True, (float(trim[VOCAB]),))
    return tuple(output if lever.field == VOCAB else lever for lever in LEVERS)


def stack_sizes(model) -> Dict[str, int]:
    """The whole of every counted lever: the fewest heads any layer of each stack holds (what a per-stack shape can
    keep at most), and the decoder's depth."""
    held = {"enc_heads": [], "dec_heads": []}
    for (attn_type, _), attn in attention_modules(model).items():
        held["enc_heads" if attn_type == "enc-self" else "dec_heads"].append(int(attn.num_heads))
    return {**{k: min(v) for k, v in held.items()}, "dec_layers": len(model.decoder.layers)}


def lever_rows(model, levers: Sequence[Lever] = LEVERS) -> List[Tuple[Lever, float]]:
    """(lever, value) of every row the table measures for this model."""
    sizes = stack_sizes(model)
    return [(lever, value) for lever in levers for value in lever.values(sizes.get(lever.field, 100))]


# --------------------------------------------------------------------------------------------- timing batches


def timing_batches(loaded, subset: str, n: int, batch: Optional[int] = None):
    """The first n sentences of a subset batched for timing: `batch` sentences per batch (the deployment's) when
    given, else at most the user's --batch-size, or TIMING_BATCH when none is given (fairseq-generate's default
    --max-tokens would hold 300 sentences in one batch, leaving every sign test a single pair per round), within the
    user's --max-tokens when given."""
    dataset = loaded.cfg.dataset
    given = dataset.batch_size
    with open_dict(loaded.cfg):
        dataset.batch_size = batch or given or TIMING_BATCH
    try:
        return check_batches(loaded, subset, n)
    finally:
        with open_dict(loaded.cfg):
            dataset.batch_size = given


def timing_rounds(batches: int, runs: int) -> int:
    """Interleaved rounds of a timing: --runs, or more when the batches are fewer than MIN_PAIRED / runs, so that
    every sign test sees at least MIN_PAIRED paired batches."""
    return max(runs, math.ceil(MIN_PAIRED / max(batches, 1)))


def fewest_paired(table: Dict) -> int:
    """The fewest paired batches any row's sign test saw (ties dropped; MIN_PAIRED for a table without rows)."""
    return min((r.get("sign_test", {}).get("batches", 0) for r in table["rows"]), default=MIN_PAIRED)


def decided(table: Dict) -> bool:
    """Whether the table's sign tests could decide: every row saw at least MIN_PAIRED paired batches (a slice
    faster in all of them reaches p = 0.001; in 3 of 3, the least a row could reach before, p = 0.125)."""
    return fewest_paired(table) >= MIN_PAIRED


# --------------------------------------------------------------------------------------------- the table


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def table_identity(loaded, engine: str, samples, runs: int, levers: Sequence[Lever] = LEVERS,
                   threads: int = 1) -> Dict:
    """What a cost table's numbers depend on: the model by content, the engine and its version, the CPU, the timing
    sentences and their batching, the decoding options, the levers and values measured."""
    import torch

    sentences = sorted(sid for s in samples for sid in s["id"].tolist())
    tokens = hashlib.sha256(json.dumps([s["net_input"]["src_tokens"].tolist() for s in samples]).encode())
    identity = {"model_sha256": file_sha256(loaded.checkpoint), "engine": engine, "cpu": cpu_model(),
                "threads": threads, "sentences": len(sentences), "batches": len(samples),
                "sources_sha256": tokens.hexdigest()[:16],
                "generation": generation_identity(loaded.cfg),
                "runs": runs, "levers": [asdict(lv) for lv in levers], "torch": torch.__version__,
                "estimator": "median of per-batch paired ratios, equal work; sign test p < 0.05"}
    if engine != "fairseq":
        import ctranslate2

        identity["ctranslate2"] = ctranslate2.__version__
    return json.loads(json.dumps(identity))  # as stored (tuples as lists)


def generation_identity(cfg) -> Dict:
    """The decoding options that can change a hypothesis (records.identity), or beam and length penalty alone for a
    config that is not fairseq's own (the benchmark's random models)."""
    try:
        return decoding_identity(cfg)["generation"]
    except Exception:  # noqa: BLE001 - a stand-in config without fairseq's sections
        return {"beam": int(cfg.generation.beam), "lenpen": float(getattr(cfg.generation, "lenpen", 1.0))}


def identity_key(identity: Mapping) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]


def default_cache() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "fairseq-headprune", "cost-tables")


def cached_table(cache_dir: Optional[str], identity: Mapping) -> Optional[Dict]:
    """The decided table of this identity measured before, or for a table without the vocabulary map's row, one of
    the same identity but for the map (a run that weighed it) with that row dropped and `map_row_dropped` set: every
    row is paired with the unpruned model's seconds of its own interleaved rounds and each lever is smoothed alone,
    so its other rows are what the table without the map would measure."""
    if not cache_dir:
        return None
    table = read_json(os.path.join(cache_dir, f"cost-table-{identity_key(identity)}.json"))
    if table and table.get("identity") == identity and decided(table):
        return table
    if "vocab_map" in identity or not os.path.isdir(cache_dir):
        return None
    for name in sorted(os.listdir(cache_dir)):
        table = read_json(os.path.join(cache_dir, name)) if name.startswith("cost-table-") else None
        with_map = (table or {}).get("identity") or {}
        if "vocab_map" in with_map and {k: v for k, v in with_map.items() if k != "vocab_map"} == identity \
                and decided(table):
            return {**table, "identity": dict(identity), "map_row_dropped": True,
                    "rows": [r for r in table["rows"] if r["field"] != MAP]}
    return None


def store_table(cache_dir: Optional[str], table: Dict) -> Optional[str]:
    if not cache_dir:
        return None
    try:
        os.makedirs(cache_dir, exist_ok=True)
        path = os.path.join(cache_dir, f"cost-table-{identity_key(table['identity'])}.json")
        write_json_atomic(path, table)
        return path
    except OSError:  # a cache that cannot be written costs a re-measurement next time, nothing else
        return None


LOADED = 1.5  # a 1-minute load average above this while timing: another CPU-bound process ran beside the timing


def time_shapes(loaded, engine: str, samples, runs: int, shapes: Mapping[str, object], log=print, progress=None,
                decoder_factory=None, vocab_map: Optional[str] = None, mapped: Collection[str] = (),
                threads: int = 1) -> Dict:
    """Time crude slices of the unpruned model (core.surgery.crude_model, one per Shape) beside the
    unpruned model at equal work, interleaved: each shape's speed-up (seconds paired per round) and FLOP ratio.
    The slices are timed in groups whose models fit in memory together (memory_groups: one group for a small
    model), each group interleaved with the unpruned model, each slice paired with the unpruned model's seconds of
    its own group. The shapes named in `mapped` decode with the vocabulary map `vocab_map` (CTranslate2's vmap.txt;
    the unpruned model never does), and their translations as decoded, and the unpruned model's, are returned
    (`natural`). `decoder_factory(model, target_dictionary, folder, vocab_map)` -> run(samples, forced) replaces the
    engine (tests)."""
    shape_of = ModelShape.of if engine == "fairseq" else ct2_shape
    with tempfile.TemporaryDirectory(prefix="cost-table-") as tmp:
        def build(model, dictionary, name, vmap=None):
            if decoder_factory:
                return decoder_factory(model, dictionary, os.path.join(tmp, name), vmap)
            return EngineModel(loaded, engine, model, dictionary, os.path.join(tmp, name), vocab_map=vmap,
                               threads=threads).run

        unpruned = build(loaded.model, None, "unpruned")
        natural = unpruned(samples, 0)
        length = max(1, round(statistics.mean(len(h) for h in natural["hypotheses"].values())))
        model_bytes = folder_bytes(os.path.join(tmp, "unpruned")) or parameter_bytes(loaded.model)  # ct2, fairseq
        groups = memory_groups(list(shapes), model_bytes, available_memory())
        log(f"timing {len(shapes)} shape(s) and the unpruned model in {engine}: {runs} rounds of "
            f"{sum(s['id'].numel() for s in samples)} sentences at equal work ({length} tokens + 1 step)"
            + (f", in {len(groups)} groups of at most {len(groups[0])} (as many models as fit in memory together)"
               if len(groups) > 1 else ""))
        index = {key: i for i, key in enumerate(shapes)}
        seconds, paired, cost_shapes, translations = {"unpruned": []}, {}, {}, {}
        for keys in groups:
            decoders = {"unpruned": unpruned}
            for key in keys:
                model, dictionary = crude_model(loaded.model, loaded.task.target_dictionary, shapes[key])
                cost_shapes[key] = shape_of(model)  # the cost shape only: the model itself is not kept
                decoders[key] = build(model, dictionary, f"shape{index[key]}", vocab_map if key in mapped else None)
                del model
            translations.update({k: decoders[k](samples, 0)["hypotheses"] for k in keys if k in mapped})
            timed = timed_rounds(decoders, samples, runs, length, progress)
            seconds["unpruned"] += timed["unpruned"]
            for key in keys:
                seconds[key], paired[key] = timed[key], timed["unpruned"]
                shutil.rmtree(os.path.join(tmp, f"shape{index[key]}"), ignore_errors=True)
            del decoders, timed  # the group's models freed before the next group's are built
    return {"forced_length": length, "unpruned_seconds": round(statistics.mean(seconds["unpruned"]), 4),
            "load_average": load_average(), "natural": {"unpruned": natural["hypotheses"], **translations},
            "speedup": {k: round(paired_speedup(paired[k], seconds[k]), 4) for k in shapes},
            "interval": {k: speedup_interval(paired[k], seconds[k], len(samples)) for k in shapes},
            "faster": {k: sign_test(paired[k], seconds[k]) for k in shapes},
            "flop_ratio": flop_ratios(loaded, samples, shape_of(loaded.model), cost_shapes, length)}


def flop_ratios(loaded, samples, base, cost_shapes: Mapping[str, object], length: int) -> Dict[str, float]:
    """The unpruned model's decoding FLOPs over each shape's, at the forced length and the samples' batching."""
    src = [int(n) for s in samples for n in s["net_input"]["src_lengths"].tolist()]
    beam, batch = int(loaded.cfg.generation.beam), max(s["id"].numel() for s in samples)
    return {k: round(flops.flop_ratio(base, shape, src, [length + 1] * len(src), beam, batch), 4)
            for k, shape in cost_shapes.items()}


MEMORY_SHARE = 0.5  # of the memory available when the timing starts, for the slices' models
RESIDENT_PER_BYTE_ON_DISK = 2.0  # a CTranslate2 model in memory against its folder on disk (seen: about 1.6)


def memory_groups(keys: List[str], model_bytes: int, available: Optional[int]) -> List[List[str]]:
    """The shapes in groups whose models fit in memory together (MEMORY_SHARE of `available`, each slice counted as
    large as the unpruned model's `model_bytes` on disk, RESIDENT_PER_BYTE_ON_DISK times that in memory): all in
    one group when they fit, or when either size is unknown (0 or None)."""
    if not keys:
        return []
    if not model_bytes or not available:
        return [keys]
    per = max(1, int(MEMORY_SHARE * available // (RESIDENT_PER_BYTE_ON_DISK * model_bytes)) - 1)
    return [keys[i:i + per] for i in range(0, len(keys), per)]


def folder_bytes(folder: str) -> int:
    """The bytes of the files under a folder (0 when there is none: a stand-in engine)."""
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(folder) for name in names)


def parameter_bytes(model) -> int:
    """The bytes of a torch model's parameters (what fairseq's engine holds of each slice)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def available_memory() -> Optional[int]:
    """The memory the system can give without swapping (Linux's MemAvailable), in bytes; None where unknown."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cost_table(loaded, engine: str, samples, runs: int, levers: Sequence[Lever] = LEVERS, log=print,
               progress=None, decoder_factory=None, vocab_map: Optional[str] = None, threads: int = 1) -> Dict:
    """The cost table: every lever's row timed beside the unpruned model (time_shapes), as JSON; with `vocab_map`
    (a vmap.txt), a row for the unpruned model decoding with it (MAP_ROW), with what the map changes in its
    translations of the timing sentences."""
    start = time.perf_counter()
    rows, sizes = lever_rows(loaded.model, levers), stack_sizes(loaded.model)
    shapes = {f"{lever.name}={value:g}": Shape.of_point({lever.field: value}, sizes) for lever, value in rows}
    if vocab_map:
        shapes[MAP_ROW] = Shape.of_point({}, sizes)  # the whole model, its output layer restricted by the map
    timed = time_shapes(loaded, engine, samples, runs, shapes, log, progress, decoder_factory, vocab_map,
                        mapped=[MAP_ROW] if vocab_map else (), threads=threads)
    table_rows = []
    for (lever, value), key in zip([*rows, *([(MAP_LEVER, 1.0)] if vocab_map else [])], shapes):
        speed = timed["speedup"][key]
        table_rows.append({"lever": lever.name, "field": lever.field, "value": value, "unit": lever.unit,
                           "removable": lever.removable, "speedup": speed, "time_saved": round(1 - 1 / speed, 4),
                           "sign_test": timed["faster"][key], "interval": timed["interval"][key],
                           "flop_ratio": timed["flop_ratio"][key]})
    if vocab_map:
        table_rows[-1]["translations"] = map_changes(loaded, samples, timed["natural"]["unpruned"],
                                                     timed["natural"][MAP_ROW])
    smooth(table_rows)
    return {"rows": table_rows, "forced_length": timed["forced_length"], "unpruned_seconds": timed["unpruned_seconds"],
            "sentences": sum(s["id"].numel() for s in samples), "whole": stack_sizes(loaded.model),
            "seconds": round(time.perf_counter() - start, 1)}


# The vocabulary map (compress --vocab-map) as a lever: not a shape but the engine's output layer restricted per
# batch to the candidates of its source words (prune.vocab_map). Its row is the whole model decoding with the map;
# a point {MAP: 1} is predicted with it (predict), every other field as it is.
MAP = MAP_FIELD
MAP_LEVER = Lever("vocabulary map", MAP, "the output layer scores the map's candidates of each batch", True)
MAP_ROW = "vocabulary map=1"


def map_changes(loaded, samples, unpruned: Mapping[int, List[int]], mapped: Mapping[int, List[int]]) -> Dict:
    """What the map changes in the unpruned model's translations of the timing sentences (as decoded, not forced):
    how many differ, and BLEU against their references on the model's own tokens (sacreBLEU, no tokenization: a
    comparison of the two, not a score to report)."""
    import sacrebleu

    target = loaded.task.target_dictionary
    ids = sorted(unpruned)
    pad = {target.pad()}
    references = {sid: target.string(t, extra_symbols_to_ignore=pad) for s in samples
                  for sid, t in zip(s["id"].tolist(), s["target"])} if all("target" in s for s in samples) else {}
    out = {"sentences": len(ids), "differing": sum(unpruned[i] != mapped.get(i) for i in ids)}
    if references:
        refs = [[references[i] for i in ids]]
        for name, hyps in (("bleu_without", unpruned), ("bleu_with", mapped)):
            out[name] = round(sacrebleu.corpus_bleu([target.string(hyps[i]) for i in ids], refs,
                                                    tokenize="none").score, 2)
    return out


SIGNIFICANCE = 0.05  # a row saves time only when its slice was faster in significantly more batches than not


def smooth(rows: List[Dict], significance: float = SIGNIFICANCE) -> None:
    """Each lever's `saved`: the time it saves, counted only when the sign test says the slice is faster at all
    (p < significance: a lever that buys nothing measures a few percent either way from the machine's noise), then
    made monotone (keeping less never costs more: pool-adjacent-violators, deepest value first) and never below
    zero. The raw `time_saved` stays beside it."""
    for field in {r["field"] for r in rows}:
        own = sorted((r for r in rows if r["field"] == field), key=lambda r: r["value"])  # deepest first
        blocks: List[List] = []  # [mean, weight, rows]
        for r in own:  # non-increasing in value: the deepest saves the most
            significant = r.get("sign_test", {"p": 0.0})["p"] < significance
            blocks.append([r["time_saved"] if significant else 0.0, 1, [r]])
            while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
                b = blocks.pop()
                a = blocks[-1]
                a[0] = (a[0] * a[1] + b[0] * b[1]) / (a[1] + b[1])
                a[1] += b[1]
                a[2] += b[2]
        for mean, _, members in blocks:
            for r in members:
                r["saved"] = round(max(mean, 0.0), 4)


# --------------------------------------------------------------------------------------------- predictions


def predict(table: Dict, point: Mapping[str, float]) -> float:
    """Predicted speed-up of a shape {field: value}: the shares of time each lever's row leaves (smoothed: 1 -
    `saved`), multiplied. A value the table did not measure (between rows) is read from the nearest measured values
    (linear)."""
    share = 1.0
    for field, value in point.items():
        if field == MAP:  # on or off: the map's row, or nothing
            share *= 1 - (map_saved(table) if value else 0.0)
            continue
        share *= 1 - saved(table, field, value)
    return 1 / max(share, 1e-6)


def map_saved(table: Dict) -> float:
    """The share of time the vocabulary map saves (its smoothed row), or one line when the table has no row for it."""
    row = next((r for r in table["rows"] if r["field"] == MAP), None)
    if row is None:
        raise ValueError("the cost table has no row for the vocabulary map")
    return row.get("saved", row["time_saved"])


def saved(table: Dict, field: str, value: float) -> float:
    rows = sorted(((r["value"], r.get("saved", r["time_saved"])) for r in table["rows"] if r["field"] == field))
    whole = table["whole"].get(field, 100.0)
    points = sorted(rows + [(whole, 0.0)])
    if value >= whole:
        return 0.0
    if not rows or value < points[0][0]:
        raise ValueError(f"{field}={value:g} is outside the cost table")
    for (a, sa), (b, sb) in zip(points, points[1:]):
        if a <= value <= b:
            return sa if b == a else sa + (sb - sa) * (value - a) / (b - a)
    raise ValueError(f"{field}={value:g} is outside the cost table")


def lever_order(table: Dict) -> List[Tuple[str, float]]:
    """Levers by the speed-up half of each buys on its own (half the heads of every layer of a stack, half the
    decoder's layers, half of every FFN's units; the map on; the output layer trimmed by --keep-vocab at its share;
    read from the smoothed rows), fastest first: (lever, predicted speed-up)."""
    out = {}
    for r in table["rows"]:
        if r["lever"] in out:
            continue
        if r["field"] == MAP:  # on, not half of it
            out[r["lever"]] = round(1 / (1 - map_saved(table)), 4)
            continue
        if r["removable"] and r["field"] == VOCAB:  # the trim's one share (--keep-vocab), not half
            out[f"{r['lever']} {r['value']:.0f}%"] = round(1 / (1 - r.get("saved", r["time_saved"])), 4)
            continue
        half = table["whole"].get(r["field"], 100.0) / 2
        try:
            out[r["lever"]] = round(1 / (1 - saved(table, r["field"], half)), 4)
        except (ValueError, ZeroDivisionError):
            continue
    return sorted(out.items(), key=lambda kv: -kv[1])


def best_unremovable(table: Dict, removable_best: Mapping[str, float]) -> Optional[Tuple[str, float]]:
    """The fastest shape the table predicts when the levers shrink cannot remove yet, at their deepest measured
    values, join the given removable values: (what they add, predicted speed-up), or None when there is none."""
    extra: Dict[str, Dict] = {}
    for r in table["rows"]:
        if not r["removable"] and (r["field"] not in extra or r["value"] < extra[r["field"]]["value"]):
            extra[r["field"]] = r
    if not extra:
        return None
    point = {**removable_best, **{k: r["value"] for k, r in extra.items()}}
    words = ", ".join(f"{r['lever']} at {r['value']:g}{'%' if r['field'].endswith('_percent') else ''}"
                      for r in extra.values())
    return words, predict(table, point)


def point_words(point: Mapping[str, float], levers: Sequence[Lever] = LEVERS) -> str:
    """A point in the levers' own words, in their order: "encoder heads 1, decoder heads 1, decoder layers 1"."""
    words = [f"{lv.name} {point[lv.field]:g}{'' if lv.counted else '%'}" for lv in levers if lv.field in point]
    return ", ".join(words + (["the vocabulary map"] if point.get(MAP) else []))


def markdown(table: Dict) -> str:
    lines = ["| lever | value | removable | x unpruned, equal work | faster in batches (p) | time saved | counted "
             "| FLOPs, unpruned over it |", "|---|---|---|---|---|---|---|---|"]
    for r in table["rows"]:
        sign = r.get("sign_test") or {}
        lines.append(f"| {r['lever']} | {r['value']:g} ({r['unit']}) | {'yes' if r['removable'] else 'not yet'} | "
                     f"{r['speedup']:.2f} | {sign.get('faster_batches', '')}/{sign.get('batches', '')} "
                     f"({sign.get('p', float('nan')):.3f}) | {100 * r['time_saved']:.1f}% | "
                     f"{100 * r.get('saved', 0):.1f}% | {r['flop_ratio']:.2f} |")
    return "\n".join(lines)


def refuse_unreachable(target: float, best: Tuple[Dict, float], table: Dict, engine: str) -> None:
    """One line: no removable shape reaches `target`; the best one (every removable lever's value) and what the
    other levers would add. A table whose sign tests could not decide says so instead: its zeros are not
    measurements."""
    point, speed = best
    if not decided(table):
        raise UserError(f"--speedup {target:g}: the cost table cannot tell: its rows saw as few as "
                        f"{fewest_paired(table)} paired batches, too few for the sign test (at least {MIN_PAIRED}); "
                        "give more --timing-sentences, a smaller --batch-size or more --runs")
    extra = best_unremovable(table, point)
    more = f"; with {extra[0]} (not a lever of compress yet) the table predicts {extra[1]:.2f}x" if extra else ""
    raise UserError(f"--speedup {target:g}: no shape reaches it in {engine} on this machine: the fastest, "
                    f"{point_words(point)}, is {speed:.2f}x the unpruned model{more}")
