"""`fairseq-headprune speed --engine ct2`: the speed table in CTranslate2, where translation models are deployed.

The unpruned model, the pruned one and the pruned one zero-padded back to the unpruned head counts (`masked`: the
pruned function at the unpruned cost, as a masked model is in fairseq) are written as CTranslate2 models (engines.ct2)
into a temporary folder and timed with CTranslate2 at each batch size, one thread and all threads, interleaved
runs. Pruned and masked translate alike (their hypotheses are compared in every run), so **pruned over masked is
the equal-work speed-up**; pruned over unpruned is shown beside it. A pruned layer runs at its stack's largest head
count (CTranslate2 has one per stack): the FLOP ratio beside the measurement is that of the shape CTranslate2 runs.
"""
from __future__ import annotations

import copy
import functools
import os
import tempfile
from typing import Dict, List, Sequence

from fairseq_headprune.core import flops
from fairseq_headprune.core.heads import HeadLayout, parse_head_spec
from fairseq_headprune.core.surgery import prune_model
from fairseq_headprune.engines import timing
from fairseq_headprune.engines.ct2 import (check_compute_type, ct2_decoding, ct2_shape, fairseq_cap, target_prefix,
                                           timed_translation, translator, write_ct2_model)
from fairseq_headprune.engines.ct2_spec import stack_heads
from fairseq_headprune.fairseq_io.loading import load_subset
from fairseq_headprune.records import layout as names
from fairseq_headprune.records.identity import file_sha256
from fairseq_headprune.records.log import write_json_atomic
from fairseq_headprune.studies import speed

MODELS = ("unpruned", "masked", "pruned")


def thread_counts() -> List[int]:
    """One thread, and all the cores this process may use (when that is more than one)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return [1] + ([cores] if cores > 1 else [])


def source_tokens(loaded, subset: str, n: int) -> List[List[str]]:
    """The first n sentences of a subset as CTranslate2 source tokens (no EOS: the export makes it append one)."""
    dataset, src_dict = loaded.task.dataset(subset), loaded.task.source_dictionary
    out = []
    for i in range(min(n, len(dataset))):
        ids = dataset[i]["source"].tolist()
        if ids and ids[-1] == src_dict.eos():
            ids = ids[:-1]
        out.append([src_dict[t] for t in ids])
    return out


def batched(items: Sequence, size: int) -> List[Sequence]:
    return [items[k : k + size] for k in range(0, len(items), size)]


def time_translators(translators: Dict, batches, decoding: Dict, cap, runs: int,
                     prefix: Sequence[str] = ()) -> Dict[str, List[Dict]]:
    """Each translator's timed translations of the batches (engines.timing.measure: a warm-up on the first batch,
    then `runs` rounds, translator by translator in each, so that drift in the machine hits all alike)."""
    decoders = {name: functools.partial(timed_translation, t, decoding=decoding, cap=cap, prefix=prefix)
                for name, t in translators.items()}
    return timing.by_decoder(timing.measure(decoders, batches, runs))


def table_row(times: Dict[str, List[Dict]]) -> Dict:
    """speed.table_row, and how many hypotheses of the pruned model differ from the masked one's (at most)."""
    row = speed.table_row(times)
    row["pruned"]["differing_from_masked"] = max(
        sum(a != b for a, b in zip(m["hypotheses"], p["hypotheses"])) for m, p in zip(times["masked"], times["pruned"]))
    return row


def run(loaded, options, results_dir: str) -> str:
    """Measure, write DIR/speed-ct2-COMPUTE_TYPE.json, return its path. The loaded model is left as it was."""
    options.check()
    check_compute_type(options.compute_type)
    decoding = ct2_decoding(loaded.cfg.generation)  # refuses what CTranslate2 cannot decode as fairseq does
    heads = parse_head_spec(options.heads)
    layout = HeadLayout.of(loaded.model)
    layout.check(heads)
    load_subset(loaded, options.subset)
    pruned = prune_model(copy.deepcopy(loaded.model), heads)  # refuses a gated model before any timing
    sources = source_tokens(loaded, options.subset, options.num_sentences)
    cap = fairseq_cap(loaded)
    result = {"engine": "ct2", "compute_type": options.compute_type, "heads_pruned": len(heads),
              "heads_total": len(layout.all_heads()), "subset": options.subset,
              "checkpoint_sha256": file_sha256(loaded.checkpoint), "beam": decoding["beam_size"],
              "runs": options.runs, "num_sentences": len(sources),
              "ct2_heads_per_stack": {"unpruned": list(stack_heads(loaded.model)), "pruned": list(stack_heads(pruned))},
              "equal_work": "pruned vs masked (the pruned model zero-padded to the unpruned head counts): the same "
                            "function, hypotheses compared in every run", "threads": {}}
    with tempfile.TemporaryDirectory(prefix="speed-ct2-") as tmp:
        folders = {"unpruned": write_ct2_model(loaded, loaded.model, os.path.join(tmp, "unpruned"), None),
                   "masked": write_ct2_model(loaded, pruned, os.path.join(tmp, "masked"), None,
                                             pad_to=stack_heads(loaded.model)),
                   "pruned": write_ct2_model(loaded, pruned, os.path.join(tmp, "pruned"), None)}
        lengths = None
        for threads in thread_counts():
            translators = {name: translator(folders[name], options.compute_type, threads) for name in MODELS}
            rows = {}
            for bs in options.batch_size_list():
                times = time_translators(translators, batched(sources, bs), decoding, cap, options.runs,
                                         target_prefix(loaded.task))
                rows[str(bs)] = row = table_row(times)
                lengths = lengths or [len(h) + 1 for h in times["unpruned"][0]["hypotheses"]]  # steps, EOS included
                print(f"{threads} thread(s), batch {bs:>3}: " + ", ".join(
                    f"{n} {r['sentences_per_s']:.1f}±{r['sentences_per_s_std']:.1f} sent/s" for n, r in row.items())
                    + f"; pruned over masked (equal work) x{row['pruned']['speedup_over_masked']:.3f}"
                    + f" ({row['pruned']['differing_from_masked']} hypotheses differ)")
            result["threads"][str(threads)] = {"batch_sizes": rows}
    src_lens = [len(s) + 1 for s in sources]
    result["flop_ratio"] = flops.flop_ratio(ct2_shape(loaded.model), ct2_shape(pruned), src_lens, lengths,
                                            decoding["beam_size"])
    for by_threads in result["threads"].values():
        for row in by_threads["batch_sizes"].values():
            row["pruned"]["speedup_over_masked_vs_flop_ratio"] = row["pruned"]["speedup_over_masked"] / \
                result["flop_ratio"]
    out = os.path.join(results_dir, names.speed_ct2_name(options.compute_type))
    write_json_atomic(out, result)
    print(f"FLOP ratio unpruned/pruned as CTranslate2 runs them (per-stack head counts "
          f"{result['ct2_heads_per_stack']['unpruned']} -> {result['ct2_heads_per_stack']['pruned']}): "
          f"{result['flop_ratio']:.3f}")
    return out
