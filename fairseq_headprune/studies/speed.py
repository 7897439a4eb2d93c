"""Does removing heads make generation faster? (`fairseq-headprune speed`; Michel et al. Table 4)

Generation throughput of the unpruned model, the masked model (heads zeroed) and the physically pruned model, at
several batch sizes, over several interleaved runs (mean and standard deviation). The masked and the pruned model
compute the same function, so they write identical hypotheses: **pruned over masked is the equal-work speed-up**
(the one the claims use; each batch size records whether the two wrote the same number of tokens). Pruned over
unpruned is shown beside it, but it includes the effect of different (often shorter) translations. Beside the
measurement: the FLOP ratio on the same sentences and lengths (fairseq_headprune.core.flops: what the speed-up would be
if time followed the arithmetic) and the incremental state the decoder keeps.
"""
from __future__ import annotations

import copy
import functools
import os
import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from fairseq_headprune.core import flops
from fairseq_headprune.errors import UserError
from fairseq_headprune.core.heads import HeadLayout, parse_head_spec
from fairseq_headprune.fairseq_io.loading import load_subset
from fairseq_headprune.core.masking import set_head_masks
from fairseq_headprune.records import layout as names
from fairseq_headprune.records.identity import file_sha256
from fairseq_headprune.records.log import write_json_atomic
from fairseq_headprune.core.surgery import prune_model
from fairseq_headprune.engines import timing
from fairseq_headprune.engines.fairseq_engine import fixed_batches, timed_generation
from fairseq_headprune.options import option


@dataclass
class SpeedOptions:
    """What `speed` measures; field names are the command's options."""

    subset: str = field(metadata={"flag": "--gen-subset"})
    heads: str = option("", flag="--heads", help="heads to prune: TYPE:LAYER:HEADS,... or @file.json")
    batch_sizes: str = option("1,4,16,64", flag="--batch-sizes", help="batch sizes timed, comma-separated")
    runs: int = option(3, flag="--runs", help="timed runs of each model and batch size")
    num_sentences: int = option(128, flag="--num-sentences", help="sentences decoded per run and batch size")
    engine: str = option("fairseq", flag="--engine",  # ct2: studies/speed_ct2.py
                         help="fairseq (fairseq's generator) or ct2 (both models exported to CTranslate2, one thread "
                              "and all threads)")
    compute_type: Optional[str] = option(None, flag="--compute-type",  # refused with --engine fairseq
                                         help="with --engine ct2: CTranslate2's compute type (float32, int8, "
                                              "int8_float32, ...; default float32)")

    def batch_size_list(self) -> List[int]:
        try:
            sizes = [int(b) for b in self.batch_sizes.split(",")]
        except ValueError:
            raise UserError(f"--batch-sizes must be numbers, e.g. 1,4,16,64: {self.batch_sizes!r}") from None
        if not sizes or min(sizes) < 1:
            raise UserError(f"--batch-sizes must be at least 1 each: {self.batch_sizes!r}")
        return sizes

    def check(self) -> None:
        self.batch_size_list()
        for flag, value in (("--runs", self.runs), ("--num-sentences", self.num_sentences)):
            if value < 1:
                raise UserError(f"{flag} must be at least 1, not {value}")
        if not parse_head_spec(self.heads):
            raise UserError("--heads names no head")
        if self.engine not in ("fairseq", "ct2"):
            raise UserError(f"--engine must be fairseq or ct2, not {self.engine!r}")
        if self.engine == "fairseq" and self.compute_type is not None:
            raise UserError("--compute-type is CTranslate2's: it needs --engine ct2")
        if self.engine == "ct2" and self.compute_type is None:
            self.compute_type = "float32"


class IncrementalStateMeter:
    """The largest incremental state (bytes) of the decoder during generation, read at its last layer (fairseq
    calls decoder.forward directly, past module hooks, but its layers through __call__)."""

    def __init__(self, decoder):
        self.peak = 0
        self.handle = decoder.layers[-1].register_forward_pre_hook(self._measure, with_kwargs=True)

    def _measure(self, _module, args, kwargs):
        # TransformerDecoderLayer.forward(x, encoder_out, encoder_padding_mask, incremental_state, ...)
        state = kwargs.get("incremental_state", args[3] if len(args) > 3 else None)
        if state:
            size = sum(v.numel() * v.element_size() for buf in state.values() for v in buf.values()
                       if torch.is_tensor(v))
            self.peak = max(self.peak, size)

    def close(self):
        self.handle.remove()


def summarise(runs: List[Dict]) -> Dict:
    """Mean and spread of a model's timed runs."""
    rates = [r["sentences"] / r["seconds"] for r in runs]
    return {"sentences_per_s": statistics.mean(rates), "sentences_per_s_std": statistics.pstdev(rates),
            "tokens_per_s": statistics.mean(r["tokens"] / r["seconds"] for r in runs), "tokens": runs[0]["tokens"]}


