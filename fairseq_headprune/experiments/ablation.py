"""`fairseq-headprune ablate`: Michel et al. Section 3 on any checkpoint.

--mode single     mask one head at a time (Table 1), every head of --types
--mode keep-one   reduce one layer at a time to a single head, trying each (Tables 2/3); with
                  --select-subset A --report-subset B the head is chosen on A and reported on B (Tables 5/6)
--metric loss     score by teacher-forced NLL of the references instead of BLEU: a fast preview
--report-metric   keep-one with --report-subset: score the chosen heads by this metric (default --metric); with
                  --metric loss --report-metric bleu each layer's head is chosen by NLL (one pass per mask) and
                  only the chosen heads are decoded, scored by BLEU and tested for significance

Rows are appended to DIR/ablation-MODE[-loss].jsonl as each mask finishes; a rerun resumes. BLEU rows are
tested against the unmasked model with compare-mt's paired bootstrap.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

from fairseq_headprune.errors import UserError
from fairseq_headprune.evaluate import SubsetEvaluator
from fairseq_headprune.heads import ATTENTION_TYPES, Head, HeadLayout
from fairseq_headprune.loading import file_sha256, load, progress_for
from fairseq_headprune.masking import set_head_masks
from fairseq_headprune.results.log import ResultsLog
from fairseq_headprune.stats import BleuBootstrap


@dataclass(frozen=True)
class Job:
    """One mask of a sweep: its result-row key, the heads it masks, and the head it is about."""

    key: str
    masked: Tuple[Head, ...]
    head: Head


def add_args(parser) -> None:
    g = parser.add_argument_group("ablate")
    g.add_argument("--results-dir", required=True)
    g.add_argument("--mode", choices=["single", "keep-one"], default="single")
    g.add_argument("--metric", choices=["bleu", "loss"], default="bleu")
    g.add_argument("--types", default=",".join(ATTENTION_TYPES), help="attention types to sweep, comma-separated")
    g.add_argument("--references", help="raw reference file of the subset (default: its decoded targets)")
    g.add_argument("--select-subset", help="keep-one: choose each layer's head on this subset (default --gen-subset)")
    g.add_argument("--report-subset", help="keep-one: report the chosen heads on this subset")
    g.add_argument("--report-references", help="raw reference file of --report-subset")
    g.add_argument("--report-metric", choices=["bleu", "loss"],
                   help="keep-one: metric of the --report-subset sweep (default --metric)")
    g.add_argument("--bootstrap-samples", type=int, default=1000)
    g.add_argument("--significance", type=float, default=0.01, help="p-value threshold")
    g.add_argument("--bootstrap-seed", type=int, default=1)
    g.add_argument("--masks-per-batch", type=int, default=1,
                   help="masks sharing one beam search, each sentence once per mask (1: one decode per mask, the "
                        "fastest on CPU; more pays where per-step overhead dominates: GPUs, small batches)")
    # --num-shards/--shard-id are fairseq's own options; here they split the masks (never the data: BLEU is a
    # corpus score). Under torchrun, RANK and WORLD_SIZE set them.


def parse_types(text: str) -> List[str]:
    types = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in types if t not in ATTENTION_TYPES]
    if bad or not types:
        name = bad[0] if bad else text
        raise UserError(f"--types: unknown attention type {name!r} (use {', '.join(ATTENTION_TYPES)})")
    return types


def single_head_jobs(layout: HeadLayout, types: Iterable[str]) -> List[Job]:
    return [Job(str(h), (h,), h) for h in layout.all_heads(types)]


def keep_one_jobs(layout: HeadLayout, types: Iterable[str]) -> List[Job]:
    jobs = []
    for t in types:
        for layer in layout.layers(t):
            held = layout.heads[(t, layer)]
            for kept in held:
                masked = tuple(Head(t, layer, h) for h in held if h != kept)
                jobs.append(Job(f"keep:{Head(t, layer, kept)}", masked, Head(t, layer, kept)))
    return jobs


@dataclass
class Sweep:
    """Runs jobs on one subset, appending a row per job to a resumable results log."""

    evaluator: SubsetEvaluator
    metric: str
    log: ResultsLog
    bootstrap_samples: int = 1000
    bootstrap_seed: int = 1
    significance: float = 0.01
    masks_per_batch: int = 1
    baseline: Dict = field(default_factory=dict)

    def run_baseline(self) -> Dict:
        done = {row["key"]: row for row in self.log.rows}
        if "baseline" not in done:
            set_head_masks(self.evaluator.loaded.model, [])
            self.log.append({"key": "baseline", **self._score(self._outputs(), baseline=True)})
            done = {row["key"]: row for row in self.log.rows}
        self.baseline = done["baseline"]
        return self.baseline

    def _outputs(self):
        return self.evaluator.translate() if self.metric == "bleu" else self.evaluator.nll()

    def _score(self, outputs, baseline: bool = False) -> Dict:
        if self.metric == "loss":
            row = {"nll": outputs}
            if not baseline:
                row["delta"] = outputs - self.baseline["nll"]
            return row
        bleu = self.evaluator.bleu(outputs).score
        digest = hashlib.sha256("\n".join(outputs).encode()).hexdigest()[:16]
        row = {"bleu": bleu, "hypotheses_sha256": digest}
        if baseline:
            row["hypotheses"] = outputs
            return row
        result = self._bootstrap.test(outputs)
        row.update(delta=bleu - self.baseline["bleu"], p_value=result.p_value,
                   significant=bool(result.p_value < self.significance and bleu != self.baseline["bleu"]))
        return row

    def run(self, jobs: List[Job], progress=None) -> None:
        self.run_baseline()
        if self.metric == "bleu":
            self._bootstrap = BleuBootstrap(
                self.evaluator.references, self.baseline["hypotheses"], self.bootstrap_samples, self.bootstrap_seed
            )
        done = self.log.done()
        todo = [job for job in jobs if job.key not in done]
        model = self.evaluator.loaded.model
        set_head_masks(model, [])
        groups = [todo[i : i + self.masks_per_batch] for i in range(0, len(todo), self.masks_per_batch)]
        for group in progress(groups) if progress else groups:
            if self.metric == "bleu":  # one shared decode per group of masks
                outputs = self.evaluator.translate_many([job.masked for job in group], self.masks_per_batch)
            else:
                outputs = []
                for job in group:
                    set_head_masks(model, job.masked)
                    outputs.append(self.evaluator.nll())
                set_head_masks(model, [])
            for job, out in zip(group, outputs):
                row = {"key": job.key, "type": job.head.type, "layer": job.head.layer, "head": job.head.head}
                self.log.append({**row, **self._score(out)})


def header(args, cfg, loaded, evaluator: SubsetEvaluator, mode: str, metric: Optional[str] = None) -> Dict:
    g = cfg.generation
    metric = metric or args.metric
    return {
        "command": f"ablate --mode {mode}",
        "metric": metric,
        "checkpoint_sha256": file_sha256(loaded.checkpoint),
        "subset": evaluator.subset,
        "data_fingerprint": evaluator.data_fingerprint(),
        "decoding": {"beam": g.beam, "lenpen": g.lenpen, "max_len_a": g.max_len_a, "max_len_b": g.max_len_b,
                     "remove_bpe": cfg.common_eval.post_process, "bpe": str(cfg.bpe._name if cfg.bpe else None),
                     "tokenizer": str(cfg.tokenizer._name if cfg.tokenizer else None)},
        "bleu_signature": evaluator.bleu_signature() if metric == "bleu" else None,
        "bootstrap": {"samples": args.bootstrap_samples, "seed": args.bootstrap_seed,
                      "significance": args.significance} if metric == "bleu" else None,
    }


def shard_of(cfg) -> Tuple[int, int]:
    """(shard id, number of shards): torchrun's RANK/WORLD_SIZE, else --shard-id/--num-shards."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    shards, shard = cfg.dataset.num_shards, cfg.dataset.shard_id
    if not 0 <= shard < shards:
        raise UserError(f"--shard-id {shard} must be in 0..{shards - 1}")
    return shard, shards


