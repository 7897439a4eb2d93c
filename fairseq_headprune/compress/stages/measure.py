"""The measure stage: the compressed model's speed over the unpruned one in the same engine on --timing-subset, at
equal work and as decoded, interleaved in the same rounds; the latency at batch 1; the FLOP ratio."""
from __future__ import annotations

import os
import statistics
import tempfile
from dataclasses import dataclass
from typing import Dict, Optional

import torch

from fairseq_headprune.compress.stages.common import engine_model
from fairseq_headprune.compress.stages.contract import Context, Inputs, Results, Stage
from fairseq_headprune.compress.stages.results import Measured, shipped_checkpoint
from fairseq_headprune.core import flops
from fairseq_headprune.core.shape import ModelShape
from fairseq_headprune.engines.timing import load_average, paired_speedup, speedup_interval, timed_rounds
from fairseq_headprune.engines.ct2 import ct2_shape, instruction_set, resident_bytes
from fairseq_headprune.engines.engine_model import COMPUTE_TYPE
from fairseq_headprune.prune.levers import cpu_model, folder_bytes, timing_batches
from fairseq_headprune.fairseq_io.loading import load_other, load_subset


@dataclass(frozen=True)
class MeasureInputs(Inputs):
    """What the measure reads besides the models: the cost table's timing batches and rounds (their identity), the
    engine, the latency's sentences, the deployment's batch and threads (None for the batches as timed on one
    thread), and what the other deployment's batches are drawn from and timed over (--timing-subset,
    --timing-sentences, --runs)."""
    timing: Dict
    engine: str
    latency_sentences: int
    deployment: Optional[Dict] = None
    other: Optional[Dict] = None

    @property
    def batch(self) -> Optional[int]:
        return (self.deployment or {}).get("batch")

    @property
    def threads(self) -> int:
        return (self.deployment or {}).get("threads", 1)


def inputs(context: Context, results: Results) -> MeasureInputs:
    o = context.shipped(results)
    deployed = o.deploy_batch is not None or o.deploy_threads != 1
    return MeasureInputs(context.table_identity, o.engine, o.latency_sentences,
                         {"batch": o.deploy_batch, "threads": o.deploy_threads} if deployed else None,
                         {"subset": o.timing_subset, "sentences": o.timing_sentences, "runs": o.runs})


OTHER_BATCH = 64  # the batch a deployment at batch 1 is also timed at


