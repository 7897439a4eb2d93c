"""Head importance during training (`fairseq-headprune dynamics DATA --checkpoint-dir DIR`; Michel et al.
Section 6, Figure 5).

For the checkpoint of each epoch (checkpointN.pt): I_h on --importance-subset, then heads pruned by importance
in --step increments with BLEU on --gen-subset, reported as % of that epoch's unpruned BLEU. Each finished
(epoch, step) is appended to DIR/dynamics.jsonl at once, so a rerun resumes; with --watch the command keeps
looking for new epochs while training goes on (a checkpoint is read once its file has stopped changing).
"""
from __future__ import annotations

import copy
import glob
import os
import re
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from fairseq_headprune.errors import UserError
from fairseq_headprune.decoding.evaluate import SubsetEvaluator
from fairseq_headprune.core.heads import HeadLayout, format_head_spec
from fairseq_headprune.fairseq_io.loading import load
from fairseq_headprune.core.masking import set_head_masks
from fairseq_headprune.records import layout as names
from fairseq_headprune.records.identity import file_sha256, run_identity
from fairseq_headprune.records.log import ResultsLog
from fairseq_headprune.studies.ranking import rank_by_scores, steps
from fairseq_headprune.studies.scoring import estimate_importance
from fairseq_headprune.options import option
from fairseq_headprune.plots import dynamics_figure

EPOCH_FILE = re.compile(r"checkpoint(\d+)\.pt$")


@dataclass
class DynamicsOptions:
    """What `dynamics` analyses; field names are the command's options."""

    subset: str = field(metadata={"flag": "--gen-subset"})
    checkpoint_dir: str = option("", flag="--checkpoint-dir", help="folder of epoch checkpoints (checkpointN.pt)")
    epochs: Optional[str] = option(None, flag="--epochs", help="comma-separated epochs to analyse (default: all)")
    step: float = option(0.1, flag="--step", help="share of the heads masked at each pruning step")
    importance_subset: str = option("valid", flag="--importance-subset", help="the subset I_h is scored on")
    references: Optional[str] = option(None, flag="--references", help="raw reference file of --gen-subset")
    watch: bool = option(False, flag="--watch", help="keep waiting for new epochs while training runs")
    watch_until_epoch: int = option(0, flag="--watch-until-epoch", help="with --watch, stop after this epoch")
    poll_seconds: float = option(60.0, flag="--poll-seconds", help="with --watch, seconds between looks")

    def wanted(self) -> Optional[set]:
        if not self.epochs:
            return None
        try:
            return {int(e) for e in self.epochs.split(",")}
        except ValueError:
            raise UserError(f"--epochs must be comma-separated numbers: {self.epochs!r}") from None

    def check(self) -> None:
        if not os.path.isdir(self.checkpoint_dir):
            raise UserError(f"checkpoint folder not found: {self.checkpoint_dir}")
        self.wanted()
        steps(1, self.step)
        if self.references and not os.path.isfile(self.references):
            raise UserError(f"--references: no such file: {self.references}")


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


def analyse_epoch(cfg, options: DynamicsOptions, epoch: int, path: str, log: ResultsLog) -> None:
    """One epoch's checkpoint: I_h, then BLEU with 0, step, 2 step, ... of its heads pruned by importance."""
    sha = file_sha256(path)
    rows = {r["key"]: r for r in log.rows if r.get("epoch") == epoch}
    if any(r["checkpoint_sha256"] != sha for r in rows.values()):
        raise UserError(f"{log.path} holds epoch {epoch} of another checkpoint; use another --results-dir")
    cfg = copy.deepcopy(cfg)  # the caller's configuration is left as it was
    cfg.common_eval.path = path
    loaded = load(cfg)
    candidates = HeadLayout.of(loaded.model).all_heads()
    counts = steps(len(candidates), options.step)
    if all(f"{epoch}:{n}" in rows for n in counts):
        return
    evaluator = SubsetEvaluator(loaded, options.subset, options.references)
    # every epoch must read the same data (and decode it the same way): known once the first one is loaded
    log.confirm(run_identity("dynamics", None, evaluator, cfg=cfg, decoding=False))
    importance_set = SubsetEvaluator(loaded, options.importance_subset)
    log.confirm({"importance_data_fingerprint": importance_set.data_fingerprint()})
    ranking = rank_by_scores(estimate_importance(loaded, options.importance_subset), candidates)
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


def run(cfg, options: DynamicsOptions, results_dir: str) -> List[str]:
    """Every (wanted) epoch checkpoint of the folder, following a running training with watch; returns the files
    written. Takes fairseq's configuration, not a loaded model: it loads one checkpoint per epoch."""
    options.check()
    folder, wanted = options.checkpoint_dir, options.wanted()
    header = run_identity("dynamics", cfg=cfg, checkpoint_dir=os.path.abspath(folder), subset=options.subset,
                          importance_subset=options.importance_subset, step=options.step)
    log = ResultsLog(os.path.join(results_dir, names.DYNAMICS), header)
    analysed: set = set()
    while True:
        found = {e: p for e, p in epoch_checkpoints(folder).items() if wanted is None or e in wanted}
        todo = [(e, p) for e, p in found.items() if e not in analysed and settled(p)]
        for epoch, path in todo:
            analyse_epoch(cfg, options, epoch, path, log)
            analysed.add(epoch)
        last_wanted = max(wanted) if wanted else options.watch_until_epoch
        if not options.watch or (last_wanted and last_wanted in analysed):
            break
        if not todo:
            time.sleep(options.poll_seconds)
    if not analysed:
        raise UserError(f"no epoch checkpoint (checkpointN.pt) to analyse in {folder}")

    png = dynamics_figure(log.rows, os.path.join(results_dir, "dynamics.png"))
    table = os.path.join(results_dir, "dynamics.md")
    write_table(log.rows, table)
    return [log.path, png, table]


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
