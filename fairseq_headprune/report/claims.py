"""The papers' claims checked against this package's result files: pure functions from result rows to claim rows.

Each claim row carries the paper's number (quoted from the paper, the only typed-in numbers here), ours (computed
from the rows), a verdict computed by a stated rule, and the files it came from. A claim whose results do not exist
says "not run" and names the command that produces them; partial results say "incomplete", never a verdict.

Verdict rules (the thresholds are module constants, shown in every row's rule):
  C1  share of single heads whose removal is NOT a significant BLEU drop (compare-mt paired bootstrap, the
      ablation's own p threshold) > 50%, over encoder self-attention heads when the ablation has them (the
      paper's 8 of 96 is encoder self-attention only); the share over all heads ablated is shown beside it
  C2  share of layers whose best single head is NOT significantly worse than the full layer > 50%
  C3  largest % of heads pruned by importance (whole model) with every step so far within C3_TOLERANCE BLEU of
      the unpruned model >= C3_MIN_PERCENT (the paper: 20% on WMT, 40% on BERT)
  C4  per-type pruning curves (Figure 4): enc-dec has the lowest mean BLEU over the shared pruning levels; without
      per-type curves, single-head ablation: enc-dec has the most negative mean BLEU change
  C5  dynamics: the last epoch keeps, on average over the steps pruning (0, 50]% of heads, at least C5_MARGIN
      percentage points more of its own BLEU than the first epoch
  C6  speed at equal work: at the largest batch size the pruned model's sentences/s minus its standard deviation
      exceeds the masked model's plus its standard deviation, the two having written the same tokens (the masked
      model computes the same function with the unpruned model's work per step). Fields read from speed.json
      (`fairseq-headprune speed`), per batch size B: batch_sizes[B].masked/pruned.sentences_per_s and
      .sentences_per_s_std, batch_sizes[B].pruned.same_tokens_as_masked (must be true), .speedup_over_masked and
      .speedup_over_masked_std (quoted); top level: flop_ratio (quoted). Without them: "incomplete", never the
      free-length pruned-vs-unpruned figure (different translations, different work)
  V   L0 gates: each L0 model is compared with the λ = 0 control of the same number of updates and gated types
      when the sweep has one (the same fine-tuning without the penalty), else with the un-fine-tuned model (shown
      beside it in any case). Among the models within VOITA_TOLERANCE BLEU of their baseline, the largest share
      of encoder self-attention heads closed > 50% (Voita's 38 of 48 is encoder heads); the share of all heads
      closed is reported separately. Points without per-type counts are judged on all heads. Point fields
      (l0_points, from compare.jsonl): method, lambda, updates, types, heads_kept, heads_total, kept_per_type,
      closed_per_type, bleu
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from statistics import mean
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_headprune.core.heads import ATTENTION_TYPES, parse_head_spec
from fairseq_headprune.records.log import read_log
from fairseq_headprune.records.rows import best_per_layer

SUPPORTED, NOT_SUPPORTED, NOT_RUN, INCOMPLETE = "supported", "not supported", "not run", "incomplete"
TYPES = ATTENTION_TYPES
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
    whose: Optional[str] = None  # set when the rows come from a file of another model (report.sections.whose)

    def as_dict(self) -> Dict:
        return asdict(self)


# ---------------------------------------------------------------- reading result files (no fairseq needed)

def read_jsonl(path: str) -> Tuple[Dict, List[Dict]]:
    """(header, rows) of a results log, by the package's one reader (a torn last line is left out)."""
    return read_log(path)


