"""`fairseq-headprune prune`: iterative pruning (Michel et al. Section 4, Figures 3 and 4).

All heads of --types are ranked once (or again after every step with --reestimate) and 10% more of them are
masked at each step (--step), the least important first; BLEU is measured after each step. Orders:
  importance  I_h from `score` (l2-normalised per layer, ranked globally), or computed on --importance-subset
  oracle      the single-head ablation deltas of `ablate` (the head whose removal hurts least goes first)
  random      a seeded permutation, the baseline
Rows go to DIR/pruning.jsonl as they finish (resumable); DIR/pruning.png has one curve per order and types.
"""
from __future__ import annotations

import json
import os
import random
from typing import Dict, List, Sequence

from fairseq_headprune.errors import UserError
from fairseq_headprune.evaluate import SubsetEvaluator
from fairseq_headprune.experiments.ablation import parse_types
from fairseq_headprune.heads import ATTENTION_TYPES, Head, HeadLayout, format_head_spec
from fairseq_headprune.importance import from_nested_lists, normalize_by_layer
from fairseq_headprune.loading import file_sha256, load
from fairseq_headprune.masking import set_head_masks
from fairseq_headprune.results.log import ResultsLog, write_json_atomic

ORDERS = ("importance", "oracle", "random")


def add_args(parser) -> None:
    g = parser.add_argument_group("prune")
    g.add_argument("--results-dir", required=True)
    g.add_argument("--order", default="importance", help=f"comma-separated, from {', '.join(ORDERS)}")
    g.add_argument("--types", default="enc-self,enc-dec,dec-self", help="attention types to prune, comma-separated")
    g.add_argument("--step", type=float, default=0.1, help="share of the heads masked at each step")
    g.add_argument("--importance", help="importance.json of `score` (default: computed on --importance-subset)")
    g.add_argument("--importance-subset", default="valid")
    g.add_argument("--reestimate", action="store_true", help="re-score I_h on the remaining heads after each step")
    g.add_argument("--ablation", help="ablation-single.jsonl of `ablate`, for --order oracle")
    g.add_argument("--random-seed", type=int, default=1)
    g.add_argument("--references", help="raw reference file of the subset (default: its decoded targets)")
    g.add_argument("--masks-per-batch", type=int, default=1,
                   help="pruning steps sharing one beam search (see ablate --masks-per-batch)")
    g.add_argument("--save-percent", type=float, default=50.0,
                   help="write DIR/heads-ORDER[-TYPES]-PCT.json, the heads each order prunes at this percent")
    g.add_argument("--save-pruned", metavar="OUT.pt",
                   help="also write a checkpoint with those heads (of the first order) physically removed")


def steps(n_heads: int, step: float) -> List[int]:
    """Number of heads masked at each step: 0, step*N, 2*step*N, ... up to all of them."""
    if not 0 < step <= 1:
        raise UserError(f"--step must be in (0, 1], not {step}")
    count = int(round(1 / step))
    return sorted({min(n_heads, int(round(k * step * n_heads))) for k in range(count + 1)})


def rank_by_scores(scores: Dict[Head, float], candidates: Sequence[Head]) -> List[Head]:
    """Least important first; ties broken by head order so rankings are reproducible."""
    missing = [h for h in candidates if h not in scores]
    if missing:
        raise UserError(f"no score for head {missing[0]}: the scores come from another model")
    return sorted(candidates, key=lambda h: (scores[h], list(candidates).index(h)))


def importance_scores(path: str) -> Dict[Head, float]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read importance file {path}: {e}") from None
    ids = data.get("meta", {}).get("head_ids", {})
    scores = {}
    for (t, layer), values in from_nested_lists(data).items():
        held = ids.get(t, [])[layer - 1] if ids.get(t) else list(range(1, len(values) + 1))
        for h, v in zip(held, values.tolist()):
            scores[Head(t, layer, h)] = v
    return scores


