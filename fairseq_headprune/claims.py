"""The papers' claims checked against this package's result files: pure functions from result rows to claim rows.

Each claim row carries the paper's number (quoted from the paper, the only typed-in numbers here), ours (computed
from the rows), a verdict computed by a stated rule, and the files it came from. A claim whose results do not exist
says "not run" and names the command that produces them; partial results say "incomplete", never a verdict.

Verdict rules (the thresholds are module constants, shown in every row's rule):
  C1  share of single heads whose removal is NOT a significant BLEU drop (compare-mt paired bootstrap, the
      ablation's own p threshold) > 50%
  C2  share of layers whose best single head is NOT significantly worse than the full layer > 50%
  C3  largest % of heads pruned by importance (whole model) with every step so far within C3_TOLERANCE BLEU of
      the unpruned model >= C3_MIN_PERCENT
  C4  per-type pruning curves (Figure 4): enc-dec has the lowest mean BLEU over the shared pruning levels; without
      per-type curves, single-head ablation: enc-dec has the most negative mean BLEU change
  C5  dynamics: the last epoch keeps, on average over the steps pruning (0, 50]% of heads, at least C5_MARGIN
      percentage points more of its own BLEU than the first epoch
  C6  speed: at the largest batch size the pruned model's sentences/s minus its standard deviation exceeds the
      unpruned model's plus its standard deviation (faster beyond run-to-run noise)
  V   L0 gates: among the λ sweep points within VOITA_TOLERANCE BLEU of the full model, the largest share of
      gated heads closed > 50%
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from statistics import mean
from typing import Dict, List, Optional, Sequence, Tuple

SUPPORTED, NOT_SUPPORTED, NOT_RUN, INCOMPLETE = "supported", "not supported", "not run", "incomplete"
TYPES = ("enc-self", "enc-dec", "dec-self")
C3_TOLERANCE = 0.5
C3_MIN_PERCENT = 20.0
C5_MARGIN = 10.0
C5_WINDOW = (0.0, 50.0)
VOITA_TOLERANCE = 0.25
VOITA_MIN_SHARE = 50.0


@dataclass
class Claim:
    id: str
    claim: str
    paper: str
    ours: str
    verdict: str
    rule: str
    sources: Tuple[str, ...] = ()
    command: Optional[str] = None  # what to run when the verdict is "not run"

    def as_dict(self) -> Dict:
        return asdict(self)


# ---------------------------------------------------------------- reading result files (no fairseq needed)

def read_jsonl(path: str) -> Tuple[Dict, List[Dict]]:
    """(header, rows) of a results log; a torn last line (a run killed mid-write) is ignored, not repaired."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    parsed = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # torn last line
                break
            raise ValueError(f"{path}: line {i + 1} is not JSON") from None
    if not parsed or "header" not in parsed[0]:
        return {}, parsed
    return parsed[0]["header"], parsed[1:]


def read_rows(path: Optional[str]) -> Optional[List[Dict]]:
    if not path or not os.path.exists(path):
        return None
    return read_jsonl(path)[1]


def read_json(path: Optional[str]) -> Optional[Dict]:
    if not path or not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# ---------------------------------------------------------------- the claims

PAPER = {
    "C1": "WMT En-Fr, encoder self-attention: only 8 of 96 heads change BLEU significantly when removed alone, "
          "half of them for the better (Michel et al. §3.2, Table 1): 92 of 96 removable",
    "C2": "most layers can be reduced to one head at test time (Tables 2, 3); the exception: the last enc-dec "
          "layer of the WMT model loses at least 13.5 BLEU (§3.3)",
    "C3": "20% (WMT) and 40% (BERT) of all heads pruned without noticeable loss (§4.2, Figure 3)",
    "C4": "enc-dec attention is the most sensitive to pruning; self-attention can be pruned much further "
          "(§5, Figure 4)",
    "C5": "IWSLT De-En: in the first epochs BLEU falls about linearly with the heads pruned; later, important "
          "heads separate and many heads can be pruned for little loss (§6, Figure 5)",
    "C6": "BERT with 50% of its heads pruned: up to 17.5% faster inference at larger batch sizes (§4.3, Table 4)",
    "V": "WMT En-Ru: 38 of 48 encoder heads pruned for -0.15 BLEU (Voita et al. 2019, L0 gates)",
}
CLAIM_TEXT = {
    "C1": "most single heads can be removed without a significant BLEU loss",
    "C2": "many layers can be reduced to one head",
    "C3": "20-60% of the heads can be pruned (importance order) without noticeable loss",
    "C4": "encoder-decoder attention is the most sensitive to pruning",
    "C5": "head importance separates during training",
    "C6": "pruned models decode faster",
    "V": "more than half of the heads pruned for at most 0.25 BLEU",
}


