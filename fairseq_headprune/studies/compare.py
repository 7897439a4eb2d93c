"""Michel et al.'s I_h pruning and Voita et al.'s L0 gates at equal numbers of heads (`fairseq-headprune compare`).

    fairseq-headprune compare DATA --path UNPRUNED.pt --importance importance.json --gated A.pt B.pt ... \
        --results-dir DIR [--references RAW] [fairseq-generate decoding options]

For every gated checkpoint (fine-tuned with --gated-types and the label_smoothed_cross_entropy_l0 criterion)
its closed heads are counted; the unpruned model then has the same number of heads of the same attention types
masked in increasing I_h order (importance.json of `score`, ranked globally over those types, as `prune` does).
Rows on --gen-subset, appended to DIR/compare.jsonl as they finish (a rerun resumes; new checkpoints are
added to the same file):
  baseline       the unpruned model
  l0:SHA         the gated model in eval mode (deterministic gates, fractional open gates kept): Voita's model
  l0-masks:SHA   its fine-tuned weights with the closed heads masked and every open gate set to 1 (only when
                 some open gate is fractional; otherwise it is the same model)
  michel:T:N     the unpruned model with the lowest-I_h heads of types T masked, N of them kept
Not like for like: the L0 models were fine-tuned (with their gates) after the pruning decision, Michel's masks
are applied to the converged model without any retraining. DIR/compare.md says so beside the table;
DIR/compare.png plots BLEU against heads kept for both.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple, Union

from fairseq_headprune.errors import UserError
from fairseq_headprune.decoding.evaluate import SubsetEvaluator, translate_worker
from fairseq_headprune.core.heads import (
    ATTENTION_TYPES,
    Head,
    HeadLayout,
    attention_modules,
    format_head_spec,
    parse_head_spec,
)
from fairseq_headprune.fairseq_io.loading import load
from fairseq_headprune.decoding.mask_batching import (MaskBatching, parse_masks_per_batch, rows_per_search,
                                                      translate_masks)
from fairseq_headprune.core.masking import set_head_masks
from fairseq_headprune.plots import l0_vs_importance
from fairseq_headprune.records import layout as names
from fairseq_headprune.records.identity import file_sha256, input_file, run_identity
from fairseq_headprune.records.log import ResultsLog, atomic_output
from fairseq_headprune.studies.gating import gate_summary, read_checkpoint
from fairseq_headprune.studies.ranking import importance_scores, rank_by_scores
from fairseq_headprune.decoding.workers import parse_workers, pool_for
from fairseq_headprune.options import option
from fairseq_headprune.decoding.mask_batching import masks_per_batch_option
from fairseq_headprune.decoding.workers import workers_option

TOLERANCE = 0.25  # "more than half of the heads pruned for <= 0.25 BLEU" (the issue's question)


@dataclass
class CompareOptions:
    """What `compare` scores; field names are the command's options."""

    subset: str = field(metadata={"flag": "--gen-subset"})
    importance: str = option(flag="--importance", help="importance.json of `fairseq-headprune score` (Michel's I_h)")
    gated: List[str] = option(flag="--gated", nargs="+", metavar="CHECKPOINT", parse=list,
                              help="checkpoints fine-tuned with --gated-types (Voita's L0 gates)")
    references: Optional[str] = option(None, flag="--references",
                                       help="raw reference file of the subset (default: its decoded targets)")
    masks_per_batch: Union[int, str] = masks_per_batch_option()
    workers: Union[int, str] = workers_option()

    def check(self) -> None:
        self.masks_per_batch = parse_masks_per_batch(self.masks_per_batch)
        self.workers = parse_workers(self.workers)
        for flag, path in (("--importance", self.importance), ("--references", self.references)):
            if path and not os.path.isfile(path):
                raise UserError(f"{flag}: no such file: {path}")
        for path in self.gated:
            if not os.path.isfile(path):
                raise UserError(f"--gated: checkpoint not found: {path}")


