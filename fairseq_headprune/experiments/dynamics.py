"""`fairseq-headprune dynamics DATA --checkpoint-dir DIR`: head importance during training (Michel et al.
Section 6, Figure 5).

For the checkpoint of each epoch (checkpointN.pt): I_h on --importance-subset, then heads pruned by importance
in --step increments with BLEU on --gen-subset, reported as % of that epoch's unpruned BLEU. Each finished
(epoch, step) is appended to DIR/dynamics.jsonl at once, so a rerun resumes; with --watch the command keeps
looking for new epochs while training goes on (a checkpoint is read once its file has stopped changing).
"""
from __future__ import annotations

import glob
import os
import re
import time
from typing import Dict, List

from fairseq_headprune.errors import UserError
from fairseq_headprune.evaluate import SubsetEvaluator
from fairseq_headprune.experiments.pruning import estimate_importance, rank_by_scores, steps
from fairseq_headprune.heads import HeadLayout, format_head_spec
from fairseq_headprune.loading import file_sha256, load
from fairseq_headprune.masking import set_head_masks
from fairseq_headprune.results.log import ResultsLog

EPOCH_FILE = re.compile(r"checkpoint(\d+)\.pt$")


def add_args(parser) -> None:
    g = parser.add_argument_group("dynamics")
    g.add_argument("--checkpoint-dir", required=True, help="folder of epoch checkpoints (checkpointN.pt)")
    g.add_argument("--results-dir", required=True)
    g.add_argument("--epochs", help="comma-separated epochs to analyse (default: all)")
    g.add_argument("--step", type=float, default=0.1)
    g.add_argument("--importance-subset", default="valid")
    g.add_argument("--references", help="raw reference file of --gen-subset")
    g.add_argument("--watch", action="store_true", help="keep waiting for new epochs while training runs")
    g.add_argument("--watch-until-epoch", type=int, default=0, help="with --watch, stop after this epoch")
    g.add_argument("--poll-seconds", type=float, default=60.0)


def epoch_checkpoints(folder: str) -> Dict[int, str]:
    found = {}
    for path in glob.glob(os.path.join(folder, "checkpoint*.pt")):
        m = EPOCH_FILE.search(os.path.basename(path))
        if m:
            found[int(m.group(1))] = path
    return dict(sorted(found.items()))


def settled(path: str, quiet_seconds: float = 20.0) -> bool:
    """A checkpoint fairseq may still be writing is left for later: its file must be unchanged for a while."""
    return time.time() - os.path.getmtime(path) > quiet_seconds


def analyse_epoch(cfg, args, epoch: int, path: str, log: ResultsLog) -> None:
    sha = file_sha256(path)
    rows = {r["key"]: r for r in log.rows if r.get("epoch") == epoch}
    if any(r["checkpoint_sha256"] != sha for r in rows.values()):
        raise UserError(f"{log.path} holds epoch {epoch} of another checkpoint; use another --results-dir")
    cfg.common_eval.path = path
    loaded = load(cfg)
    candidates = HeadLayout.of(loaded.model).all_heads()
    counts = steps(len(candidates), args.step)
    if all(f"{epoch}:{n}" in rows for n in counts):
        return
    evaluator = SubsetEvaluator(loaded, cfg.dataset.gen_subset, args.references)
    ranking = rank_by_scores(estimate_importance(loaded, args.importance_subset), candidates)
    base = None
    for n in counts:  # counts start at 0: the unpruned BLEU every later step is compared with
        key = f"{epoch}:{n}"
        if key in rows:
            base = rows[key]["bleu"] if n == 0 else base
            continue
        set_head_masks(loaded.model, ranking[:n])
        bleu = evaluator.bleu(evaluator.translate()).score
        base = bleu if n == 0 else base
        log.append({"key": key, "epoch": epoch, "heads_masked": n, "percent_pruned": 100.0 * n / len(candidates),
                    "bleu": bleu, "bleu_retained": 100.0 * bleu / base if base else 0.0,
                    "masked": format_head_spec(ranking[:n]), "checkpoint_sha256": sha})
        print(f"epoch {epoch}: {n}/{len(candidates)} heads pruned, BLEU {bleu:.2f}")
    set_head_masks(loaded.model, [])


def run(cfg, args) -> None:
    folder = args.checkpoint_dir
    if not os.path.isdir(folder):
        raise UserError(f"checkpoint folder not found: {folder}")
    wanted = {int(e) for e in args.epochs.split(",")} if args.epochs else None
    g = cfg.generation
    log = ResultsLog(os.path.join(args.results_dir, "dynamics.jsonl"), {
        "command": "dynamics", "checkpoint_dir": os.path.abspath(folder), "subset": cfg.dataset.gen_subset,
        "importance_subset": args.importance_subset, "step": args.step,
        "decoding": {"beam": g.beam, "lenpen": g.lenpen, "max_len_a": g.max_len_a, "max_len_b": g.max_len_b,
                     "remove_bpe": cfg.common_eval.post_process},
    })
    analysed: set = set()
    while True:
        found = {e: p for e, p in epoch_checkpoints(folder).items() if wanted is None or e in wanted}
        todo = [(e, p) for e, p in found.items() if e not in analysed and settled(p)]
        for epoch, path in todo:
            analyse_epoch(cfg, args, epoch, path, log)
            analysed.add(epoch)
        last_wanted = max(wanted) if wanted else args.watch_until_epoch
        if not args.watch or (last_wanted and last_wanted in analysed):
            break
        if not todo:
            time.sleep(args.poll_seconds)
    if not analysed:
        raise UserError(f"no epoch checkpoint (checkpointN.pt) to analyse in {folder}")
    from fairseq_headprune.plots import dynamics_figure

    png = dynamics_figure(log.rows, os.path.join(args.results_dir, "dynamics.png"))
    write_table(log.rows, os.path.join(args.results_dir, "dynamics.md"))
    print(f"wrote {log.path}\nwrote {png}\nwrote {os.path.join(args.results_dir, 'dynamics.md')}")


def write_table(rows: List[dict], path: str) -> None:
    """% of each epoch's BLEU retained (rows: epochs; columns: % of heads pruned), and the unpruned BLEU."""
    epochs = sorted({r["epoch"] for r in rows if "epoch" in r})
    percents = sorted({round(r["percent_pruned"]) for r in rows if "epoch" in r})
    cell = {(r["epoch"], round(r["percent_pruned"])): r for r in rows if "epoch" in r}
    lines = ["| epoch | BLEU | " + " | ".join(f"{p}%" for p in percents) + " |", "|---" * (len(percents) + 2) + "|"]
    for e in epochs:
        base = cell.get((e, 0), {}).get("bleu")
        cells = [f"{cell[(e, p)]['bleu_retained']:.0f}" if (e, p) in cell else "" for p in percents]
        lines.append(f"| {e} | {base:.2f} | " + " | ".join(cells) + " |" if base is not None else f"| {e} | | |")
    with open(path, "w", encoding="utf-8") as f:
        f.write("% of each epoch's unpruned BLEU kept when heads are pruned by importance\n\n")
        f.write("\n".join(lines) + "\n")
