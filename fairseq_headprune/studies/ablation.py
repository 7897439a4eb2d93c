"""Single-head and keep-one-head ablations (`fairseq-headprune ablate`): Michel et al. Section 3 on any checkpoint.

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
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from fairseq_headprune.errors import UserError
from fairseq_headprune.decoding.evaluate import SubsetEvaluator
from fairseq_headprune.core.heads import ATTENTION_TYPES, Head, HeadLayout
from fairseq_headprune.decoding.mask_batching import (
    MaskBatching,
    output_units,
    parse_masks_per_batch,
    rows_per_search,
    sized_groups,
)
from fairseq_headprune.core.masking import set_head_masks
from fairseq_headprune.records import layout as names
from fairseq_headprune.records.identity import run_identity
from fairseq_headprune.records.log import ResultsLog
from fairseq_headprune.records.rows import best_per_layer
from fairseq_headprune.stats import BleuBootstrap
from fairseq_headprune.studies import ablation_tables as tables
from fairseq_headprune.studies.ranking import parse_type_list
from fairseq_headprune.decoding.workers import map_tasks, parse_workers, pool_for
from fairseq_headprune.options import option
from fairseq_headprune.decoding.mask_batching import masks_per_batch_option
from fairseq_headprune.decoding.workers import workers_option


@dataclass(frozen=True)
class Job:
    """One mask of a sweep: its result-row key, the heads it masks, and the head it is about."""

    key: str
    masked: Tuple[Head, ...]
    head: Head


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
    """Runs jobs on one subset, appending a row per job to a resumable results log.

    BLEU sweeps decode masks in groups sharing beam searches (`masks_per_batch`: a number, or `auto`, measured on
    the first groups: fairseq_headprune.decoding.mask_batching); the groups run on `workers` local processes
    (fairseq_headprune.decoding.workers: each loads the model once and computes whole rows, bootstrap included; this
    process alone writes them, in job order). Neither changes a row."""

    evaluator: SubsetEvaluator
    metric: str
    log: Optional[ResultsLog]
    bootstrap_samples: int = 1000
    bootstrap_seed: int = 1
    significance: float = 0.01
    masks_per_batch: Union[int, str] = "auto"
    bootstrap_sample_ratio: float = 1.0
    baseline: Dict = field(default_factory=dict)
    workers: Union[int, str] = 1
    batching: Optional[MaskBatching] = None
    _bootstrap: Any = field(default=None, repr=False)

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
        if self._bootstrap is None:
            self._bootstrap = BleuBootstrap(
                self.evaluator.references, self.baseline["hypotheses"], self.bootstrap_samples, self.bootstrap_seed,
                sample_ratio=self.bootstrap_sample_ratio,
            )
        result = self._bootstrap.test(outputs)
        row.update(delta=bleu - self.baseline["bleu"], p_value=result.p_value,
                   significant=bool(result.p_value < self.significance and bleu != self.baseline["bleu"]))
        return row

    def run(self, jobs: List[Job], progress=None) -> None:
        done = self.log.done()
        todo = [job for job in jobs if job.key not in done]
        # NLL is one forward per mask: groups of 8 only spare the workers' messages
        self.batching = (MaskBatching(self.masks_per_batch, rows=rows_per_search(self.evaluator))
                         if self.metric == "bleu" else MaskBatching(8))
        config = SweepConfig(self.evaluator.spec, self.metric, self.bootstrap_samples, self.bootstrap_seed,
                             self.significance, self.bootstrap_sample_ratio)
        # the workers start (and load the model) while this process decodes the baseline
        with pool_for(self.workers, len(todo), sweep_worker, config) as (pool, workers):
            self.run_baseline()
            set_head_masks(self.evaluator.loaded.model, [])
            ticks = iter(progress(range(len(todo)))) if progress and todo else iter(())

            def write(group, result, seconds):
                rows, units, decoding = result  # the choice is timed on decoding alone (not BLEU and bootstrap)
                self.batching.record(len(group), decoding, units)
                for row in rows:
                    self.log.append(row)
                    next(ticks, None)

            map_tasks(sized_groups(todo, self.batching), self.rows, write, pool, shared=self.baseline)
            self.batching.finish()
            for _ in ticks:
                pass
        if todo:
            how = self.batching.reason() if self.metric == "bleu" else "one forward per mask"
            self.log.note_run({"masks": len(todo), "workers": workers,
                               "masks_per_batch": self.batching.as_dict() if self.metric == "bleu" else None})
            print(f"{os.path.basename(self.log.path)}: {len(todo)} masks, {how}; {workers}", flush=True)

    def rows(self, group: List[Job], baseline: Optional[Dict] = None) -> Tuple[List[Dict], int, float]:
        """The result rows of a group of jobs (in this process or a worker), the output they decoded and the
        CPU seconds their decoding (or NLL) took."""
        if baseline is not None and baseline != self.baseline:
            self.baseline, self._bootstrap = baseline, None
        model = self.evaluator.loaded.model
        start = time.process_time()  # CPU time: the batching choice must not follow other processes' load
        if self.metric == "bleu":  # the group shares beam searches
            outputs = self.evaluator.translate_many([job.masked for job in group], len(group))
            units = output_units(outputs)
        else:
            outputs = []
            for job in group:
                set_head_masks(model, job.masked)
                outputs.append(self.evaluator.nll())
            set_head_masks(model, [])
            units = len(group)
        seconds = time.process_time() - start
        rows = [{"key": job.key, "type": job.head.type, "layer": job.head.layer, "head": job.head.head,
                 **self._score(out)} for job, out in zip(group, outputs)]
        return rows, units, seconds


@dataclass(frozen=True)
class SweepConfig:
    """What a local worker needs to compute a sweep's rows (picklable)."""

    spec: Any  # evaluate.EvaluatorSpec
    metric: str
    bootstrap_samples: int
    bootstrap_seed: int
    significance: float
    bootstrap_sample_ratio: float