def build(folder: str, inputs: MeasureInputs, context: Context, results: Results) -> Measured:
    """Both models timed in the same rounds, at the deployment's batches and threads: equal work (forced to the
    unpruned model's mean length) and as decoded; then at the other batch (one sentence at a time, or OTHER_BATCH
    for a deployment at batch 1); the machine and each model's memory as served."""
    loaded, timing, rounds, ct2 = context.loaded, context.timing, context.rounds, results["export"].ct2
    pruned = load_other(loaded, shipped_checkpoint(results))
    with tempfile.TemporaryDirectory(prefix="compress-measure-") as tmp:
        models = {"unpruned": engine_model(loaded, inputs.engine, None, tmp, "unpruned", inputs.threads),
                  "compressed": engine_model(pruned, inputs.engine, ct2, tmp, "compressed", inputs.threads,
                                             unpruned=loaded)}
        natural = models["unpruned"].run(timing)
        length = max(1, round(statistics.mean(len(h) for h in natural["hypotheses"].values())))
        decoders = {k: m.run for k, m in models.items()}
        forced = timed_rounds(decoders, timing, rounds, length)
        as_decoded = timed_rounds(decoders, timing, rounds, 0)
        other = other_batches(loaded, inputs)
        at_other = timed_rounds(decoders, other, inputs.other["runs"], length)
        load = load_average()
        memory = served_memory(inputs, {"unpruned": os.path.join(tmp, "unpruned"), "compressed": ct2})
    src = [int(n) for s in timing for n in s["net_input"]["src_lengths"].tolist()]
    beam, batch = int(loaded.cfg.generation.beam), max(s["id"].numel() for s in timing)
    shape_of = ModelShape.of if inputs.engine == "fairseq" else ct2_shape
    n = sum(s["id"].numel() for s in timing)
    other_key = "batch64" if inputs.batch == 1 else "latency_batch1"
    return Measured.of({"subset": inputs.other["subset"], "sentences": n, "runs": rounds, "batches": len(timing),
            "forced_length": length, "largest_batch": batch, "load_average": load,
            "deployment": {"batch": inputs.batch, "threads": inputs.threads, "memory": memory,
                           **environment(inputs.engine)},
            "speedup_equal_work": round(paired_speedup(forced["unpruned"], forced["compressed"]), 3),
            "speedup_as_decoded": round(paired_speedup(as_decoded["unpruned"], as_decoded["compressed"]),
                                        3),
            "speedup_equal_work_interval": speedup_interval(forced["unpruned"], forced["compressed"], len(timing)),
            "speedup_as_decoded_interval": speedup_interval(as_decoded["unpruned"], as_decoded["compressed"],
                                                            len(timing)),
            "speedup_equal_work_total": round(sum(forced["unpruned"]) / sum(forced["compressed"]), 3),
            "sentences_per_s": {k: round(n * rounds / sum(v), 1) for k, v in as_decoded.items()},
            other_key: {"sentences": sum(s["id"].numel() for s in other), "forced_length": length,
                        "batch": OTHER_BATCH if inputs.batch == 1 else 1,
                        "ms": {k: round(1000 * statistics.median(v), 2) for k, v in at_other.items()},
                        "speedup": round(paired_speedup(at_other["unpruned"], at_other["compressed"]), 3),
                        "interval": speedup_interval(at_other["unpruned"], at_other["compressed"], len(other))},
            "flop_ratio": round(flops.flop_ratio(shape_of(loaded.model), shape_of(pruned.model), src,
                                                 [length + 1] * len(src), beam, batch), 4)})


def other_batches(loaded, inputs: MeasureInputs):
    """The batches of the other deployment: OTHER_BATCH sentences each when the model is served at batch 1, else
    the first --latency-sentences one at a time."""
    if inputs.batch == 1:
        return timing_batches(loaded, inputs.other["subset"], inputs.other["sentences"], OTHER_BATCH)
    return single_sentences(loaded, inputs.other["subset"], inputs.latency_sentences)


def environment(engine: str) -> Dict:
    """The machine and engine a measurement was made on: the CPU, its vector instruction set, CTranslate2's version
    (torch's for --engine fairseq)."""
    info = {"cpu": cpu_model(), "instruction_set": instruction_set(), "torch": torch.__version__}
    if engine != "fairseq":
        import ctranslate2  # optional heavy dependency: CTranslate2

        info["ctranslate2"] = ctranslate2.__version__
    return info


def served_memory(inputs: MeasureInputs, folders: Dict[str, Optional[str]]) -> Optional[Dict[str, int]]:
    """Each CTranslate2 model's resident bytes once loaded and run in a process of its own, and its folder's bytes on
    disk (None for --engine fairseq, or where it cannot be read)."""
    if inputs.engine == "fairseq" or not all(folders.values()):
        return None
    sizes = {k: resident_bytes(folder, COMPUTE_TYPE[inputs.engine], inputs.threads)
             for k, folder in folders.items()}
    if not all(v is not None for v in sizes.values()):
        return None
    # on disk too: a small model's resident size is mostly CTranslate2's own allocations, its weights' bytes are not
    return {**sizes, "on_disk": {k: folder_bytes(folder) for k, folder in folders.items()}}


def single_sentences(loaded, subset: str, n: int):
    """The first n sentences of a subset (by id), one batch each: the latency at batch 1."""
    dataset = load_subset(loaded, subset)
    return [dataset.collater([dataset[i]]) for i in range(min(n, len(dataset)))]


STAGE = Stage("measure", inputs, build, Measured)