def read_rows(path: Optional[str]) -> Optional[List[Dict]]:
    if not path or not os.path.exists(path):
        return None
    return read_log(path)[1]


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
    "C3": "20% (WMT) and 40% (BERT) of the heads can be pruned (importance order) without noticeable loss",
    "C4": "encoder-decoder attention is the most sensitive to pruning",
    "C5": "head importance separates during training",
    "C6": "pruned models decode faster (at equal work)",
    "V": "more than half of the encoder heads pruned by L0 gates for at most 0.25 BLEU",
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
    """The verdict follows the paper's scope (encoder self-attention) when the ablation has such heads; the
    share over every head ablated is reported beside it."""
    rule = ("share of heads whose removal alone is not a significant BLEU drop > 50%, over encoder "
            "self-attention heads (the paper's scope) when ablated, else over all heads")
    if rows is None:
        return _not_run("C1", rule, command, "single-head ablation")
    heads = _results(rows)
    if not heads or (expected and len(heads) < expected):
        return _claim("C1", f"{len(heads)} of {expected or '?'} heads ablated so far", INCOMPLETE, rule, (source,),
                      command)

    def removable(subset: Sequence[Dict]) -> Tuple[int, float]:
        fine = len(subset) - sum(_significant_drop(r) for r in subset)
        return fine, 100.0 * fine / len(subset)

    drops = sum(_significant_drop(r) for r in heads)
    gains = sum(bool(r.get("significant")) and r["delta"] > 0 for r in heads)
    fine_all, share_all = removable(heads)
    pooled = (f"{fine_all} of {len(heads)} heads removable ({share_all:.0f}%); {drops} significant drops, "
              f"{gains} significant gains")
    enc = [r for r in heads if r.get("type") == "enc-self"]
    if not enc:
        return _claim("C1", pooled, SUPPORTED if share_all > 50 else NOT_SUPPORTED, rule, (source,))
    fine_enc, share_enc = removable(enc)
    enc_gains = sum(bool(r.get("significant")) and r["delta"] > 0 for r in enc)
    ours = (f"enc-self: {fine_enc} of {len(enc)} heads removable ({share_enc:.0f}%; {len(enc) - fine_enc} "
            f"significant drops, {enc_gains} significant gains); all types: {pooled}")
    return _claim("C1", ours, SUPPORTED if share_enc > 50 else NOT_SUPPORTED, rule, (source,))


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
    """Equal work only: the pruned model against the masked one (same function, identical hypotheses). A
    speed.json without that comparison is "incomplete": the free-length pruned-vs-unpruned speed-up also counts
    the pruned model's different translations (see the module docstring for the fields read)."""
    rule = ("equal work: at the largest batch size, pruned sentences/s - std > masked sentences/s + std, both "
            "having written the same tokens (faster beyond run-to-run noise)")
    if not speed or not speed.get("batch_sizes"):
        return _not_run("C6", rule, command, "speed measurement")
    sizes = sorted(speed["batch_sizes"], key=int)
    row = speed["batch_sizes"][sizes[-1]]
    ma, pr = row.get("masked"), row.get("pruned") or {}
    needed = ("sentences_per_s", "sentences_per_s_std")
    if (not ma or not all(k in ma and k in pr for k in needed) or "same_tokens_as_masked" not in pr
            or "speedup_over_masked" not in pr):
        return _claim("C6", "speed.json has no equal-work measurement (pruned vs masked with the same hypotheses)",
                      INCOMPLETE, rule, (source,), command)
    if not pr["same_tokens_as_masked"]:
        return _claim("C6", f"at batch {sizes[-1]} the pruned and masked models wrote different tokens: not equal "
                      "work", INCOMPLETE, rule, (source,), command)
    faster = pr["sentences_per_s"] - pr["sentences_per_s_std"] > ma["sentences_per_s"] + ma["sentences_per_s_std"]

    def up(b: str) -> str:
        p = speed["batch_sizes"][b].get("pruned", {})
        if "speedup_over_masked" not in p:
            return f"batch {b}: -"
        std = p.get("speedup_over_masked_std")
        return f"batch {b}: x{p['speedup_over_masked']:.2f}" + (f"±{std:.2f}" if std is not None else "")

    ratio = speed.get("flop_ratio")
    ours = (f"{speed['heads_pruned']} of {speed['heads_total']} heads pruned; equal-work speed-up (pruned over "
            f"masked, same hypotheses) {', '.join(up(b) for b in sizes)}"
            + (f"; FLOP ratio x{ratio:.2f}" if ratio is not None else "")
            + (f", cache-reorder copy ratio x{speed['reorder_ratio']:.2f}" if speed.get("reorder_ratio") else ""))
    if "speedup" in pr:
        ours += f"; free-length pruned over unpruned x{pr['speedup']:.2f} at batch {sizes[-1]} (not equal work)"
    return _claim("C6", ours, SUPPORTED if faster else NOT_SUPPORTED, rule, (source,))