def sweep_worker(config: SweepConfig):
    """A local worker's handler: the model loaded once, then the rows of each group of jobs."""
    sweep = Sweep(config.spec.open(reuse=True), config.metric, None, config.bootstrap_samples, config.bootstrap_seed,
                  config.significance, bootstrap_sample_ratio=config.bootstrap_sample_ratio)
    return sweep.rows


@dataclass
class AblationOptions:
    """What `ablate` sweeps and how it scores; field names are the command's options."""

    subset: str = field(metadata={"flag": "--gen-subset"})
    # (field order = the order a command line renders them in)
    mode: str = option("single", flag="--mode", choices=("single", "keep-one"), always=True,  # command lines always
                       help="single: each head masked alone; keep-one: each layer keeps one head")  # say which sweep
    masks_per_batch: Union[int, str] = masks_per_batch_option()
    metric: str = option("bleu", flag="--metric", choices=("bleu", "loss"), help="what each mask is scored by")
    types: str = option(",".join(ATTENTION_TYPES), flag="--types", help="attention types to sweep, comma-separated")
    references: Optional[str] = option(None, flag="--references",
                                       help="raw reference file of the subset (default: its decoded targets)")
    select_subset: Optional[str] = option(None, flag="--select-subset",
                                          help="keep-one: choose each layer's head on this subset (default "
                                               "--gen-subset)")
    report_subset: Optional[str] = option(None, flag="--report-subset",
                                          help="keep-one: report the chosen heads on this subset")
    report_metric: Optional[str] = option(None, flag="--report-metric", choices=("bleu", "loss"),
                                          help="keep-one: metric of the --report-subset sweep (default --metric)")
    report_references: Optional[str] = option(None, flag="--report-references",
                                              help="raw reference file of --report-subset")
    bootstrap_samples: int = option(1000, flag="--bootstrap-samples", help="paired-bootstrap resamples")
    bootstrap_sample_ratio: float = option(1.0, flag="--bootstrap-sample-ratio",
                                           help="size of each bootstrap resample as a share of the set (compare-mt's "
                                                "default is 0.5)")
    significance: float = option(0.01, flag="--significance", help="p-value threshold")
    bootstrap_seed: int = option(1, flag="--bootstrap-seed", help="seed of the resamples")
    workers: Union[int, str] = workers_option()

    def check(self) -> None:
        """The option combinations that make no sense, refused before the model is loaded."""
        parse_type_list(self.types)
        self.masks_per_batch = parse_masks_per_batch(self.masks_per_batch)
        self.workers = parse_workers(self.workers)
        if self.report_subset and self.mode != "keep-one":
            raise UserError("--report-subset applies to --mode keep-one")
        for flag, value in (("--report-metric", self.report_metric),
                            ("--report-references", self.report_references)):
            if value and self.mode != "keep-one":
                raise UserError(f"{flag} applies to --mode keep-one (with --report-subset)")
            if value and not self.report_subset:
                raise UserError(f"{flag} needs --report-subset (the subset the chosen heads are reported on)")
        if self.bootstrap_samples < 1:
            raise UserError(f"--bootstrap-samples must be at least 1, not {self.bootstrap_samples}")
        if not 0 < self.bootstrap_sample_ratio <= 1:
            raise UserError(f"--bootstrap-sample-ratio must be in (0, 1], not {self.bootstrap_sample_ratio}")
        if not 0 < self.significance < 1:
            raise UserError(f"--significance must be in (0, 1), not {self.significance}")

    def bootstrap(self) -> Dict:
        return {"samples": self.bootstrap_samples, "sample_ratio": self.bootstrap_sample_ratio,
                "seed": self.bootstrap_seed, "significance": self.significance}


