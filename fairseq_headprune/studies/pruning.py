"""Iterative pruning (`fairseq-headprune prune`; Michel et al. Section 4, Figures 3 and 4).

All heads of --types are ranked once (or again after every step with --reestimate) and 10% more of them are
masked at each step (--step), the least important first; BLEU is measured after each step. Orders:
  importance  I_h from `score` (l2-normalised per layer, ranked globally), or computed on --importance-subset
  oracle      the single-head ablation deltas of `ablate` (the head whose removal hurts least goes first)
  random      a seeded permutation, the baseline
Rows go to DIR/pruning.jsonl as they finish (resumable); DIR/pruning.png has one curve per order and types.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Union

from fairseq_headprune.errors import UserError
from fairseq_headprune.decoding.evaluate import SubsetEvaluator, translate_worker
from fairseq_headprune.core.heads import ATTENTION_TYPES, Head, HeadLayout, format_head_spec
from fairseq_headprune.decoding.mask_batching import (MaskBatching, masks_per_batch_option, parse_masks_per_batch,
                                                      rows_per_search, translate_masks)
from fairseq_headprune.core.masking import set_head_masks
from fairseq_headprune.records import layout as names
from fairseq_headprune.records.identity import file_sha256, input_file, run_identity
from fairseq_headprune.records.log import ResultsLog, write_json_atomic
from fairseq_headprune.studies.ranking import (
    heads_to_json,
    importance_scores,
    oracle_scores,
    parse_type_list,
    random_ranking,
    rank_by_scores,
    steps,
)
from fairseq_headprune.studies.scoring import estimate_importance
from fairseq_headprune.decoding.workers import parse_workers, pool_for, workers_option
from fairseq_headprune.options import option
from fairseq_headprune.plots import pruning_curves
from fairseq_headprune.studies.removal import remove_and_save

ORDERS = ("importance", "oracle", "random")


@dataclass
class PruneOptions:
    """What `prune` sweeps; field names are the command's options."""

    subset: str = field(metadata={"flag": "--gen-subset"})
    order: str = option("importance", flag="--order", always=True,
                        help=f"comma-separated, from {', '.join(ORDERS)}")
    types: str = option(",".join(ATTENTION_TYPES), flag="--types", help="attention types to prune, comma-separated")
    step: float = option(0.1, flag="--step", help="share of the heads masked at each step")
    importance: Optional[str] = option(None, flag="--importance",
                                       help="importance.json of `score` (default: computed on --importance-subset)")
    importance_subset: str = option("valid", flag="--importance-subset", help="the subset I_h is scored on")
    reestimate: bool = option(False, flag="--reestimate", help="re-score I_h on the remaining heads after each step")
    ablation: Optional[str] = option(None, flag="--ablation",
                                     help="ablation-single.jsonl of `ablate`, for --order oracle")
    random_seed: int = option(1, flag="--random-seed", help="seed of --order random")
    references: Optional[str] = option(None, flag="--references",
                                       help="raw reference file of the subset (default: its decoded targets)")
    masks_per_batch: Union[int, str] = masks_per_batch_option()
    workers: Union[int, str] = workers_option()
    save_percent: float = option(50.0, flag="--save-percent",
                                 help="write DIR/heads-ORDER[-TYPES]-PCT.json, the heads each order prunes at this "
                                      "percent")
    save_pruned: Optional[str] = option(None, flag="--save-pruned", metavar="OUT.pt",
                                        help="also write a checkpoint with those heads (of the first order) "
                                             "physically removed")

    def orders(self) -> List[str]:
        orders = [o.strip() for o in self.order.split(",") if o.strip()]
        bad = [o for o in orders if o not in ORDERS]
        if bad or not orders:
            raise UserError(f"--order: unknown order {bad[0] if bad else self.order!r} (use {', '.join(ORDERS)})")
        return orders

    def check(self) -> None:
        """Everything that can be refused before the model is loaded."""
        orders = self.orders()
        if "oracle" in orders and not self.ablation:
            raise UserError("--order oracle needs --ablation ablation-single.jsonl (from `fairseq-headprune ablate`)")
        parse_type_list(self.types)
        steps(1, self.step)
        self.masks_per_batch = parse_masks_per_batch(self.masks_per_batch)
        self.workers = parse_workers(self.workers)
        if not 0 <= self.save_percent <= 100:
            raise UserError(f"--save-percent must be in [0, 100], not {self.save_percent}")
        for flag, path in (("--importance", self.importance), ("--ablation", self.ablation),
                           ("--references", self.references)):
            if path and not os.path.isfile(path):
                raise UserError(f"{flag}: no such file: {path}")

    def inputs(self, orders: Sequence[str]) -> Dict:
        """The study inputs this invocation's rows depend on (the run identity's `inputs`)."""
        out: Dict = {}
        if "importance" in orders:
            if self.importance:
                out["importance_sha256"] = input_file(self.importance)
            else:
                out["importance_subset"] = self.importance_subset
            out["reestimate"] = self.reestimate
        if "oracle" in orders:
            out["ablation_sha256"] = input_file(self.ablation)
        if "random" in orders:
            out["random_seed"] = self.random_seed
        return out