def _claim(cid: str, ours: str, verdict: str, rule: str, sources=(), command=None) -> Claim:
    return Claim(cid, CLAIM_TEXT[cid], PAPER[cid], ours, verdict, rule, tuple(sources), command)


def _not_run(cid: str, rule: str, command: Optional[str], what: str) -> Claim:
    return _claim(cid, f"no {what}", NOT_RUN, rule, (), command)


def _results(rows: Sequence[Dict]) -> List[Dict]:
    return [r for r in rows if r.get("key") != "baseline"]


def _significant_drop(row: Dict) -> bool:
    return bool(row.get("significant")) and row["delta"] < 0


def claim_single_heads(rows: Optional[Sequence[Dict]], expected: Optional[int] = None,
                       command: Optional[str] = None, source: str = "ablation-single.jsonl") -> Claim:
    rule = "share of heads whose removal alone is not a significant BLEU drop > 50%"
    if rows is None:
        return _not_run("C1", rule, command, "single-head ablation")
    heads = _results(rows)
    if not heads or (expected and len(heads) < expected):
        return _claim("C1", f"{len(heads)} of {expected or '?'} heads ablated so far", INCOMPLETE, rule, (source,),
                      command)
    drops = sum(_significant_drop(r) for r in heads)
    gains = sum(bool(r.get("significant")) and r["delta"] > 0 for r in heads)
    share = 100.0 * (len(heads) - drops) / len(heads)
    ours = (f"{len(heads) - drops} of {len(heads)} heads removable ({share:.0f}%); {drops} significant drops, "
            f"{gains} significant gains")
    return _claim("C1", ours, SUPPORTED if share > 50 else NOT_SUPPORTED, rule, (source,))


def best_per_layer(rows: Sequence[Dict]) -> List[Dict]:
    """The keep-one row with the highest BLEU for each (type, layer)."""
    best: Dict[Tuple[str, int], Dict] = {}
    for row in _results(rows):
        key = (row["type"], row["layer"])
        if key not in best or row["bleu"] > best[key]["bleu"]:
            best[key] = row
    return [best[k] for k in sorted(best, key=lambda k: (TYPES.index(k[0]), k[1]))]


def claim_keep_one(rows: Optional[Sequence[Dict]], expected_layers: Optional[int] = None,
                   command: Optional[str] = None, source: str = "ablation-keep-one.jsonl",
                   heads_per_layer: Optional[Dict[Tuple[str, int], int]] = None, selected_by: str = "bleu") -> Claim:
    """`rows`: every head of each layer tried (the best by BLEU counts), or with selected_by="loss" one row per
    layer, its head chosen by teacher-forced NLL (heads_per_layer then 1 each): a conservative check of the same
    claim, since the chosen head's BLEU is at most the best head's."""
    rule = "share of layers whose best single head is not significantly worse than the full layer > 50%"
    if selected_by == "loss":
        rule = ("share of layers whose single head chosen by lowest NLL is not significantly worse (BLEU) than the "
                "full layer > 50%")
    if rows is None:
        return _not_run("C2", rule, command, "keep-one ablation")
    if heads_per_layer:  # a layer counts once every one of its heads has been tried alone
        tried: Dict[Tuple[str, int], int] = {}
        for r in _results(rows):
            tried[(r["type"], r["layer"])] = tried.get((r["type"], r["layer"]), 0) + 1
        complete = all(tried.get(k, 0) >= n for k, n in heads_per_layer.items())
    else:
        complete = bool(_results(rows))
    best = best_per_layer(rows)
    if not complete or (expected_layers and len(best) < expected_layers):
        return _claim("C2", f"{len(_results(rows))} keep-one masks decoded so far", INCOMPLETE, rule, (source,),
                      command)
    fine = [r for r in best if not _significant_drop(r)]
    worst = min(best, key=lambda r: r["delta"])
    share = 100.0 * len(fine) / len(best)
    ours = (f"{len(fine)} of {len(best)} layers keep BLEU with one head ({share:.0f}%); worst: {worst['type']} "
            f"layer {worst['layer']} {worst['delta']:+.2f} BLEU")
    return _claim("C2", ours, SUPPORTED if share > 50 else NOT_SUPPORTED, rule, (source,))


def pruning_curve(rows: Sequence[Dict], order: str, types: Sequence[str]) -> List[Tuple[float, float]]:
    """(% pruned, BLEU) of one order and set of types, sorted."""
    return sorted((r["percent_pruned"], r["bleu"]) for r in rows
                  if r.get("order") == order and set(r.get("types", [])) == set(types))


