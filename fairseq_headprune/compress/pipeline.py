"""`compress`: from a user's checkpoint to a deployable model at a stated speed (or within a stated BLEU loss), in one
staged, resumable run. This module runs PIPELINE, the stages in order, caches each and logs them; each stage is a
module of compress.stages declaring its Stage (compress.stages.contract: its Inputs, whose fields are its identity,
and its build, returning its typed result, both from the run's Context and the results before it).

Stages, each cached under OUT/stages/NAME/ by its identity (what it computes from, by content and value, and the
digest of the stage before it), so a rerun after kill -9 resumes at the first stage not finished, a changed option
reruns the stage it alters and every stage after it (never a mix), and a larger --budget-epochs extends recovery.
A record names the files inside OUT relative to it (the user's own files absolute), so OUT resumes from any
directory and wherever it is moved or copied. The first line's estimate counts exactly the stages this command
will run. In order:

  cost-table  what each lever buys in the engine (prune.levers: crude shapes at equal work, interleaved; also
              cached per model, engine and CPU outside OUT), and which points (heads per stack, decoder depth, FFN
              share, the vocabulary map) reach the target. A target no point reaches is refused in one line here,
              before any long work.
  choice      the shape and its heads. --speedup: the heads of each point by the Fisher estimate of the loss
              increase on calibration sentences of train (the per-stack Fisher fill of `shrink`), a depth's layers
              those `shrink --keep-layers` removes (greedy calibration loss, recorded), the structures (depth, FFN
              share) ranked by the calibration NLL of their first shape after shrink's closed-form fits; the first
              shape of each kind of cut (structure, map) of the 6 best structures, and the fastest, timed as slices
              of the shape that ships (a kind whose shapes all missed the target gets its next shape); of those
              whose 95% interval clears the target, the lowest calibration NLL after the fits, the map off at
              equal NLL (compress.choice).
              --max-bleu-loss: the fastest shape of the frontier (predicted speed against Fisher estimate) whose
              shrunk model, before recovery, loses at most X BLEU in the engine on a held-out split of valid (its
              first --heldout-sentences by id, at most half, as the subset `heldout` of OUT/stages/choice/data;
              recovery early-stops on the rest), found by bisection. Before recovery is the conservative side:
              recovery lowers the loss further. This mode moves heads only (the Fisher frontier does not compare a
              depth cut with heads; recorded as `levers`).
  shrink      those heads (and decoder layers) removed and the model reconstructed (window fit 1000 steps, lr 3e-4,
              train calibration: the recipe the recover study measured best).
  recover     fairseq-train (prune.recover.recover): distillation from the unpruned model, early stopping on
              valid, resumable from its own checkpoints.
  export      with --keep-vocab, the vocabulary trimmed to its corpora (prune.vocab_trim: checked against the recovered
              model, its dictionaries beside it); CTranslate2 (ct2 engines): float32 parity against fairseq on
              valid, then the engine's compute type.
  measure     speed over the unpruned model in the same engine on valid sentences, at equal work and as decoded,
              interleaved in the same rounds; the FLOP ratio.
  report      --gen-subset decoded once by both models in the engine: BLEU, paired-bootstrap p. No choice reads it.

Then OUT/model.pt (with --keep-vocab its dictionaries beside it), OUT/ct2/, OUT/MODEL_CARD.md and OUT/compress.json,
each written whole (compress.json last).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

from fairseq_headprune.compress import preflight
from fairseq_headprune.prune import levers
from fairseq_headprune.compress.options import STAGES, CompressOptions
from fairseq_headprune.prune.recovery_config import TRAIN_DEFAULTS
from fairseq_headprune.prune.shrink import calibration_samples
from fairseq_headprune.compress.stages import (choice, cost_table, export, measure, outputs, plan, points, recover,
                                               recovery, report, shrink)
from fairseq_headprune.compress.stages.common import max_tokens, trim_point
from fairseq_headprune.compress.stages.contract import Context, Results, Stage
from fairseq_headprune.compress.stages.results import StageResult, shipped_checkpoint
from fairseq_headprune.core.masking import head_masks
from fairseq_headprune.errors import UserError
from fairseq_headprune.fairseq_io.loading import load_subset
from fairseq_headprune.records.log import FolderLock, read_json, write_json_atomic
from fairseq_headprune.records.run_folder import relative_paths, resolved_paths


# --------------------------------------------------------------------------------------------- stages on disk


RELATIVE = "run_folder_paths"  # a stage record's pointers to the paths in its result that are relative to OUT


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def as_stored(obj) -> Dict:
    """An identity as its record stores it (tuples as lists, other values as their text)."""
    return json.loads(json.dumps(obj, default=str))


class StageStore:
    """OUT/stages/NAME/: a stage is done when its stage.json (identity and result, written atomically after
    everything else) holds this run's identity. Anything else found there is removed before the stage runs, except
    a resumable stage's own work (resume.json equal to this run's resume key). A result's paths inside OUT are
    stored relative to it (listed under RELATIVE) and resolved against OUT as it is now: the folder moves whole."""

    def __init__(self, out: str):
        self.out = os.path.abspath(out)
        self.root = os.path.join(self.out, "stages")

    def folder(self, name: str) -> str:
        return os.path.join(self.root, name)

    def record(self, name: str) -> Optional[Dict]:
        """The stage's record as stored (its digest is what the stage after it follows)."""
        return read_json(os.path.join(self.folder(name), "stage.json"))

    def result(self, record: Dict) -> Dict:
        """A record's result, its run-folder paths resolved against OUT where it is now."""
        return resolved_paths(record["result"], self.out, record.get(RELATIVE, []))

    def done(self, name: str, identity: Dict) -> Optional[Dict]:
        record = self.record(name)
        return record if record and record.get("identity") == identity else None

    def begin(self, name: str, resume_key: Optional[Dict] = None) -> str:
        folder = self.folder(name)
        keep = resume_key is not None and read_json(os.path.join(folder, "resume.json")) == resume_key
        if os.path.exists(os.path.join(folder, "stage.json")):
            os.remove(os.path.join(folder, "stage.json"))  # never vouches for what is about to replace it
        if not keep and os.path.exists(folder):
            shutil.rmtree(folder)
        os.makedirs(folder, exist_ok=True)
        if resume_key is not None:
            write_json_atomic(os.path.join(folder, "resume.json"), resume_key)
        return folder

    def finish(self, name: str, identity: Dict, result: Dict) -> Dict:
        """The record written (its paths inside OUT relative to it) and returned as stored."""
        stored, pointers = relative_paths(result, self.out)
        record = {"identity": identity, "result": stored, **({RELATIVE: pointers} if pointers else {})}
        write_json_atomic(os.path.join(self.folder(name), "stage.json"), record)
        return record