def oracle_scores(path: str) -> Dict[Head, float]:
    """Single-head ablation: a head whose removal lowers BLEU least (or raises it) is the least important."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read ablation file {path}: {e}") from None
    rows = [r for r in lines[1:] if r.get("key") != "baseline" and "delta" in r]
    if not rows:
        raise UserError(f"{path} has no single-head ablation rows")
    sign = -1.0 if lines[0]["header"].get("metric") == "loss" else 1.0  # loss delta: + is worse
    return {Head(r["type"], r["layer"], r["head"]): -sign * r["delta"] for r in rows}


def estimate_importance(loaded, subset: str) -> Dict[Head, float]:
    from fairseq_headprune.experiments.score import compute_importance

    raw, _ = compute_importance(loaded, subset)
    scores = {}
    for (t, layer), values in normalize_by_layer(raw).items():
        held = HeadLayout.of(loaded.model).heads[(t, layer)]
        scores.update({Head(t, layer, h): float(v) for h, v in zip(held, values)})
    return scores


def run(cfg, args) -> None:
    orders = [o.strip() for o in args.order.split(",") if o.strip()]
    bad = [o for o in orders if o not in ORDERS]
    if bad or not orders:
        raise UserError(f"--order: unknown order {bad[0] if bad else args.order!r} (use {', '.join(ORDERS)})")
    if "oracle" in orders and not args.ablation:
        raise UserError("--order oracle needs --ablation ablation-single.jsonl (from `fairseq-headprune ablate`)")
    types = parse_types(args.types)
    loaded = load(cfg)
    evaluator = SubsetEvaluator(loaded, cfg.dataset.gen_subset, args.references)
    layout = HeadLayout.of(loaded.model)
    candidates = layout.all_heads(types)
    g = cfg.generation
    log = ResultsLog(os.path.join(args.results_dir, "pruning.jsonl"), {
        "command": "prune",
        "checkpoint_sha256": file_sha256(loaded.checkpoint),
        "subset": evaluator.subset,
        "data_fingerprint": evaluator.data_fingerprint(),
        "decoding": {"beam": g.beam, "lenpen": g.lenpen, "max_len_a": g.max_len_a, "max_len_b": g.max_len_b,
                     "remove_bpe": cfg.common_eval.post_process},
        "bleu_signature": evaluator.bleu_signature(),
        "total_heads": len(layout.all_heads()),
    })
    rankings = {}
    for order in orders:
        label = f"{order}{'+reestimate' if order == 'importance' and args.reestimate else ''}:{','.join(types)}"
        rankings[label] = initial_ranking(order, args, loaded, candidates)
        if order == "importance" and args.reestimate:
            rankings[label] = prune_reestimating(loaded, evaluator, log, label, rankings[label], candidates, types,
                                                 args)
    fixed = [(label, ranking) for label, ranking in rankings.items() if "+reestimate" not in label]
    evaluate_steps(evaluator, log, types, fixed, len(candidates), args)
    for label, ranking in rankings.items():
        chosen = ranking[: int(round(args.save_percent / 100 * len(candidates)))]
        spec_path = os.path.join(args.results_dir, heads_file_name(label.split(":")[0], types, args.save_percent))
        write_json_atomic(spec_path, heads_to_json(chosen))
        print(f"wrote {spec_path} ({len(chosen)} heads)")
        if args.save_pruned and label == next(iter(rankings)):
            from fairseq_headprune.experiments.remove import remove_and_save

            info = remove_and_save(loaded, chosen, args.save_pruned, evaluator.samples[0])
            print(f"wrote {args.save_pruned}: {info['kept']} heads kept, {info['params_after']:,} parameters")
    from fairseq_headprune.plots import pruning_curves

    png = pruning_curves(log.rows, os.path.join(args.results_dir, "pruning.png"))
    print(f"wrote {log.path}\nwrote {png}")


def step_row(label: str, types: Sequence[str], masked: Sequence[Head], n_candidates: int, bleu: float) -> Dict:
    return {"key": f"{label}:{len(masked)}", "order": label.split(":")[0], "types": list(types),
            "heads_masked": len(masked), "percent_pruned": 100.0 * len(masked) / n_candidates,
            "masked": format_head_spec(masked), "bleu": bleu}


def evaluate_steps(evaluator, log, types, rankings, n_candidates: int, args) -> None:
    """Every step of every fixed ranking not yet in the log, decoded masks_per_batch masks at a time.

    A set of masked heads is decoded once: the orders share their first (nothing masked) and last (everything
    masked) steps, and a set already scored in this log (same model, data and decoding: its header) is reused.
    SubsetEvaluator.translate_many decodes them (one beam search per step by default, several sharing one with
    --masks-per-batch); rows are appended as each group finishes, so an interrupted run resumes at the next group."""
    done = log.done()
    scored = {row["masked"]: row["bleu"] for row in log.rows if "masked" in row}
    steps_of: Dict[str, List] = {}  # spec of a masked set -> the (label, masked) steps that mask exactly it
    for label, ranking in rankings:
        for n in steps(n_candidates, args.step):
            if f"{label}:{n}" not in done:
                steps_of.setdefault(format_head_spec(ranking[:n]), []).append((label, ranking[:n]))

    def record(spec: str, bleu: float) -> None:
        for label, masked in steps_of[spec]:
            log.append(step_row(label, types, masked, n_candidates, bleu))
            print(f"{label}: {len(masked)}/{n_candidates} heads masked, BLEU {bleu:.2f}")

    for spec in [s for s in steps_of if s in scored]:
        record(spec, scored[spec])
    to_decode = [s for s in steps_of if s not in scored]
    set_head_masks(evaluator.loaded.model, [])
    per_batch = max(1, args.masks_per_batch)
    for start in range(0, len(to_decode), per_batch):
        group = to_decode[start : start + per_batch]
        outputs = evaluator.translate_many([steps_of[spec][0][1] for spec in group], per_batch)
        for spec, hyps in zip(group, outputs):
            record(spec, evaluator.bleu(hyps).score)


def prune_reestimating(loaded, evaluator, log, label, ranking, candidates, types, args) -> List[Head]:
    """--reestimate: I_h is re-scored on the remaining heads after each step, so the steps run one by one.

    Returns the final ranking (the order the heads were pruned in)."""
    done = log.done()
    masked: List[Head] = []
    for n in steps(len(candidates), args.step):
        if n > len(masked):
            set_head_masks(loaded.model, masked)
            remaining = [h for h in candidates if h not in masked]
            ranking = masked + rank_by_scores(estimate_importance(loaded, args.importance_subset), remaining)
        masked = ranking[:n]
        if f"{label}:{n}" in done:
            continue
        set_head_masks(loaded.model, masked)
        row = step_row(label, types, masked, len(candidates), evaluator.bleu(evaluator.translate()).score)
        log.append(row)
        print(f"{label}: {n}/{len(candidates)} heads masked, BLEU {row['bleu']:.2f}")
    set_head_masks(loaded.model, [])
    return ranking


def heads_file_name(order: str, types: Sequence[str], percent: float) -> str:
    """heads-ORDER-PCT.json for the whole model, heads-ORDER-TYPE+TYPE-PCT.json for some types: runs of several
    --types into one results folder (the report's per-type curves) must not overwrite the whole model's file."""
    scope = "" if set(types) == set(ATTENTION_TYPES) else "-" + "+".join(types)
    return f"heads-{order}{scope}-{percent:g}.json"


def heads_to_json(heads: Sequence[Head]) -> Dict[str, Dict[str, List[int]]]:
    """The `@file.json` form of a head list: {TYPE: {LAYER: [HEADS]}}, readable by --mask-heads and --heads."""
    out: Dict[str, Dict[str, List[int]]] = {}
    for h in sorted(heads, key=lambda h: (h.type, h.layer, h.head)):
        out.setdefault(h.type, {}).setdefault(str(h.layer), []).append(h.head)
    return out


def initial_ranking(order: str, args, loaded, candidates: List[Head]) -> List[Head]:
    if order == "random":
        ranking = list(candidates)
        random.Random(args.random_seed).shuffle(ranking)
        return ranking
    if order == "oracle":
        return rank_by_scores(oracle_scores(args.ablation), candidates)
    if args.importance:
        return rank_by_scores(importance_scores(args.importance), candidates)
    scores = estimate_importance(loaded, args.importance_subset)
    return rank_by_scores(scores, candidates)