def _same_run_shape(a: Dict, b: Dict) -> bool:
    """Two L0 points fine-tuned alike: the same known number of updates and the same gated types."""
    return (a.get("updates") is not None and a.get("updates") == b.get("updates")
            and sorted(a.get("types") or []) == sorted(b.get("types") or []))


def _encoder_counts(p: Dict) -> Optional[Tuple[int, int]]:
    """(encoder self-attention heads closed, enc-self heads in the model), if the point has per-type counts."""
    kept, closed = p.get("kept_per_type"), p.get("closed_per_type")
    if not kept or closed is None or "enc-self" not in kept:
        return None
    total = kept["enc-self"] + closed.get("enc-self", 0)
    return (closed.get("enc-self", 0), total) if total else None


def claim_voita(points: Optional[Sequence[Dict]], command: Optional[str] = None, source: str = "",
                encoder_only: Optional[Sequence[Dict]] = None, encoder_source: str = "") -> Claim:
    """`points` (l0_points): the L0 models (method "l0") against the full model (method "unpruned"); points of
    other methods (Michel's masks at the same numbers of heads) do not enter the verdict. λ = 0 points are
    controls (the baseline of the L0 models fine-tuned alike), not candidates.

    `encoder_only`: a sweep with encoder self-attention gated alone (Voita's main experiment, their 38 of 48).
    When given, the verdict is that sweep's, and the sweep of all types (`points`) is quoted beside it."""
    if not encoder_only:
        return _voita_verdict(points, command, source)
    alone = _voita_verdict(encoder_only, command, encoder_source, all_types=False)
    ours = f"encoder self-attention gated alone: {alone.ours}"
    sources = alone.sources
    if points:
        pooled = _voita_verdict(points, command, source)
        ours += f". All three types gated: {pooled.ours}"
        sources += pooled.sources
    return replace(alone, ours=ours, sources=sources, rule=alone.rule + "; the sweep with encoder "
                               "self-attention gated alone decides when there is one (the paper's setting)")


def _voita_verdict(points: Optional[Sequence[Dict]], command: Optional[str] = None, source: str = "",
                   all_types: bool = True) -> Claim:
    """claim_voita on one sweep; all_types: quote the share of all heads beside the encoder's."""
    rule = (f"largest share of encoder self-attention heads closed by L0 gates (all heads when the points have no "
            f"per-type counts) among models within {VOITA_TOLERANCE} BLEU of their baseline > {VOITA_MIN_SHARE:.0f}%; "
            "baseline: the λ = 0 control of the same updates and gated types when the sweep has one, else the "
            "un-fine-tuned model")
    points = [p for p in points or [] if p.get("method", "l0") in ("unpruned", "l0")]
    l0 = [p for p in points if p.get("method", "l0") == "l0"]
    if not l0:
        return _not_run("V", rule, command, "L0 λ sweep")
    full = ([p for p in points if p.get("method") == "unpruned"]
            or [p for p in points if p["heads_kept"] == p["heads_total"]])
    if not full:
        return _claim("V", "the sweep has no full-model point to compare with", INCOMPLETE, rule, (source,), command)
    untuned = full[0]["bleu"]
    controls = [p for p in l0 if p.get("lambda") == 0]
    candidates = [p for p in l0 if p.get("lambda") != 0]
    if not candidates:
        return _claim("V", "the sweep has only λ = 0 controls", INCOMPLETE, rule, (source,), command)

    by_encoder = all(_encoder_counts(p) for p in candidates)
    within = [p for p in candidates if p["bleu"] >= _voita_baseline(p, controls, untuned)[0] - VOITA_TOLERANCE]
    if not within:
        nearest = max(candidates, key=lambda p: p["bleu"] - _voita_baseline(p, controls, untuned)[0])
        return _claim("V", f"no L0 model within {VOITA_TOLERANCE} BLEU of its baseline; the nearest: "
                      + _voita_describe(nearest, by_encoder, controls, untuned), NOT_SUPPORTED, rule, (source,))
    best = max(within, key=lambda p: _voita_share(p, by_encoder))
    ours = _voita_describe(best, by_encoder, controls, untuned)
    if by_encoder and all_types:
        best_all = max(within, key=lambda p: _voita_share(p, False))
        ours = f"encoder self-attention: {ours}; all types: {_voita_describe(best_all, False, controls, untuned)}"
    return _claim("V", ours, SUPPORTED if _voita_share(best, by_encoder) > VOITA_MIN_SHARE else NOT_SUPPORTED,
                  rule, (source,))


