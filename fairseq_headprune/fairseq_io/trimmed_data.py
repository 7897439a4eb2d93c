"""A checkpoint whose vocabulary `shrink --keep-vocab` trimmed, read with DATA as binarised for the untrimmed model:
the task's dictionaries become the trimmed model's (rebuilt from DATA's by the trim's kept ids, as the files written
beside the checkpoint hold them) and its datasets read DATA's ids mapped to the trimmed ones, a token the trim
dropped read as <unk>, as the trimmed dictionaries would have binarised it. The special symbols keep their ids."""
from __future__ import annotations

import copy
from typing import Dict, Optional, Sequence

import torch
from fairseq.data import BaseWrapperDataset

from fairseq_headprune.errors import UserError

SIDES = (("source", "src_dict"), ("target", "tgt_dict"))


def checkpoint_trim(path: str) -> Optional[Dict]:
    """The trim's record in a checkpoint's config (None for an untrimmed model or an unreadable file)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception:  # noqa: BLE001 - the loader reports an unreadable checkpoint itself
        return None
    return (state.get("cfg") or {}).get("vocabulary_trim") or getattr(state.get("args"), "vocabulary_trim", None)


def holds_untrimmed(task, trim: Dict) -> bool:
    """The task's dictionaries are the ones the trim started from (their sizes before it; after it they differ)."""
    dictionaries = (task.source_dictionary, task.target_dictionary)
    return all(len(d) == trim[side]["before"] != trim[side]["after"] for (side, _), d in zip(SIDES, dictionaries))


def dictionary_of(dictionary, old_ids: Sequence[int]):
    """The dictionary holding the symbols of `old_ids`, in that order, with their counts."""
    new = copy.deepcopy(dictionary)
    new.symbols = [dictionary.symbols[i] for i in old_ids]
    new.count = [dictionary.count[i] for i in old_ids]
    new.indices = {symbol: i for i, symbol in enumerate(new.symbols)}
    return new


def id_lookup(old_size: int, old_ids: Sequence[int], unk: int) -> torch.Tensor:
    """old id -> new id, a dropped token -> <unk>."""
    lookup = torch.full((old_size,), unk, dtype=torch.long)
    lookup[torch.as_tensor(list(old_ids), dtype=torch.long)] = torch.arange(len(old_ids))
    return lookup


class MappedTokens(BaseWrapperDataset):
    """A token dataset read through an id lookup (same lengths: one token for one)."""

    def __init__(self, dataset, lookup: torch.Tensor):
        super().__init__(dataset)
        self.lookup = lookup

    def __getitem__(self, index):
        return self.lookup[self.dataset[index].long()]


def read_through_trim(task, trim: Dict, checkpoint: str) -> None:
    """The task set to read DATA (binarised for the untrimmed model) for the trimmed checkpoint: its dictionaries
    the trimmed ones, `trimmed_ids` the lookups its datasets are read through (map_dataset)."""
    if not all(hasattr(task, attr) for _, attr in SIDES):  # the multilingual task: a dictionary per language
        raise UserError(f"{checkpoint}: a multilingual checkpoint whose vocabulary shrink --keep-vocab trimmed reads "
                        "DATA binarised against the dict.*.txt written beside it (its language tokens moved)")
    lookups = {}
    for side, attr in SIDES:
        old = getattr(task, attr)
        ids = trim["kept_ids"][side]
        lookups[side] = id_lookup(len(old), ids, old.unk())
        setattr(task, attr, dictionary_of(old, ids))
    task.trimmed_ids = lookups


def map_dataset(task, dataset) -> None:
    """A language-pair dataset of DATA read through the task's lookups (read_through_trim), once."""
    lookups = getattr(task, "trimmed_ids", None)
    if lookups is None or getattr(dataset, "read_through_trim", False):
        return
    dataset.src = MappedTokens(dataset.src, lookups["source"])
    if dataset.tgt is not None:
        dataset.tgt = MappedTokens(dataset.tgt, lookups["target"])
    dataset.src_dict, dataset.tgt_dict = task.src_dict, task.tgt_dict
    dataset.read_through_trim = True