def results_name(mode: str, metric: str) -> str:
    return f"ablation-{mode}" + ("-loss" if metric == "loss" else "")


def report_name(metric: str, report_subset: str, report_metric: Optional[str] = None) -> str:
    """The keep-one report file's name: the selection metric, the report subset and, when it differs, the report
    metric (ablation-keep-one-loss-report-test-bleu: chosen by NLL, scored by BLEU on test)."""
    report_metric = report_metric or metric
    return (results_name("keep-one", metric) + f"-report-{report_subset}"
            + (f"-{report_metric}" if report_metric != metric else ""))


def check_options(args) -> None:
    """The option combinations that make no sense, refused before the model is loaded."""
    if args.report_subset and args.mode != "keep-one":
        raise UserError("--report-subset applies to --mode keep-one")
    for option, value in (("--report-metric", args.report_metric), ("--report-references", args.report_references)):
        if value and args.mode != "keep-one":
            raise UserError(f"{option} applies to --mode keep-one (with --report-subset)")
        if value and not args.report_subset:
            raise UserError(f"{option} needs --report-subset (the subset the chosen heads are reported on)")


def run(cfg, args) -> None:
    from fairseq_headprune.experiments import ablation_report as report

    types = parse_types(args.types)
    check_options(args)
    loaded = load(cfg)
    subset = args.select_subset or cfg.dataset.gen_subset
    evaluator = SubsetEvaluator(loaded, subset, args.references)
    layout = HeadLayout.of(loaded.model)
    jobs = single_head_jobs(layout, types) if args.mode == "single" else keep_one_jobs(layout, types)
    shard, shards = shard_of(cfg)
    distributed = _init_distributed()
    name = results_name(args.mode, args.metric)
    path = os.path.join(args.results_dir, name + (f".shard-{shard}-of-{shards}" if shards > 1 else "") + ".jsonl")
    hdr = header(args, cfg, loaded, evaluator, args.mode)
    sweep = Sweep(evaluator, args.metric, ResultsLog(path, hdr), args.bootstrap_samples,
                  args.bootstrap_seed, args.significance, max(1, args.masks_per_batch))
    sweep.run(jobs[shard::shards], progress=progress_for(cfg, f"ablate {args.mode}"))
    if distributed:
        import torch.distributed as dist

        dist.barrier()  # every rank has written its shard: rank 0 gathers them into one file
        if dist.get_rank() != 0:
            return
    if shards > 1:
        path = report.merge_shards(args.results_dir, name, shards, hdr, [j.key for j in jobs])
        if path is None:
            print(f"shard {shard} of {shards} done; the table is written when every shard has finished")
            return
    rows = ResultsLog(path, hdr).rows
    outputs = report.write_tables(args.results_dir, name, rows, layout, types, args.mode, args.metric)
    if args.mode == "keep-one" and args.report_subset:
        outputs += report_keep_one_on(args, cfg, loaded, layout, types, rows)
    for out in outputs:
        print(f"wrote {out}")