def table_row(times: Dict[str, List[Dict]]) -> Dict:
    """One row of a speed table from the interleaved runs of `unpruned`, `masked` and `pruned` (engine-agnostic)."""
    row = {name: summarise(runs) for name, runs in times.items()}
    for name in ("masked", "pruned"):
        # tokens/s: a pruned model may write longer or shorter hypotheses than the unpruned one
        row[name]["speedup"] = row[name]["tokens_per_s"] / row["unpruned"]["tokens_per_s"]
        row[name]["speedup_sentences"] = row[name]["sentences_per_s"] / row["unpruned"]["sentences_per_s"]
    # equal work: same hypotheses, so the ratio of seconds per run is the speed-up (std over paired runs)
    paired = [m["seconds"] / p["seconds"] for m, p in zip(times["masked"], times["pruned"])]
    row["pruned"]["speedup_over_masked"] = statistics.mean(paired)
    row["pruned"]["speedup_over_masked_std"] = statistics.pstdev(paired)
    row["pruned"]["same_tokens_as_masked"] = all(
        m["tokens"] == p["tokens"] for m, p in zip(times["masked"], times["pruned"]))
    return row


def run(loaded, options: SpeedOptions, results_dir: str) -> str:
    """Measure, write DIR/speed.json, return its path. The loaded model is left as it was (copies are pruned)."""
    options.check()
    heads = parse_head_spec(options.heads)
    layout = HeadLayout.of(loaded.model)
    layout.check(heads)
    batch_sizes = options.batch_size_list()
    subset, task, cfg = options.subset, loaded.task, loaded.cfg
    load_subset(loaded, subset)
    pruned = prune_model(copy.deepcopy(loaded.model), heads)  # refuses a gated model before any timing
    masked = copy.deepcopy(loaded.model)
    set_head_masks(masked, heads)
    models = {"unpruned": loaded.model, "masked": masked, "pruned": pruned}
    generators = {name: task.build_generator([m], cfg.generation) for name, m in models.items()}
    decoders = {name: functools.partial(timed_generation, task, generators[name], m) for name, m in models.items()}
    result = {"heads_pruned": len(heads), "heads_total": len(layout.all_heads()), "subset": subset,
              "checkpoint_sha256": file_sha256(loaded.checkpoint),
              "beam": cfg.generation.beam, "threads": torch.get_num_threads(), "runs": options.runs,
              "num_sentences": options.num_sentences, "batch_sizes": {},
              "equal_work": "pruned vs masked: the same function, identical hypotheses (tokens counted per run)"}
    for bs in batch_sizes:
        data = fixed_batches(loaded, subset, options.num_sentences, bs)
        meters = {}
        for name, model in models.items():  # warm-up: kernels meet the shapes once, state sizes measured
            meters[name] = IncrementalStateMeter(model.decoder)
            timing.warm_up({name: decoders[name]}, data)
            meters[name].close()
        # interleaved model by model, so drift in machine load hits all alike
        times = timing.by_decoder(timing.measure(decoders, data, options.runs, warm=False))
        row = table_row(times)
        for name in models:
            row[name]["incremental_state_bytes"] = meters[name].peak
        result["batch_sizes"][str(bs)] = row
        print(f"batch {bs:>3}: " + ", ".join(f"{n} {r['sentences_per_s']:.1f}±{r['sentences_per_s_std']:.1f} sent/s "
                                          f"{r['tokens_per_s']:.0f} tok/s" for n, r in row.items())
              + f"; pruned over masked (equal work) x{row['pruned']['speedup_over_masked']:.3f}")
    sample_batches = fixed_batches(loaded, subset, options.num_sentences, 64)
    src_lens, hyp_lens = _lengths(task, generators["unpruned"], loaded.model, sample_batches)
    beam = cfg.generation.beam
    # on the same sentences and lengths: what the speed-up would be if time followed the arithmetic
    ratio = flops.flop_ratio(loaded.model, pruned, src_lens, hyp_lens, beam)
    result["flop_ratio"] = ratio
    result["reorder_ratio"] = flops.reorder_ratio(loaded.model, pruned, src_lens, hyp_lens, beam)
    for row in result["batch_sizes"].values():
        row["pruned"]["speedup_over_masked_vs_flop_ratio"] = row["pruned"]["speedup_over_masked"] / ratio
    result["params"] = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    out = os.path.join(results_dir, names.SPEED)
    write_json_atomic(out, result)
    print(f"FLOP ratio unpruned/pruned on these sentences: {ratio:.3f}; cache-reorder copy ratio: "
          f"{result['reorder_ratio']:.3f}")
    return out


@torch.no_grad()
def _lengths(task, generator, model, batches):
    src, hyp = [], []
    for sample in batches:
        lens = sample["net_input"]["src_lengths"].tolist()
        for s, nbest in zip(lens, task.inference_step(generator, [model], sample)):
            src.append(s)
            hyp.append(len(nbest[0]["tokens"]))
    return src, hyp
