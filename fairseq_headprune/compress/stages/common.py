"""What several stages read alike: batch and thread settings for a block, the size and content digest of a subset,
the reported sets, a model as the engine runs it, the lever value every shape takes, the vocabulary map the
timings decode with."""
from __future__ import annotations

import contextlib
import os
from typing import Dict, List, Optional, Tuple

from fairseq_headprune.engines.engine_model import EngineModel
from fairseq_headprune.fairseq_io.loading import load_subset
from fairseq_headprune.prune import levers
from fairseq_headprune.prune.export import build_task_vmap
from fairseq_headprune.prune.vocab_trim import plan_for, target_percent
from fairseq_headprune.prune.vocabulary import read_corpora
from fairseq_headprune.records.identity import calibration_files_sha256, file_sha256

HELDOUT = "heldout"  # the choice's split of valid (--max-bleu-loss)


@contextlib.contextmanager
def max_tokens(loaded, value: Optional[int]):
    """Batches of at most `value` tokens while calibrating (the recipe's --max-tokens 1000), restored after."""
    from omegaconf import open_dict

    saved = loaded.cfg.dataset.max_tokens
    with open_dict(loaded.cfg):
        loaded.cfg.dataset.max_tokens = value
    try:
        yield
    finally:
        with open_dict(loaded.cfg):
            loaded.cfg.dataset.max_tokens = saved


def subset_tokens(loaded, subset: str, n: Optional[int] = None) -> Tuple[int, int]:
    """(sentences, target tokens) of the first n sentences of a subset (all when n is None)."""
    dataset = load_subset(loaded, subset)
    count = len(dataset) if n is None else min(n, len(dataset))
    sizes = getattr(dataset, "tgt_sizes", None)
    tokens = int(sizes[:count].sum()) if sizes is not None else count * 20
    return count, tokens


def split_subsets(train_options: Tuple[str, ...]) -> Tuple[str, str, List[str]]:
    """fairseq-train's --train-subset and --valid-subset among the training options given to compress (recover sets
    them itself, from RecoverOptions), and the other options."""
    subsets, rest, given = {"--train-subset": "train", "--valid-subset": "valid"}, [], list(train_options)
    i = 0
    while i < len(given):
        name, _, value = given[i].partition("=")
        if name in subsets:
            if not value:
                i += 1
                value = given[i]
            subsets[name] = value
        else:
            rest.append(given[i])
        i += 1
    return subsets["--train-subset"], subsets["--valid-subset"], rest


def data_sha(loaded, subset: str) -> str:
    return calibration_files_sha256(loaded, subset)


def references_sha(loaded, options, subset: Optional[str] = None, references: Optional[str] = None) -> Optional[str]:
    if subset is None:
        subset, references = options.gen_subset, options.references
    return file_sha256(references) if references else data_sha(loaded, subset)


def also_sets(options) -> List[Tuple[str, Optional[str]]]:
    """(subset, references or None) of each --also-report set."""
    return list(zip(options.also_report, options.also_references or [None] * len(options.also_report)))


def engine_model(loaded, engine: str, ct2: Optional[str], tmp: str, name: str, threads: int = 1,
                 unpruned=None) -> EngineModel:
    """A model as `engine` runs it on `threads` threads: the exported CTranslate2 folder `ct2` when there is one, else
    built under tmp/name. A CTranslate2 folder reads and writes words: it is given the `unpruned` model's batches
    and dictionaries where one is given (a vocabulary trimmed by --keep-vocab reads a dropped word as <unk>
    inside the folder, and writes only words the unpruned dictionary holds)."""
    if ct2:
        return EngineModel(unpruned or loaded, engine, ct2_folder=ct2, threads=threads)
    return EngineModel(loaded, engine, folder=os.path.join(tmp, name), threads=threads)


def trim_point(loaded, options) -> Dict[str, float]:
    """The lever value every shape of the run takes: {"vocab_percent": P} where --keep-vocab trims the output layer
    to P% of the target words (the plan its corpora give), {} otherwise; a corpus or model it cannot trim is one
    line."""
    if not options.vocabulary.corpora:
        return {}
    plan = plan_for(loaded, read_corpora(options.vocabulary), options.vocabulary.floor)
    return {levers.VOCAB: target_percent(plan)}


def timing_vocab_map(loaded, options, folder: str) -> Optional[str]:
    """The map the export ships or the choice weighs (from the training pairs), written in a stage's folder for its
    timing; None where the run has no map."""
    if options.map_state() == "off":
        return None
    os.makedirs(folder, exist_ok=True)
    path, _ = build_task_vmap(loaded, folder, options.vocab_map_options)
    return path