def prunable_percent(curve: Sequence[Tuple[float, float]], tolerance: float) -> Optional[float]:
    """The largest % pruned such that every step up to it stays within `tolerance` BLEU of 0% pruned."""
    if not curve or curve[0][0] != 0:
        return None
    base, best = curve[0][1], 0.0
    for percent, bleu in curve:
        if bleu < base - tolerance:
            break
        best = percent
    return best


def claim_prunable(rows: Optional[Sequence[Dict]], command: Optional[str] = None,
                   source: str = "pruning.jsonl") -> Claim:
    rule = (f"largest % of all heads pruned by importance with every step within {C3_TOLERANCE} BLEU of the "
            f"unpruned model >= {C3_MIN_PERCENT:.0f}%")
    curve = pruning_curve(rows or [], "importance", TYPES)
    if rows is None or not curve:
        return _not_run("C3", rule, command, "importance pruning curve of the whole model")
    percent = prunable_percent(curve, C3_TOLERANCE)
    if percent is None:
        return _claim("C3", "the curve has no 0% point", INCOMPLETE, rule, (source,), command)
    at = dict(curve)[percent]
    ours = f"{percent:.0f}% of heads pruned, BLEU {at:.2f} vs {curve[0][1]:.2f} unpruned"
    extra = []
    for order in ("oracle", "random"):
        other = prunable_percent(pruning_curve(rows, order, TYPES), C3_TOLERANCE)
        if other is not None:
            extra.append(f"{order} order: {other:.0f}%")
    if extra:
        ours += " (" + "; ".join(extra) + ")"
    return _claim("C3", ours, SUPPORTED if percent >= C3_MIN_PERCENT else NOT_SUPPORTED, rule, (source,))


def type_sensitivity_from_pruning(rows: Sequence[Dict]) -> Optional[Dict[str, float]]:
    """Mean BLEU of each type's own importance pruning curve over the pruning levels all three share."""
    curves = {t: dict(pruning_curve(rows, "importance", [t])) for t in TYPES}
    if not all(curves.values()):
        return None
    shared = set.intersection(*(set(round(p, 6) for p in c) for c in curves.values()))
    if len(shared) < 2:
        return None
    return {t: mean(v for p, v in c.items() if round(p, 6) in shared) for t, c in curves.items()}


def claim_enc_dec_sensitive(pruning_rows: Optional[Sequence[Dict]], single_rows: Optional[Sequence[Dict]],
                            command: Optional[str] = None, sources=("pruning.jsonl", "ablation-single.jsonl")
                            ) -> Claim:
    by_pruning = type_sensitivity_from_pruning(pruning_rows or [])
    if by_pruning:
        rule = ("each type pruned alone by importance (Figure 4): enc-dec has the lowest mean BLEU over the "
                "pruning levels the three curves share")
        ranked = sorted(by_pruning, key=by_pruning.get)
        ours = "mean BLEU over the curve: " + ", ".join(f"{t} {by_pruning[t]:.2f}" for t in ranked)
        return _claim("C4", ours, SUPPORTED if ranked[0] == "enc-dec" else NOT_SUPPORTED, rule, (sources[0],))
    rule = ("(no per-type pruning curves) single-head ablation: enc-dec has the most negative mean BLEU change "
            "when one of its heads is removed")
    heads = _results(single_rows or [])
    means = {t: mean(r["delta"] for r in heads if r["type"] == t) for t in TYPES
             if any(r["type"] == t for r in heads)}
    if single_rows is None or len(means) < len(TYPES):
        return _not_run("C4", rule, command, "per-type pruning curves or complete single-head ablation")
    ranked = sorted(means, key=means.get)
    ours = "mean BLEU change per removed head: " + ", ".join(f"{t} {means[t]:+.3f}" for t in ranked)
    return _claim("C4", ours, SUPPORTED if ranked[0] == "enc-dec" else NOT_SUPPORTED, rule, (sources[1],))


def claim_dynamics(rows: Optional[Sequence[Dict]], command: Optional[str] = None,
                   source: str = "dynamics.jsonl") -> Claim:
    low, high = C5_WINDOW
    rule = (f"mean % of the epoch's BLEU kept over the steps pruning ({low:.0f}, {high:.0f}]% of heads: last epoch "
            f">= first epoch + {C5_MARGIN:.0f} points")
    epochs = sorted({r["epoch"] for r in rows or [] if "epoch" in r})
    if rows is None or len(epochs) < 2:
        return _not_run("C5", rule, command, "training dynamics with two or more epochs")

    def kept(epoch: int) -> Optional[float]:
        values = [r["bleu_retained"] for r in rows if r.get("epoch") == epoch and low < r["percent_pruned"] <= high]
        return mean(values) if values else None

    first, last = kept(epochs[0]), kept(epochs[-1])
    if first is None or last is None:
        return _claim("C5", "no pruning steps in the window", INCOMPLETE, rule, (source,), command)
    ours = (f"epoch {epochs[0]} keeps {first:.0f}% of its BLEU, epoch {epochs[-1]} keeps {last:.0f}% "
            f"(mean over {low:.0f}-{high:.0f}% of heads pruned)")
    return _claim("C5", ours, SUPPORTED if last >= first + C5_MARGIN else NOT_SUPPORTED, rule, (source,))