def michel_mask(scores: Dict[Head, float], layout: HeadLayout, types: List[str], kept: int) -> List[Head]:
    """The lowest-I_h heads of `types` masked so that `kept` of them remain."""
    candidates = layout.all_heads(types)
    if not 0 <= kept <= len(candidates):
        raise UserError(f"cannot keep {kept} of the {len(candidates)} heads of {','.join(types)}")
    return rank_by_scores(scores, candidates)[: len(candidates) - kept]


def kept_per_type(layout: HeadLayout, masked: List[Head]) -> Dict[str, int]:
    return {t: sum(1 for h in layout.all_heads([t]) if h not in set(masked)) for t in ATTENTION_TYPES}


def _gated_runs(paths: List[str], layout: HeadLayout) -> List[dict]:
    runs = []
    for path in paths:
        try:
            summary = gate_summary(read_checkpoint(path))
        except UserError as e:
            raise UserError(f"--gated {path}: {e}") from None
        layout.check(summary["closed_heads"])  # the same architecture as the unpruned model
        runs.append({"path": path, "sha": file_sha256(path, 16), **summary})
    return runs


def _evaluate_gated(cfg, run: dict, references, fingerprint: str, subset: str):
    """BLEU of the gated model, and of its closed heads as masks with open gates at 1 (None if no gate is
    fractional). Loaded as every command loads a checkpoint: the gates come with its state dict."""
    cfg = copy.deepcopy(cfg)
    cfg.common_eval.path = run["path"]
    loaded = load(cfg)
    evaluator = SubsetEvaluator(loaded, subset, references)
    if evaluator.data_fingerprint() != fingerprint:
        raise UserError(f"{run['path']} does not read the subset as the unpruned model does (other dictionaries?)")
    gated = evaluator.bleu(evaluator.translate()).score
    as_masks = None
    if run["fractional"]:
        for attn in attention_modules(loaded.model).values():
            attn.head_gate = None
        set_head_masks(loaded.model, run["closed_heads"])
        as_masks = evaluator.bleu(evaluator.translate()).score
    return gated, as_masks


def _michel_pending(runs: List[dict], done, scores: Dict[Head, float], layout: HeadLayout) -> Dict[str, List[Head]]:
    """Michel's masks still to score, keyed michel:TYPES:KEPT: one per (gated types, heads kept) of the gated
    runs, in their order."""
    pending = {}
    for r in runs:
        key = f"michel:{','.join(r['gated_types'])}:{r['kept']}"
        if key not in done and key not in pending:
            pending[key] = michel_mask(scores, layout, r["gated_types"], r["kept"])
    return pending


def _log_gated(log: ResultsLog, runs: List[dict], cfg, options: CompareOptions, fingerprint: str,
               layout: HeadLayout) -> None:
    """Score each gated checkpoint of `runs` and append its l0 row."""
    total = len(layout.all_heads())
    for r in runs:
        gated, as_masks = _evaluate_gated(cfg, r, options.references, fingerprint, options.subset)
        log.append({"key": f"l0:{r['sha']}", "method": "l0", "checkpoint": r["path"],
                    "l0_lambda": r["l0_lambda"], "updates": r["updates"], "types": r["gated_types"],
                    "heads_kept": total - r["closed"], "kept_per_type": kept_per_type(layout, r["closed_heads"]),
                    "fractional_gates": r["fractional"], "masked": format_head_spec(r["closed_heads"]),
                    "michel_key": f"michel:{','.join(r['gated_types'])}:{r['kept']}",
                    "bleu": gated, "bleu_closed_as_masks": as_masks})
        print(f"L0 lambda {r['l0_lambda']} ({total - r['closed']} heads kept): BLEU {gated:.2f}")


