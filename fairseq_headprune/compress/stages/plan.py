"""The plan before any stage: rates measured on this machine now (probe) and each stage's estimate in CPU seconds
from them; the first line (what this command will cost: the stages it runs, those cached at 0); --dry-run's lines
(each stage, the data it reads, its estimate)."""
from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from typing import Dict, List, Optional

from fairseq_headprune.compress.choice import KINDS_TIMED, per_stack_points
from fairseq_headprune.prune import levers
from fairseq_headprune.compress.options import STAGES
from fairseq_headprune.prune.recovery_config import TRAIN_DEFAULTS
from fairseq_headprune.compress.stages.common import subset_tokens
from fairseq_headprune.core.heads import attention_modules
from fairseq_headprune.engines.engine_model import EngineModel
from fairseq_headprune.engines.fairseq_engine import fairseq_run


def cpu_seconds(fn, repeat: int = 2) -> float:
    """CPU seconds of this process (every thread) for one call of fn, the least of `repeat` calls (the first pays
    for allocations and caches): what a stage costs whatever else the machine runs meanwhile."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return max(best, 1e-6)


def probe(loaded, options, timing, calibration) -> Dict[str, float]:
    """Rates measured on this machine now, in CPU time, a few seconds: decoding (sentences/s) in the engine and in
    fairseq, the export of the model, a forward and a forward+backward of a training batch (target tokens/s), one
    window-fit step."""
    import torch

    rates = {}
    few = timing[:2]
    n = sum(s["id"].numel() for s in few)
    with tempfile.TemporaryDirectory(prefix="compress-probe-") as tmp:
        holder = {}

        def build():
            shutil.rmtree(os.path.join(tmp, "m"), ignore_errors=True)
            holder["m"] = EngineModel(loaded, options.engine, folder=os.path.join(tmp, "m"))

        rates["export_s"] = cpu_seconds(build, 1) if options.engine != "fairseq" else 0.0
        if "m" not in holder:
            build()
        seconds = cpu_seconds(lambda: holder["m"].run(few))
    pad = loaded.task.target_dictionary.pad()
    rates["engine_sent_s"] = n / seconds  # and per reference token: the reported sets' sentences are longer or not
    rates["engine_tok_s"] = sum(int(s["target"].ne(pad).sum()) for s in few) / seconds
    rates["fairseq_sent_s"] = (rates["engine_sent_s"] if options.engine == "fairseq" else
                               n / cpu_seconds(lambda: fairseq_run(loaded, loaded.model, few)))
    sample = calibration[len(calibration) // 2]  # a full training batch of middling sentences
    tokens = int(sample["target"].ne(pad).sum())
    model = loaded.model

    def forward():
        with torch.no_grad():
            model(**sample["net_input"])

    def train_step():
        out = model(**sample["net_input"])[0]
        out.float().logsumexp(-1).sum().backward()
        model.zero_grad(set_to_none=True)

    rates["forward_tok_s"] = tokens / cpu_seconds(forward)
    rates["train_tok_s"] = tokens / cpu_seconds(train_step)
    attn = next(iter(attention_modules(model).values()))
    x = torch.randn(25, 40, attn.q_proj.in_features)  # one window-fit step of 1000 tokens, at the model's width

    def window_step():
        y, _ = attn(query=x, key=x, value=x, need_weights=False)
        y.pow(2).sum().backward()

    rates["window_step_s"] = cpu_seconds(window_step, 3)
    for p in attn.parameters():
        p.grad = None
    return rates



FIT_PASSES = 4  # a shape's NLL after the closed-form fits costs about 4 forward passes of the calibration sentences
# (2.8-6.1 on De-En's 1000 for four shapes of its runs, 5.4 on average before the fits' forwards started at the
# layer the last one reached)


def estimates(loaded, options, rates: Dict[str, float], rows: int,
              rounds: Optional[int] = None) -> Dict[str, float]:
    """Seconds each stage will take, from the measured rates (not guesses of them); `rounds`: the timing's
    interleaved rounds (levers.timing_rounds; --runs when not given)."""
    timing_n = options.timing_sentences
    runs = rounds or options.runs
    engine = rates["engine_sent_s"]
    calib_n, calib_tok = subset_tokens(loaded, options.calibration_subset, options.calibration_sentences)
    train_n, train_tok = subset_tokens(loaded, "train")
    valid_n, valid_tok = subset_tokens(loaded, "valid")
    sublayers = len(attention_modules(loaded.model))
    out = {"cost-table": (rows + 1) * ((runs + 2) * timing_n / engine + rates["export_s"])}
    out["choice"] = calib_tok / rates["train_tok_s"]
    if options.speedup is not None:  # the finalists timed beside the unpruned model (one per kind of cut of the
        finals = KINDS_TIMED * (2 if options.map_state() == "weighed" else 1) + 1  # structures ranked first, and
        models = 2 if options.shape is not None else 2 * finals  # the fastest) and (expected) one more round
        out["choice"] += models * ((runs + 2) * timing_n / engine + rates["export_s"])
        depth = len(loaded.model.decoder.layers)  # at most: the greedy layer order down to one layer and a
        out["choice"] += ((depth * (depth + 1) // 2 - 1) * calib_tok / rates["forward_tok_s"]  # gradient pass
                          + (depth - 1) * calib_tok / rates["train_tok_s"])  # per depth
        if options.shape is None:  # an NLL after shrink's closed-form fits per structure (depth, FFN share), and
            fits = depth * (len(levers.FFN.values(100)) + 1) + finals // 2  # one per finalist that (expected: half)
            out["choice"] += fits * FIT_PASSES * calib_tok / rates["forward_tok_s"]  # reaches the target
    shrink = (options.window.steps * sublayers * rates["window_step_s"] + 3 * calib_tok / rates["forward_tok_s"]
              + 2 * min(options.check_sentences, calib_n) / rates["fairseq_sent_s"])
    if options.quality_bound() is not None:  # shrinks and held-out decodes: a bisection over the frontier, whose
        held = min(options.heldout_sentences, valid_n)  # ~20 shapes took 5 probes on the bundled models
        probes = math.ceil(math.log2(max(2, len(per_stack_points(loaded.model)) // 3)))
        out["choice"] += probes * (shrink + held / rates["fairseq_sent_s"]) + held / rates["fairseq_sent_s"]
    out["shrink"] = shrink
    sample_n = min(options.recover_sentences, train_n)  # the recovery set, its epochs capped by the updates
    sample_tok = train_tok * sample_n / max(train_n, 1)
    epochs = min(float(options.budget_epochs), options.budget_updates / updates_per_epoch(sample_tok, options))
    out["recover"] = epochs * (sample_tok / rates["train_tok_s"] + sample_tok / rates["forward_tok_s"]
                               + valid_tok / rates["forward_tok_s"])
    if options.distillation.signal in ("sequences", "both"):  # the teacher's translations of train (once per teacher)
        out["recover"] += sample_n / rates["fairseq_sent_s"]
    if options.recovered:  # run elsewhere: only adopted here
        out["recover"] = 0.0
    out["export"] = (2 * options.check_sentences / rates["fairseq_sent_s"] + 2 * rates["export_s"]
                     if options.engine != "fairseq" else 0.0)
    if options.vocabulary.corpora:  # the trim: its check, two float32 exports to size it, the hypotheses of both
        out["export"] += 2 * options.check_sentences / rates["fairseq_sent_s"] + 2 * rates["export_s"]
    out["measure"] = 2 * (2 * runs + 2) * timing_n / engine + rates["export_s"]
    reported = sum(subset_tokens(loaded, subset)[1] for subset in (options.gen_subset, *options.also_report))
    out["report"] = 2 * reported / rates["engine_tok_s"]  # both models, every reported set
    return out


def updates_per_epoch(target_tokens: float, options) -> float:
    """About how many updates an epoch of `target_tokens` takes in the recovery's batches (its --max-tokens, the
    bundled model's batches three quarters full of target tokens: 252 updates an epoch of De-En's 28k pairs)."""
    given = list(options.recover_args) + list(options.train_options)
    max_tokens = next((given[i + 1] for i, a in enumerate(given[:-1]) if a == "--max-tokens"),
                      TRAIN_DEFAULTS["--max-tokens"])
    return max(1.0, target_tokens / (0.75 * int(max_tokens)))



def running(options) -> List[str]:
    """The stages this command goes through (cached or not): every one, or those up to --stop-after."""
    return list(STAGES[:STAGES.index(options.stop_after) + 1]) if options.stop_after else list(STAGES)


def estimate_line(options, todo: Dict[str, float], cached: set, rates: Dict[str, float]) -> str:
    """The first line: the CPU minutes of the stages this command will run (`todo`: each stage's estimate, 0 for
    one cached), each stage's; those after --stop-after named apart, not counted."""
    ran = running(options)
    later = [n for n in STAGES if n not in ran]

    def figures(names: List[str]) -> str:
        return ", ".join(f"{n} {'cached' if n in cached else f'{todo[n] / 60:.1f}'}" for n in names)

    return (f"compress ({options.target}, {options.engine}): this run will cost about "
            f"{sum(todo[n] for n in ran) / 60:.1f} CPU minutes on this machine ({figures(ran)}"
            + (f"; not run (--stop-after {options.stop_after}): {figures(later)}" if later else "")
            + f"; from rates measured just now in CPU time: {rates['engine_sent_s']:.0f} sentences/s in "
            f"{options.engine}, {rates['train_tok_s']:.0f} training tokens/s)")