class StageBar:
    """A progress bar per stage, its total the stage's estimate in seconds (so tqdm's ETA is the estimate's), moved
    by the clock from a thread and closed at the stage's real time."""

    def __init__(self, name: str, estimate: float, enabled: bool = True):
        self.name, self.estimate, self.enabled = name, max(estimate, 1.0), enabled

    def __enter__(self):
        if not self.enabled:
            return self
        from tqdm import tqdm

        import sys

        self.bar = tqdm(total=round(self.estimate), desc=f"{self.name:<10}", unit="s", leave=True,
                        mininterval=1 if sys.stderr.isatty() else 60,  # a log file gets a line a minute
                        bar_format="{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} s [{elapsed}<{remaining}]")
        self.stop = threading.Event()
        self.start = time.time()

        def tick():
            while not self.stop.wait(1.0):
                n = min(int(time.time() - self.start), self.bar.total - 1)
                if n > self.bar.n:
                    self.bar.update(n - self.bar.n)

        self.thread = threading.Thread(target=tick, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return
        self.stop.set()
        self.thread.join()
        spent = int(time.time() - self.start)
        self.bar.total = max(spent, 1)
        self.bar.update(self.bar.total - self.bar.n)
        self.bar.close()


# --------------------------------------------------------------------------------------------- the run


PIPELINE = (cost_table.STAGE, choice.STAGE, shrink.STAGE, recover.STAGE, export.STAGE, measure.STAGE, report.STAGE)
assert tuple(stage.name for stage in PIPELINE) == STAGES


class Run:
    """One compress run over a loaded (unpruned) model: the stages of PIPELINE in order, each cached by its
    identity."""

    def __init__(self, loaded, options: CompressOptions, log: Callable = print, progress: bool = True):
        self.loaded, self.options, self.log, self.progress = loaded, options, log, progress
        self.store = StageStore(options.out)
        self.results: Results = {}
        self.previous = ""  # digest of the last stage's record
        self.threads = 1  # the recovery's torch threads (run: OMP_NUM_THREADS, else every core)
        # what _plan measures before the first stage: the context every stage reads (the timing batches and
        # rounds, the cost table's identity), the rates probed now, each stage's estimate and what is left of it
        self.context: Optional[Context] = None
        self.rates: Dict[str, float] = {}
        self.plan: Dict[str, float] = {}
        self.todo: Dict[str, float] = {}

    # -- the stage machinery

    def run_stage(self, stage: Stage) -> StageResult:
        """One stage of the contract: its refusals, its record reused or built (timed, its seconds in its record),
        what follows from its result."""
        context, results, name, estimate = self.context, self.results, stage.name, self.todo[stage.name]
        inputs = stage.inputs(context, results)
        if stage.check is not None:
            stage.check(context, inputs)
        identity = as_stored({"after": self.previous, **inputs.identity()})
        record = self.store.done(name, identity)
        if record is None:
            folder = self.store.begin(name, stage.resume_key(inputs) if stage.resume_key is not None else None)
            start, cpu = time.perf_counter(), time.process_time()
            with StageBar(name, estimate, self.progress):
                built = stage.build(folder, inputs, context, results)
            # cpu: this call's (a resumed stage: its rest)
            seconds, cpu = round(time.perf_counter() - start, 1), round(time.process_time() - cpu, 1)
            built = built.with_record(seconds=seconds, cpu_seconds=cpu, estimated_cpu_seconds=round(estimate, 1))
            record = self.store.finish(name, identity, built.record)
            self.log(f"{name}: done in {seconds:.0f}s ({cpu / 60:.1f} CPU minutes; estimated {estimate / 60:.1f})")
        else:
            self.log(f"{name}: cached ({self.store.folder(name)})")
        self.previous = digest(record)
        results[name] = stage.result.of(self.store.result(record))
        if stage.after is not None:
            stage.after(context, results)
        return results[name]

    def stop_here(self, name: str) -> bool:
        if self.options.stop_after == name:
            self.log(f"stopped after {name} (--stop-after); the same command without it goes on from here")
            return True
        return False

    def check(self) -> None:
        """Every refusal the loaded model and data can give, in one line, before OUT is made or anything runs."""
        preflight.check(self.loaded, self.options)

    def run(self) -> Optional[Dict]:
        import torch

        threads = self.threads = torch.get_num_threads()  # the recovery's (OMP_NUM_THREADS, else every core)
        torch.set_num_threads(1)
        try:
            with head_masks(self.loaded.model, []):  # the unpruned model as loaded, its masks restored after
                return self._run()
        finally:
            torch.set_num_threads(threads)

    def _run(self) -> Optional[Dict]:
        cached = self._plan()
        if self.options.dry_run:
            for line in self._plan_lines(cached):
                self.log(line)
            return None
        return self._stages()

    def _plan(self) -> set:
        """The context every stage reads, the rates measured now and each stage's estimate (what is left of it),
        logged; returns the stages a rerun finds done."""
        options, loaded = self.options, self.loaded
        timing = levers.timing_batches(loaded, options.timing_subset, options.timing_sentences, options.deploy_batch)
        rounds = levers.timing_rounds(len(timing), options.runs)
        train_tokens = int(TRAIN_DEFAULTS["--max-tokens"])  # a batch as recovery trains on (the probe's rates)
        with max_tokens(loaded, train_tokens):
            calibration, _ = calibration_samples(loaded, "train", 200, train_tokens)
        trim = trim_point(loaded, options)
        self.context = Context(loaded, options, timing, rounds,
                               cost_table.table_identity(loaded, options, timing, rounds, trim),
                               self.threads, self.store.root, self.log, trim)
        rows = len(levers.lever_rows(loaded.model)) + (options.map_state() != "off")  # the map's row
        rates = plan.probe(loaded, options, timing, calibration)
        estimate = plan.estimates(loaded, options, rates, rows, rounds)
        cached, done_epochs = self._cached_stages()
        todo = {name: (0.0 if name in cached else s) for name, s in estimate.items()}
        if done_epochs and options.budget_epochs:  # an extension trains the epochs not yet trained
            todo["recover"] *= max(options.budget_epochs - done_epochs, 0) / options.budget_epochs
        self.log(plan.estimate_line(options, todo, cached, rates))
        if options.budget_epochs and not options.recovered and "recover" not in cached and not options.dry_run:
            self.log(self._memory_line())
        self.rates, self.plan, self.todo = rates, estimate, todo
        if rounds > options.runs:
            self.log(f"timing: {len(timing)} batches of '{options.timing_subset}', so {rounds} interleaved rounds "
                     f"(--runs {options.runs}) give every sign test at least {levers.MIN_PAIRED} paired batches")
        return cached

    def _stages(self) -> Optional[Dict]:
        """Each stage in order (its record reused when its identity holds), up to --stop-after; then the outputs."""
        for stage in PIPELINE:
            self.run_stage(stage)
            if self.stop_here(stage.name):
                return None
        context, results = self.context, self.results
        records = {**{name: result.record for name, result in results.items()},
                   "cost-table": points.smoothed(context, results)}
        return outputs.write(self.loaded, context.shipped(results), records, points.points(context, results),
                             self.rates, self.plan, results["export"], shipped_checkpoint(results), self.log)

    def _plan_lines(self, cached: set) -> List[str]:
        """--dry-run: every stage with the data it reads and its estimate, then the recovery's command."""
        o, context = self.options, self.context
        data, sample = recovery.recovery_set(self.loaded, o, None, self.store.root, self.log, prepare=False)
        command = recovery.recovery_command(self.loaded, o, data, self.store.folder("recover"),
                                            os.path.join(self.store.folder("shrink"), "model.pt")) \
            if o.budget_epochs and not o.recovered else None
        return plan.plan_lines(o, context.timing, context.rounds, self.todo, cached, sample, command,
                               len(load_subset(self.loaded, o.calibration_subset)), self._memory_line())

    def _memory_line(self) -> str:
        parameters = sum(p.numel() for p in self.loaded.model.parameters())
        return plan.memory_line(parameters, plan.recovery_processes(self.options), levers.available_memory())

    def _cached_stages(self) -> Tuple[set, int]:
        """The stages this run will find done: the cost table by its identity (here or in the cache); each later
        one by the identity the run will give it, computed from the records before it (a changed option makes its
        stage and every later one run). And the epochs a recovery of this run's shrink holds under another
        budget (an extension trains the rest)."""
        context = self.context.quiet()
        record = self.store.done("cost-table", as_stored({"after": "", **context.table_identity}))
        if record is None:
            return {"cost-table"} if levers.cached_table(cost_table.cost_cache(self.options),
                                                         context.table_identity) else set(), 0
        cached, results = {"cost-table"}, {"cost-table": PIPELINE[0].result.of(self.store.result(record))}
        for stage in PIPELINE[1:]:
            try:
                identity = as_stored({"after": digest(record), **stage.inputs(context, results).identity()})
            except UserError:  # refused when the stage runs, in its turn
                return cached, 0
            record = self.store.done(stage.name, identity)
            if record is None:
                return cached, self._held_epochs(stage.name, identity)
            cached.add(stage.name)
            results[stage.name] = stage.result.of(self.store.result(record))
        return cached, 0

    def _held_epochs(self, name: str, identity: Dict) -> int:
        """Epochs the recover stage's record trained for this very recovery (the same shrink and key), under
        another budget."""
        held = self.store.record("recover") if name == "recover" and "run" in identity else None
        if not held or any(held["identity"].get(k) != identity[k] for k in ("after", "run")):
            return 0
        return int(held["result"].get("budget_epochs") or 0)


def run(loaded, options: CompressOptions, log: Callable = print, progress: bool = True) -> Optional[Dict]:
    """The whole run under a lock on OUT (one process per folder)."""
    options.check()
    inputs = preflight.command_inputs(loaded.cfg.task.data, loaded.checkpoint,
                                      (options.references, *options.also_references))
    preflight.output_folder(options.out, inputs)
    compress = Run(loaded, options, log, progress)
    compress.check()
    if options.dry_run:  # the plan only: nothing is written, OUT not even made
        return compress.run()
    os.makedirs(options.out, exist_ok=True)
    with FolderLock(options.out, option="--out"):
        preflight.output_folder(options.out, inputs)  # as it is now that this process holds it
        return compress.run()