def report_keep_one_on(args, cfg, loaded, layout, types, select_rows) -> List[str]:
    """Tables 5/6: the head chosen per layer on the selection subset, evaluated on the report subset."""
    from fairseq_headprune.experiments import ablation_report as report

    metric = args.report_metric or args.metric
    chosen = report.best_per_layer(select_rows, args.metric)
    evaluator = SubsetEvaluator(loaded, args.report_subset, args.report_references)
    selected_on = args.select_subset or cfg.dataset.gen_subset
    hdr = {**header(args, cfg, loaded, evaluator, "keep-one-report", metric), "selected_on": selected_on}
    if metric != args.metric:  # only then: report files of one metric keep their header
        hdr["selection_metric"] = args.metric
    name = report_name(args.metric, args.report_subset, metric)
    log = ResultsLog(os.path.join(args.results_dir, name + ".jsonl"), hdr)
    jobs = [job for job in keep_one_jobs(layout, types) if job.key in {row["key"] for row in chosen}]
    Sweep(evaluator, metric, log, args.bootstrap_samples, args.bootstrap_seed, args.significance,
          max(1, args.masks_per_batch)).run(jobs, progress=progress_for(cfg, "ablate keep-one report"))
    return report.write_keep_one_transfer(args.results_dir, name, chosen, log.rows, args.metric, metric,
                                          selected_on, args.report_subset)


def _init_distributed() -> bool:
    """Under torchrun, join the process group (gloo on CPU, NCCL on GPUs) so ranks can wait for each other."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return False
    import datetime

    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(days=1))
    return True