BYTES_TRAINED, BYTES_TEACHER = 16, 4  # per parameter in fp32: weights, gradients and Adam's two moments; weights


def recovery_processes(options) -> int:
    """The processes the recovery trains in: --distributed-world-size of --recover-args or compress's own fairseq
    options (1 without)."""
    tokens = [t for arg in (*options.train_options, *options.recover_args) for t in arg.split("=", 1)]
    for flag, value in zip(tokens, tokens[1:]):
        if flag == "--distributed-world-size" and value.isdigit():
            return max(1, int(value))
    return 1


def size_words(size: float) -> str:
    """Bytes as GiB, or MiB below one GiB."""
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"


def memory_line(parameters: int, processes: int, available: Optional[int]) -> str:
    """The recovery's memory: per process at most the student (the unpruned model's size, the upper bound) with
    its gradients and Adam's moments, and the teacher, against what the machine has available now."""
    per = parameters * (BYTES_TRAINED + BYTES_TEACHER)
    have = f", against {size_words(available)} available now" if available else ""
    warn = ("; more than is available: fewer processes (--distributed-world-size) or a larger machine"
            if available and per * processes > available else "")
    return (f"recovery memory: at most {size_words(per)} a process (student with gradients and Adam's moments, "
            f"teacher; activations besides) x {processes} process(es){have}{warn}")