def header(loaded, evaluator: SubsetEvaluator, options: AblationOptions, mode: str,
           metric: Optional[str] = None, **extra) -> Dict:
    """The run identity of an ablation results file."""
    metric = metric or options.metric  # teacher-forced NLL never decodes: decoding options cannot change it
    return run_identity(f"ablate --mode {mode}", loaded, evaluator, metric=metric, decoding=metric == "bleu",
                        bootstrap=options.bootstrap() if metric == "bleu" else None,
                        bleu_signature=evaluator.bleu_signature() if metric == "bleu" else None, **extra)


def run(loaded, options: AblationOptions, results_dir: str, shard: Tuple[int, int] = (0, 1),
        distributed: bool = False, progress=None) -> List[str]:
    """Sweep the masks of this shard into DIR; when every shard is done, write the tables. Returns the files
    written (none while other shards are still running)."""
    types = parse_type_list(options.types)
    subset = options.select_subset or options.subset
    evaluator = SubsetEvaluator(loaded, subset, options.references)
    layout = HeadLayout.of(loaded.model)
    jobs = single_head_jobs(layout, types) if options.mode == "single" else keep_one_jobs(layout, types)
    shard_id, shards = shard
    name = names.ablation_name(options.mode, options.metric)
    path = os.path.join(results_dir, names.shard_name(name, shard_id, shards) + ".jsonl")
    hdr = header(loaded, evaluator, options, options.mode)
    sweep = Sweep(evaluator, options.metric, ResultsLog(path, hdr), options.bootstrap_samples,
                  options.bootstrap_seed, options.significance, options.masks_per_batch,
                  options.bootstrap_sample_ratio, workers=options.workers)
    sweep.run(jobs[shard_id::shards], progress=progress)
    if distributed:
        import torch.distributed as dist

        dist.barrier()  # every rank has written its shard: rank 0 gathers them into one file
        if dist.get_rank() != 0:
            return []
    if shards > 1:
        path = tables.merge_shards(results_dir, name, shards, hdr, [j.key for j in jobs])
        if path is None:
            print(f"shard {shard_id} of {shards} done; the table is written when every shard has finished")
            return []
    rows = ResultsLog(path, hdr).rows
    outputs = tables.write_tables(results_dir, name, rows, layout, types, options.mode, options.metric)
    if options.mode == "keep-one" and options.report_subset:
        outputs += report_keep_one_on(loaded, options, results_dir, layout, types, rows, progress)
    return outputs


def report_keep_one_on(loaded, options: AblationOptions, results_dir: str, layout, types, select_rows,
                       progress=None) -> List[str]:
    """Tables 5/6: the head chosen per layer on the selection subset, evaluated on the report subset."""
    metric = options.report_metric or options.metric
    chosen = best_per_layer(select_rows, options.metric)
    evaluator = SubsetEvaluator(loaded, options.report_subset, options.report_references)
    selected_on = options.select_subset or options.subset
    hdr = header(loaded, evaluator, options, "keep-one-report", metric, selected_on=selected_on,
                 selection_metric=options.metric)
    name = names.keep_one_report_name(options.metric, options.report_subset, metric)
    log = ResultsLog(os.path.join(results_dir, name + ".jsonl"), hdr)
    jobs = [job for job in keep_one_jobs(layout, types) if job.key in {row["key"] for row in chosen}]
    Sweep(evaluator, metric, log, options.bootstrap_samples, options.bootstrap_seed, options.significance,
          options.masks_per_batch, options.bootstrap_sample_ratio, workers=options.workers).run(jobs, progress=progress)
    return tables.write_keep_one_transfer(results_dir, name, chosen, log.rows, options.metric, metric,
                                          selected_on, options.report_subset)


def shard_of(num_shards: int, shard_id: int) -> Tuple[int, int]:
    """(shard id, number of shards): torchrun's RANK/WORLD_SIZE, else --shard-id/--num-shards."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if not 0 <= shard_id < num_shards:
        raise UserError(f"--shard-id {shard_id} must be in 0..{num_shards - 1}")
    return shard_id, num_shards


def init_distributed() -> bool:
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