def claim_speed(speed: Optional[Dict], command: Optional[str] = None, source: str = "speed.json") -> Claim:
    rule = ("at the largest batch size, pruned sentences/s - std > unpruned sentences/s + std (faster beyond "
            "run-to-run noise)")
    if not speed or not speed.get("batch_sizes"):
        return _not_run("C6", rule, command, "speed measurement")
    sizes = sorted(speed["batch_sizes"], key=int)
    row = speed["batch_sizes"][sizes[-1]]
    un, pr = row["unpruned"], row["pruned"]
    faster = pr["sentences_per_s"] - pr["sentences_per_s_std"] > un["sentences_per_s"] + un["sentences_per_s_std"]
    ups = ", ".join(f"batch {b}: x{speed['batch_sizes'][b]['pruned']['speedup']:.2f}" for b in sizes)
    ours = (f"{speed['heads_pruned']} of {speed['heads_total']} heads pruned; tokens/s speed-up {ups} "
            f"(FLOP bound x{speed.get('flop_bound_speedup', float('nan')):.2f})")
    return _claim("C6", ours, SUPPORTED if faster else NOT_SUPPORTED, rule, (source,))


def claim_voita(points: Optional[Sequence[Dict]], command: Optional[str] = None, source: str = "") -> Claim:
    """`points` (l0_points): the L0 models (method "l0") against the full model (method "unpruned"); points of
    other methods (Michel's masks at the same numbers of heads) do not enter the verdict."""
    rule = (f"largest share of heads closed by L0 gates among λ points within {VOITA_TOLERANCE} BLEU of the "
            f"unpruned model > {VOITA_MIN_SHARE:.0f}%")
    points = [p for p in points or [] if p.get("method", "l0") in ("unpruned", "l0")]
    if not any(p.get("method", "l0") == "l0" for p in points):
        return _not_run("V", rule, command, "L0 λ sweep")
    full = [p for p in points if p.get("method") == "unpruned" or p["heads_kept"] == p["heads_total"]]
    if not full:
        return _claim("V", "the sweep has no full-model point to compare with", INCOMPLETE, rule, (source,), command)
    base = full[0]["bleu"]
    within = [p for p in points if p["bleu"] >= base - VOITA_TOLERANCE]
    best = max(within, key=lambda p: 1 - p["heads_kept"] / p["heads_total"])
    share = 100.0 * (1 - best["heads_kept"] / best["heads_total"])
    label = f" (λ={best['lambda']})" if best.get("lambda") is not None else ""
    ours = (f"{best['heads_total'] - best['heads_kept']} of {best['heads_total']} heads closed{label}, "
            f"BLEU {best['bleu']:.2f} vs {base:.2f} ({best['bleu'] - base:+.2f})")
    return _claim("V", ours, SUPPORTED if share > VOITA_MIN_SHARE else NOT_SUPPORTED, rule, (source,))


# ---------------------------------------------------------------- Voita's L0 sweep

def l0_points(path: str) -> List[Dict]:
    """The points of an L0 λ sweep: DIR/compare.jsonl of `fairseq-headprune compare` (header: total_heads; rows:
    method "unpruned" (the full model), "l0" (a gated checkpoint: l0_lambda, heads_kept = heads whose gate is not
    closed) or "michel" (the unpruned model with as many heads masked by I_h), each with its BLEU).

    Each point: method, lambda, heads_kept, heads_total, bleu."""
    header, rows = read_jsonl(path)
    total = header.get("total_heads")
    points = []
    for r in rows:
        if not {"heads_kept", "bleu"} <= r.keys():
            continue
        heads_total = r.get("heads_total", total)
        if heads_total is None:
            raise ValueError(f"{path}: no total_heads in its header: not a `compare` result file")
        method = r.get("method") or ("unpruned" if r["heads_kept"] == heads_total else "l0")
        points.append({"method": method, "lambda": r.get("l0_lambda"), "heads_kept": r["heads_kept"],
                       "heads_total": heads_total, "bleu": r["bleu"]})
    return points


def l0_figures(path: str) -> List[str]:
    """The figure written beside the sweep file (compare.jsonl -> compare.png), if any."""
    png = os.path.splitext(path)[0] + ".png"
    return [png] if os.path.exists(png) else []
