"""The measure stage: the compressed model's speed over the unpruned one in the same engine on --timing-subset, at
equal work and as decoded, interleaved in the same rounds; the latency at batch 1; the FLOP ratio."""
from __future__ import annotations

import statistics
import tempfile
from typing import Dict

from fairseq_headprune.compress.stages.common import engine_model
from fairseq_headprune.core import flops
from fairseq_headprune.core.shape import ModelShape
from fairseq_headprune.engines.timing import load_average, paired_speedup, speedup_interval, timed_rounds
from fairseq_headprune.engines.ct2 import ct2_shape
from fairseq_headprune.fairseq_io.loading import load_other, load_subset


def identity(options, timing_identity: Dict) -> Dict:
    """What the measure reads besides the models: the cost table's timing batches, the engine."""
    return {"timing": timing_identity, "engine": options.engine, "latency_sentences": options.latency_sentences}


def build(loaded, options, recovered: Dict, exported: Dict, timing, rounds: int) -> Dict:
    """Both models timed in the same rounds: equal work (forced to the unpruned model's mean length), as
    decoded, and one sentence at a time."""
    o = options
    pruned = load_other(loaded, recovered["checkpoint"])
    with tempfile.TemporaryDirectory(prefix="compress-measure-") as tmp:
        models = {"unpruned": engine_model(loaded, o.engine, None, tmp, "unpruned"),
                  "compressed": engine_model(pruned, o.engine, exported, tmp, "compressed")}
        natural = models["unpruned"].run(timing)
        length = max(1, round(statistics.mean(len(h) for h in natural["hypotheses"].values())))
        decoders = {k: m.run for k, m in models.items()}
        forced = timed_rounds(decoders, timing, rounds, length)
        as_decoded = timed_rounds(decoders, timing, rounds, 0)
        singles = single_sentences(loaded, options.timing_subset, options.latency_sentences)
        latency = timed_rounds(decoders, singles, options.runs, length)
        load = load_average()
    src = [int(n) for s in timing for n in s["net_input"]["src_lengths"].tolist()]
    beam, batch = int(loaded.cfg.generation.beam), max(s["id"].numel() for s in timing)
    shape_of = ModelShape.of if options.engine == "fairseq" else ct2_shape
    n = sum(s["id"].numel() for s in timing)
    return {"subset": options.timing_subset, "sentences": n, "runs": rounds, "batches": len(timing),
            "forced_length": length, "largest_batch": batch, "load_average": load,
            "speedup_equal_work": round(paired_speedup(forced["unpruned"], forced["compressed"]), 3),
            "speedup_as_decoded": round(paired_speedup(as_decoded["unpruned"], as_decoded["compressed"]),
                                        3),
            "speedup_equal_work_interval": speedup_interval(forced["unpruned"], forced["compressed"], len(timing)),
            "speedup_as_decoded_interval": speedup_interval(as_decoded["unpruned"], as_decoded["compressed"],
                                                            len(timing)),
            "speedup_equal_work_total": round(sum(forced["unpruned"]) / sum(forced["compressed"]), 3),
            "sentences_per_s": {k: round(n * rounds / sum(v), 1) for k, v in as_decoded.items()},
            "latency_batch1": {"sentences": len(singles), "forced_length": length,
                               "ms": {k: round(1000 * statistics.median(v), 2) for k, v in latency.items()},
                               "speedup": round(paired_speedup(latency["unpruned"],
                                                                      latency["compressed"]), 3),
                               "interval": speedup_interval(latency["unpruned"], latency["compressed"],
                                                            len(singles))},
            "flop_ratio": round(flops.flop_ratio(shape_of(loaded.model), shape_of(pruned.model), src,
                                                 [length + 1] * len(src), beam, batch), 4)}


def single_sentences(loaded, subset: str, n: int):
    """The first n sentences of a subset (by id), one batch each: the latency at batch 1."""
    dataset = load_subset(loaded, subset)
    return [dataset.collater([dataset[i]]) for i in range(min(n, len(dataset)))]

