"""`fairseq-headprune speed --engine ct2`: the speed table in CTranslate2, where translation models are deployed.

The unpruned model, the pruned one and the pruned one zero-padded back to the unpruned head counts (`masked`: the
pruned function at the unpruned cost, as a masked model is in fairseq) are exported with compress.export's own functions
into a temporary folder and timed with CTranslate2 at each batch size, one thread and all threads, interleaved
runs. Pruned and masked translate alike (their hypotheses are compared in every run), so **pruned over masked is
the equal-work speed-up**; pruned over unpruned is shown beside it. A pruned layer runs at its stack's largest head
count (CTranslate2 has one per stack): the FLOP ratio beside the measurement is that of the shape CTranslate2 runs.
"""
from __future__ import annotations

import copy
import os
import tempfile
import time
from dataclasses import replace
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_headprune.core import flops
from fairseq_headprune.errors import UserError
from fairseq_headprune.compress.export import (build_spec, ct2_decoding, max_length, stack_heads, target_prefix,
                                                write_model)
from fairseq_headprune.core.heads import HeadLayout, parse_head_spec
from fairseq_headprune.core.shape import ModelShape
from fairseq_headprune.fairseq_io.loading import load_subset
from fairseq_headprune.records import layout as names
from fairseq_headprune.studies import speed
from fairseq_headprune.records.identity import file_sha256
from fairseq_headprune.records.log import write_json_atomic
from fairseq_headprune.core.surgery import prune_model

MODELS = ("unpruned", "masked", "pruned")


def check_compute_type(compute_type: str) -> None:
    """A compute type this machine's CTranslate2 runs on the CPU, or one line saying which it runs."""
    import ctranslate2

    supported = sorted(ctranslate2.get_supported_compute_types("cpu"))
    if compute_type not in supported:
        raise UserError(f"--compute-type {compute_type}: CTranslate2 runs {', '.join(supported)} on this CPU")


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


def export_float32(loaded, model, folder: str, pad_to: Optional[Tuple[int, int]] = None) -> str:
    """A float32 CTranslate2 model of `model` (a translator converts it to the compute type when it loads)."""
    activation = getattr(loaded.saved_cfg.model, "activation_fn", None) or "relu"
    task = loaded.task
    write_model(build_spec(model, task.source_dictionary, task.target_dictionary, activation, pad_to), folder, None)
    return folder


def translator(folder: str, compute_type: str, threads: int):
    import ctranslate2

    return ctranslate2.Translator(folder, device="cpu", compute_type=compute_type, inter_threads=1,
                                  intra_threads=threads)


def timed_translation(translator_, batches, decoding: Dict, cap, prefix: Sequence[str] = ()) -> Dict:
    """Translate the batches once; seconds, sentences, tokens (EOS not counted) and the hypotheses.
    `cap(batch)` is each batch's max_decoding_length (fairseq's max-len-a/b rule, or a forced length); `prefix`
    the tokens fairseq forces first (the multilingual task's target language token)."""
    hypotheses = []
    start = time.perf_counter()
    for batch in batches:
        results = translator_.translate_batch(list(batch), max_decoding_length=cap(batch), **decoding,
                                              target_prefix=[list(prefix) for _ in batch] if prefix else None)
        hypotheses += [tuple(r.hypotheses[0]) for r in results]
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "sentences": len(hypotheses), "tokens": sum(len(h) for h in hypotheses),
            "hypotheses": hypotheses}


def fairseq_cap(loaded):
    """fairseq-generate's per-batch length cap for source token lists (padded width = longest source + EOS)."""
    generation, positions = loaded.cfg.generation, loaded.model.decoder.max_positions()
    return lambda batch: max_length(generation, max(len(s) for s in batch) + 1, positions)


def ct2_shape(model) -> ModelShape:
    """The shape CTranslate2 runs for `model`: every layer at its stack's largest head count (padded)."""
    shape = ModelShape.of(model)
    enc, dec = stack_heads(model)
    return replace(shape, heads={k: enc if k[0] == "enc-self" else dec for k in shape.heads})


def measure(translators: Dict, batches, decoding: Dict, cap, runs: int,
            prefix: Sequence[str] = ()) -> Dict[str, List[Dict]]:
    """Warm each translator up on the first batch, then `runs` interleaved rounds (machine drift hits all alike)."""
    for t in translators.values():
        timed_translation(t, batches[:1], decoding, cap, prefix)
    times: Dict[str, List[Dict]] = {name: [] for name in translators}
    for _ in range(runs):
        for name, t in translators.items():
            times[name].append(timed_translation(t, batches, decoding, cap, prefix))
    return times


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
        folders = {"unpruned": export_float32(loaded, loaded.model, os.path.join(tmp, "unpruned")),
                   "masked": export_float32(loaded, pruned, os.path.join(tmp, "masked"), stack_heads(loaded.model)),
                   "pruned": export_float32(loaded, pruned, os.path.join(tmp, "pruned"))}
        lengths = None
        for threads in thread_counts():
            translators = {name: translator(folders[name], options.compute_type, threads) for name in MODELS}
            rows = {}
            for bs in options.batch_size_list():
                times = measure(translators, batched(sources, bs), decoding, cap, options.runs,
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