def calibration_words(options, size: int) -> str:
    """The calibration sentences as they are drawn: a sample of the subset, or all of it when it holds fewer."""
    o = options
    if size <= o.calibration_sentences:
        return f"all {size} sentences of '{o.calibration_subset}' (it holds no more than --calibration-sentences)"
    return f"{o.calibration_sentences} of the {size} sentences of '{o.calibration_subset}' drawn at random (seed " \
           f"{o.sample_seed})"


def plan_lines(options, timing, rounds: int, estimate: Dict[str, float], cached: set, sample: Dict,
               command: Optional[str], calibration_size: int, memory: str) -> List[str]:
    """--dry-run: every stage with the data it reads and its estimate, the recovery's memory, then its
    fairseq-train command."""
    o = options
    calibration = calibration_words(o, calibration_size)
    recovery = (f"{sample['sentences']} of the {sample['of']} pairs of '{sample['subset']}'"
                + (f" drawn at random (seed {o.sample_seed})" if sample["sampled"] else "")
                + (f", beside the unpruned model's translations ({o.distillation.nbest} best each) of "
                   f"{len(o.distillation.source)} --distill-source file(s)" if o.distillation.source else "")
                + f"; early stopping on 'valid'; at most {o.budget_epochs} epochs and {o.budget_updates} updates"
                if o.budget_epochs else "nothing: --budget-epochs 0")
    reads = {"cost-table": f"{sum(s['id'].numel() for s in timing)} sentences of '{o.timing_subset}' in "
                           f"{len(timing)} batches, {rounds} interleaved rounds",
             "choice": calibration + (f"; the first {o.heldout_sentences} of 'valid' (held out)"
                                      if o.quality_bound() is not None else ""),
             "shrink": calibration, "recover": recovery,
             "export": f"{o.check_sentences} sentences of '{o.timing_subset}'"
                       + (f"; the trim checked on {o.check_sentences} of '{o.calibration_subset}', its corpora "
                          + ", ".join(o.vocabulary.corpora) if o.vocabulary.corpora else ""),
             "measure": f"the cost table's batches of '{o.timing_subset}'",
             "report": ", ".join(f"'{s}'" for s in (o.gen_subset, *o.also_report))}
    lines = [f"plan (--dry-run: nothing was written): {o.out}"]
    ran = running(o)
    for name in STAGES:
        if o.recovered and name == "recover":
            what = f"--recovered {o.recovered} (a recovery run elsewhere)"
        else:
            what = reads[name]
        cost = "cached" if name in cached else f"{estimate[name] / 60:.1f} CPU min"
        lines.append(f"  {name:<10} {cost if name in ran else f'not run (--stop-after; {cost})'}: {what}")
    if o.budget_epochs and not o.recovered:
        lines.append(memory)
        lines.append("the recovery's command (run by the recover stage; or elsewhere after --stop-after shrink):")
        lines.append("  " + command)
    return lines