def _voita_baseline(p: Dict, controls: Sequence[Dict], untuned: float) -> Tuple[float, Optional[Dict]]:
    """The BLEU an L0 point is judged against: its λ = 0 control of the same run shape (and that control), else
    the un-fine-tuned model's (and None)."""
    control = next((c for c in controls if _same_run_shape(c, p)), None)
    return (control["bleu"], control) if control else (untuned, None)


def _voita_closed(p: Dict, encoder: bool) -> Tuple[int, int]:
    """(heads closed, heads in all) of a point: encoder self-attention only, or every head."""
    return _encoder_counts(p) if encoder else (p["heads_total"] - p["heads_kept"], p["heads_total"])


def _voita_share(p: Dict, encoder: bool) -> float:
    """The percentage of heads a point closed (encoder self-attention only, or all)."""
    shut, total = _voita_closed(p, encoder)
    return 100.0 * shut / total


def _voita_describe(p: Dict, encoder: bool, controls: Sequence[Dict], untuned: float) -> str:
    """One L0 point in words: heads closed, its λ and updates, and its BLEU against its baseline."""
    shut, total = _voita_closed(p, encoder)
    base, control = _voita_baseline(p, controls, untuned)
    label = f"λ={p['lambda']}" if p.get("lambda") is not None else ""
    if p.get("updates") is not None:
        label += f", {p['updates']} updates"
    what = "encoder self-attention heads" if encoder else "heads"
    text = (f"{shut} of {total} {what} closed" + (f" ({label.lstrip(', ')})" if label else "")
            + f", BLEU {p['bleu']:.2f} vs {base:.2f} ({p['bleu'] - base:+.2f})")
    if control:
        text += (f" against the λ = 0 control of the same fine-tuning; un-fine-tuned model {untuned:.2f} "
                 f"({p['bleu'] - untuned:+.2f})")
    else:
        text += " against the un-fine-tuned model (no λ = 0 control of the same updates)"
    return text


# ---------------------------------------------------------------- Voita's L0 sweep

def l0_points(path: str) -> List[Dict]:
    """The points of an L0 λ sweep: DIR/compare.jsonl of `fairseq-headprune compare` (header: total_heads; rows:
    method "unpruned" (the full model), "l0" (a gated checkpoint: l0_lambda, updates, types gated, heads_kept =
    heads whose gate is not closed, kept_per_type, masked = its closed heads) or "michel" (the unpruned model with
    as many heads masked by I_h), each with its BLEU).

    Each point: method, lambda, updates, types, heads_kept, heads_total, kept_per_type, closed_per_type (from
    `masked`; None without it), bleu."""
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
        closed = None
        if "masked" in r:
            closed = {t: 0 for t in TYPES}
            for h in parse_head_spec(r["masked"]) if r["masked"] else []:
                closed[h.type] += 1
        points.append({"method": method, "lambda": r.get("l0_lambda"), "updates": r.get("updates"),
                       "types": r.get("types"), "heads_kept": r["heads_kept"], "heads_total": heads_total,
                       "kept_per_type": r.get("kept_per_type"), "closed_per_type": closed, "bleu": r["bleu"]})
    return points


def l0_figures(path: str) -> List[str]:
    """The figure written beside the sweep file (compare.jsonl -> compare.png), if any."""
    png = os.path.splitext(path)[0] + ".png"
    return [png] if os.path.exists(png) else []