def run(loaded, options: CompareOptions, results_dir: str) -> List[str]:
    """Rows of DIR/compare.jsonl (resumable; new gated checkpoints join), its table and figure; returns the files.
    The gated checkpoints are loaded one by one with the unpruned model's fairseq configuration."""
    options.check()
    cfg = loaded.cfg
    evaluator = SubsetEvaluator(loaded, options.subset, options.references)
    layout = HeadLayout.of(loaded.model)
    total = len(layout.all_heads())
    scores = importance_scores(options.importance, file_sha256(loaded.checkpoint))
    runs = _gated_runs(options.gated, layout)
    fingerprint = evaluator.data_fingerprint()
    log = ResultsLog(os.path.join(results_dir, names.COMPARE), run_identity(
        "compare", loaded, evaluator, metric="bleu", inputs={"importance_sha256": input_file(options.importance)},
        bleu_signature=evaluator.bleu_signature(), total_heads=total))
    done = log.done()
    if "baseline" not in done:
        set_head_masks(loaded.model, [])
        log.append({"key": "baseline", "method": "unpruned", "heads_kept": total,
                    "bleu": evaluator.bleu(evaluator.translate()).score})
        print(f"unpruned: BLEU {log.rows[-1]['bleu']:.2f}")
    pending = _michel_pending(runs, done, scores, layout)
    baseline = next(r["bleu"] for r in log.rows if r.get("key") == "baseline")
    decode = [key for key, masked in pending.items() if masked]  # nothing masked: the baseline itself
    hyps: Dict[str, List[str]] = {}
    spec = evaluator.spec if options.workers != 1 else None

    def keep(indices: List[int], outputs: List[List[str]]) -> None:
        hyps.update((decode[i], h) for i, h in zip(indices, outputs))

    with pool_for(options.workers, len(decode), translate_worker, spec) as (pool, how):
        batching = translate_masks(evaluator, [pending[k] for k in decode], keep,
                                   MaskBatching(options.masks_per_batch, rows=rows_per_search(evaluator)), pool)
    if decode:
        log.note_run({"masks": len(decode), "workers": how, "masks_per_batch": batching.as_dict()})
        print(f"compare: {len(decode)} Michel masks, {batching.reason()}; {how}", flush=True)
    for key, masked in pending.items():
        log.append({"key": key, "method": "michel", "types": key.split(":")[1].split(","),
                    "heads_kept": total - len(masked), "kept_per_type": kept_per_type(layout, masked),
                    "masked": format_head_spec(masked),
                    "bleu": evaluator.bleu(hyps[key]).score if masked else baseline})
        print(f"michel ({total - len(masked)} heads kept): BLEU {log.rows[-1]['bleu']:.2f}")
    _log_gated(log, [r for r in runs if f"l0:{r['sha']}" not in done], cfg, options, fingerprint, layout)
    md = os.path.join(results_dir, "compare.md")
    with atomic_output(md) as f:
        f.write(report(log.rows, log.header))
    png = l0_vs_importance(log.rows, total, TOLERANCE, os.path.join(results_dir, "compare.png"))
    return [log.path, md, png]


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def report(rows: List[dict], header: dict) -> str:
    """compare.md: one row per L0 run beside Michel's pruning at the same heads kept, and the 0.25-BLEU question."""
    by_key = {r["key"]: r for r in rows}
    base = by_key["baseline"]["bleu"]
    total = header["total_heads"]
    l0 = sorted((r for r in rows if r.get("method") == "l0"), key=lambda r: -r["heads_kept"])
    lines = [
        "# Michel et al.'s I_h pruning vs Voita et al.'s L0 gates",
        "",
        f"sacreBLEU on `{header['subset']}` ({header['bleu_signature']}), "
        f"beam {header['decoding']['generation']['beam']}; "
        f"unpruned model: **{base:.2f}**, {total} heads.",
        "",
        "L0: fine-tuned with a Hard Concrete gate per head and λ·E[L0] (deterministic gates at evaluation; "
        "'as masks' = its closed heads masked, open gates set to 1). Michel: the unpruned model, lowest-I_h heads "
        "masked, **no fine-tuning** - the L0 models had extra training, so the comparison favours them; a run "
        "with λ = 0 (gates, no penalty) shows what that fine-tuning alone does.",
        "",
        "| λ | updates | heads kept | enc-self | enc-dec | dec-self | L0 BLEU | L0 as masks | Michel BLEU "
        "| L0 - unpruned | Michel - unpruned | Michel kept (enc-self/enc-dec/dec-self) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in l0:
        m = by_key.get(r["michel_key"], {})
        k = r["kept_per_type"]
        lines.append(f"| {r['l0_lambda']} | {r['updates']} | {r['heads_kept']} | {k['enc-self']} | {k['enc-dec']} | "
                     f"{k['dec-self']} | {r['bleu']:.2f} | {_fmt(r.get('bleu_closed_as_masks'))} | "
                     f"{_fmt(m.get('bleu'))} | {r['bleu'] - base:+.2f} | "
                     f"{(m['bleu'] - base) if m else float('nan'):+.2f} | "
                     f"{'/'.join(str(m['kept_per_type'][t]) for t in ATTENTION_TYPES) if m else '-'} |")
    lines += ["", claim(rows, total, base), ""]
    control = next((r for r in l0 if r["l0_lambda"] == 0), None)
    if control:
        types, of = half_question_scope(rows, total)
        half = [r for r in l0 if kept_of(r, types) < of / 2]
        lines += [f"The λ = 0 control (the same fine-tuning with gates and no penalty, {control['heads_kept']} heads "
                  f"kept) scores {control['bleu']:.2f} ({control['bleu'] - base:+.2f} against the unpruned model): "
                  "the fine-tuning alone changes BLEU by that much."]
        if half:
            best = max(half, key=lambda r: r["bleu"])
            lines[-1] += (f" Against it, the best L0 run below half of the gated heads ({kept_of(best, types)} "
                          f"of {of} kept) is {best['bleu'] - control['bleu']:+.2f} BLEU.")
        lines.append("")
    return "\n".join(lines)


def gated_heads(rows: List[dict]) -> Dict[str, int]:
    """{attention type: heads} of the types the L0 runs gated (their kept heads plus their closed ones)."""
    totals: Dict[str, int] = {}
    for r in rows:
        if r.get("method") == "l0":
            closed = parse_head_spec(r["masked"]) if r.get("masked") else []
            for t in r["types"]:
                totals[t] = r["kept_per_type"][t] + sum(h.type == t for h in closed)
    return totals


def half_question_scope(rows: List[dict], total: int) -> Tuple[List[str], int]:
    """(types, heads) the more-than-half question counts: the gated ones, every head when no run says."""
    gated = gated_heads(rows)
    return [t for t in ATTENTION_TYPES if t in gated] or list(ATTENTION_TYPES), sum(gated.values()) or total


def kept_of(row: dict, types) -> int:
    """Heads of `types` a row keeps (all its heads when it has no per-type counts)."""
    per_type = row.get("kept_per_type")
    return sum(per_type[t] for t in types) if per_type else row["heads_kept"]


def claim(rows: List[dict], total: int, base: float) -> str:
    """Does pruning more than half of the gated heads cost at most 0.25 BLEU, for either method? (Every head when
    every type was gated; the encoder's 48 when encoder self-attention alone was, as in Voita et al.)"""
    types, of = half_question_scope(rows, total)
    what = "heads" if len(types) == len(ATTENTION_TYPES) else f"gated heads ({', '.join(types)})"
    out = [f"**More than half of the {what} pruned (at most {of // 2 - (of % 2 == 0)} of {of} kept) "
           f"for <= {TOLERANCE} BLEU?**"]
    for method, name in (("l0", "L0 gates"), ("michel", "Michel I_h")):
        half = [r for r in rows if r.get("method") == method and kept_of(r, types) < of / 2]
        ok = [r for r in half if r["bleu"] >= base - TOLERANCE]
        if not half:
            out.append(f"- {name}: no run pruned more than half of the {what}: not tested.")
        elif ok:
            best = min(ok, key=lambda r: kept_of(r, types))
            out.append(f"- {name}: **yes**: {kept_of(best, types)} of the {of} kept, BLEU {best['bleu']:.2f} "
                       f"({best['bleu'] - base:+.2f}).")
        else:
            best = max(half, key=lambda r: r["bleu"])
            out.append(f"- {name}: **no**: the best run below half ({kept_of(best, types)} of the {of} kept) has "
                       f"BLEU {best['bleu']:.2f} ({best['bleu'] - base:+.2f}).")
    return "\n".join(out)
