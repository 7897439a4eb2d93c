"""Decoding in fairseq as fairseq-generate decodes: a subset batched as fairseq-generate batches it, and the
batches decoded once by fairseq's beam search, timed (as decoded, or every hypothesis forced to one length)."""
from __future__ import annotations

import contextlib
import copy
import time
from typing import Dict, List

import numpy as np
import torch

from fairseq_headprune.errors import UserError
from fairseq_headprune.fairseq_io.loading import load_subset


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's intra-op threads set to n for the block, restored after."""
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def check_batches(loaded, subset: str, n: int):
    """The first n sentences of the subset (by id), batched as fairseq-generate batches (--max-tokens,
    --batch-size, sorted by length), without dropping any."""
    from fairseq import utils

    dataset = load_subset(loaded, subset)
    ids = np.arange(min(n, len(dataset)), dtype=np.int64)
    # (source, target) sizes through fairseq's size(): the multilingual task's ConcatDataset has no src_sizes
    sizes = np.array([[int(s or 0) for s in dataset.size(int(i))] for i in ids], dtype=np.int64).reshape(-1, 2)
    ids = ids[np.lexsort((ids, sizes[:, 1], sizes[:, 0]))]  # by source length, then target, as fairseq
    max_positions = utils.resolve_max_positions(loaded.task.max_positions(), loaded.model.max_positions())
    too_long = [int(i) for i in ids if not all(s <= m for s, m in zip(dataset.size(i), max_positions))]
    if too_long:
        raise UserError(f"sentence {too_long[0]} of '{subset}' is too long for the model's positions")
    cfg = loaded.cfg.dataset
    groups = dataset.batch_by_size(ids, max_tokens=cfg.max_tokens, max_sentences=cfg.batch_size,
                                   required_batch_size_multiple=1)
    return [dataset.collater([dataset[int(i)] for i in group]) for group in groups]


@torch.no_grad()
def fairseq_hypotheses(evaluator, samples) -> Dict[int, List[int]]:
    """fairseq-generate's best hypothesis per sentence id, as token ids without the final EOS."""
    task, model = evaluator.loaded.task, evaluator.loaded.model
    eos = task.target_dictionary.eos()
    out = {}
    for sample in samples:
        for sid, nbest in zip(sample["id"].tolist(), task.inference_step(evaluator.generator, [model], sample)):
            tokens = nbest[0]["tokens"].tolist()
            out[sid] = tokens[:-1] if tokens and tokens[-1] == eos else tokens
    return out


def fixed_batches(loaded, subset: str, n: int, batch_size: int):
    """The first n sentences of the subset in batches of exactly batch_size (the last may be smaller)."""
    dataset = loaded.task.dataset(subset)
    ids = list(range(min(n, len(dataset))))
    return [dataset.collater([dataset[i] for i in ids[k : k + batch_size]]) for k in range(0, len(ids), batch_size)]


@torch.no_grad()
def timed_generation(task, generator, model, batches) -> Dict[str, float]:
    """fairseq's beam search over the batches once, timed: seconds, sentences and tokens (EOS counted)."""
    start = time.perf_counter()
    sentences = tokens = 0
    for sample in batches:
        for nbest in task.inference_step(generator, [model], sample):
            sentences += 1
            tokens += len(nbest[0]["tokens"])
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "sentences": sentences, "tokens": tokens}


def fairseq_run(loaded, model, samples, forced: int = 0, target_dictionary=None) -> Dict:
    """fairseq's beam search over the batches once (forced: L tokens, then EOS at step L). A model with a cut target
    vocabulary decodes with its cut dictionary (its ids are then the cut dictionary's)."""
    task = loaded.task
    if target_dictionary is not None:
        task = copy.copy(task)
        task.tgt_dict = target_dictionary
    generation = copy.deepcopy(loaded.cfg.generation)
    if forced:
        generation.min_len, generation.max_len_a, generation.max_len_b = forced, 0, forced
    generator = task.build_generator([model], generation)
    eos = task.target_dictionary.eos()
    out = {}
    with torch.no_grad():
        start = time.perf_counter()
        for sample in samples:
            for sid, nbest in zip(sample["id"].tolist(), task.inference_step(generator, [model], sample)):
                out[sid] = nbest[0]["tokens"].tolist()
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "hypotheses": {s: h[:-1] if h and h[-1] == eos else h for s, h in out.items()}}