def run(loaded, options: PruneOptions, results_dir: str) -> List[str]:
    """Every step of every order into DIR/pruning.jsonl (resumable), the heads each order prunes at
    save_percent, the figure; returns the files written."""
    orders = options.orders()
    types = parse_type_list(options.types)
    evaluator = SubsetEvaluator(loaded, options.subset, options.references)
    layout = HeadLayout.of(loaded.model)
    candidates = layout.all_heads(types)
    log = ResultsLog(os.path.join(results_dir, names.PRUNING), run_identity(
        "prune", loaded, evaluator, metric="bleu", bleu_signature=evaluator.bleu_signature(),
        total_heads=len(layout.all_heads())))
    # rows of other invocations (orders, types) share the file: each input, once recorded, must stay the same
    log.confirm({f"inputs.{k}": v for k, v in options.inputs(orders).items()})
    checkpoint_sha = file_sha256(loaded.checkpoint)
    rankings = {}
    for order in orders:
        label = f"{order}{'+reestimate' if order == 'importance' and options.reestimate else ''}:{','.join(types)}"
        rankings[label] = initial_ranking(order, options, loaded, candidates, checkpoint_sha)
        if order == "importance" and options.reestimate:
            rankings[label] = prune_reestimating(loaded, evaluator, log, label, rankings[label], candidates, types,
                                                 options.step, options.importance_subset)
    fixed = [(label, ranking) for label, ranking in rankings.items() if "+reestimate" not in label]
    evaluate_steps(evaluator, log, types, fixed, len(candidates), options.step, options.masks_per_batch,
                   options.workers)
    for label, ranking in rankings.items():
        chosen = ranking[: int(round(options.save_percent / 100 * len(candidates)))]
        spec_path = os.path.join(results_dir, names.heads_file_name(label.split(":")[0], types, options.save_percent))
        write_json_atomic(spec_path, heads_to_json(chosen))
        print(f"wrote {spec_path} ({len(chosen)} heads)")
        if options.save_pruned and label == next(iter(rankings)):
            info = remove_and_save(loaded, chosen, options.save_pruned, evaluator.samples[0])
            print(f"wrote {options.save_pruned}: {info['kept']} heads kept, {info['params_after']:,} parameters")

    png = pruning_curves(log.rows, os.path.join(results_dir, names.PRUNING_FIGURE))
    return [log.path, png]


def step_row(label: str, types: Sequence[str], masked: Sequence[Head], n_candidates: int, bleu: float) -> Dict:
    return {"key": f"{label}:{len(masked)}", "order": label.split(":")[0], "types": list(types),
            "heads_masked": len(masked), "percent_pruned": 100.0 * len(masked) / n_candidates,
            "masked": format_head_spec(masked), "bleu": bleu}


def evaluate_steps(evaluator, log, types, rankings, n_candidates: int, step: float,
                   masks_per_batch: Union[int, str] = "auto", workers: Union[int, str] = 1) -> None:
    """Every step of every fixed ranking not yet in the log, decoded in groups sharing beam searches.

    A set of masked heads is decoded once: the orders share their first (nothing masked) and last (everything
    masked) steps, and a set already scored in this log (same model, data and decoding: its header) is reused.
    mask_batching.translate_masks decodes them (--masks-per-batch: a number of sets per beam search, or auto),
    on --workers local processes; rows are appended as each group finishes, so an interrupted run resumes at the
    next group. How the sets were batched and on how many workers goes into the log's header (`runs`)."""
    done = log.done()
    scored = {row["masked"]: row["bleu"] for row in log.rows if "masked" in row}
    steps_of: Dict[str, List] = {}  # spec of a masked set -> the (label, masked) steps that mask exactly it
    for label, ranking in rankings:
        for n in steps(n_candidates, step):
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

    def record_group(indices: List[int], outputs: List[List[str]]) -> None:
        for i, hyps in zip(indices, outputs):
            record(to_decode[i], evaluator.bleu(hyps).score)

    spec = evaluator.spec if workers != 1 else None  # what a worker loads the model and data from
    with pool_for(workers, len(to_decode), translate_worker, spec) as (pool, how):
        batching = translate_masks(evaluator, [steps_of[spec][0][1] for spec in to_decode], record_group,
                                   MaskBatching(masks_per_batch, rows=rows_per_search(evaluator)), pool)
    if to_decode:
        log.note_run({"masks": len(to_decode), "workers": how, "masks_per_batch": batching.as_dict()})
        print(f"prune: {len(to_decode)} sets of masked heads, {batching.reason()}; {how}", flush=True)


def prune_reestimating(loaded, evaluator, log, label, ranking, candidates, types, step: float,
                       importance_subset: str) -> List[Head]:
    """--reestimate: I_h is re-scored on the remaining heads after each step, so the steps run one by one.

    Returns the final ranking (the order the heads were pruned in)."""
    done = log.done()
    masked: List[Head] = []
    for n in steps(len(candidates), step):
        if n > len(masked):
            set_head_masks(loaded.model, masked)
            remaining = [h for h in candidates if h not in masked]
            ranking = masked + rank_by_scores(estimate_importance(loaded, importance_subset), remaining)
        masked = ranking[:n]
        if f"{label}:{n}" in done:
            continue
        set_head_masks(loaded.model, masked)
        row = step_row(label, types, masked, len(candidates), evaluator.bleu(evaluator.translate()).score)
        log.append(row)
        print(f"{label}: {n}/{len(candidates)} heads masked, BLEU {row['bleu']:.2f}")
    set_head_masks(loaded.model, [])
    return ranking


def initial_ranking(order: str, options: PruneOptions, loaded, candidates: List[Head],
                    checkpoint_sha: Optional[str] = None) -> List[Head]:
    if order == "random":
        return random_ranking(candidates, options.random_seed)
    if order == "oracle":
        return rank_by_scores(oracle_scores(options.ablation, checkpoint_sha), candidates)
    if options.importance:
        return rank_by_scores(importance_scores(options.importance, checkpoint_sha), candidates)
    return rank_by_scores(estimate_importance(loaded, options.importance_subset), candidates)
