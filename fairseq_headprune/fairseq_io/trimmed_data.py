"""A checkpoint whose vocabulary `shrink --keep-vocab` trimmed, read with DATA as binarised for the untrimmed model:
the task's dictionaries become the trimmed model's (rebuilt from DATA's by the trim's kept ids, as the files written
beside the checkpoint hold them) and its datasets read DATA's ids mapped to the trimmed ones, a token the trim
dropped read as <unk>, as the trimmed dictionaries would have binarised it. The special symbols keep their ids.

Under translation_multi_simple_epoch the files hold no language tokens (the task adds them as it reads, from its
dictionaries): every language's dictionary becomes the trimmed one and each file's ids are mapped as its data
manager reads them, before the language tokens are added, so those come from the trimmed dictionary."""
from __future__ import annotations

import copy
from typing import Dict, Optional, Sequence, Tuple

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


def trimmed_sides(dictionaries: Dict[str, object], trim: Dict) -> Tuple[Dict[str, torch.Tensor], Dict[str, object]]:
    """Per side ("source", "target"): the lookup of DATA's ids to the trim's, and the trimmed dictionary."""
    kept = trim["kept_ids"]
    return ({side: id_lookup(len(d), kept[side], d.unk()) for side, d in dictionaries.items()},
            {side: dictionary_of(d, kept[side]) for side, d in dictionaries.items()})


class MappedTokens(BaseWrapperDataset):
    """A token dataset read through an id lookup (same lengths: one token for one)."""

    def __init__(self, dataset, lookup: torch.Tensor):
        super().__init__(dataset)
        self.lookup = lookup

    def __getitem__(self, index):
        return self.lookup[self.dataset[index].long()]


def read_through_trim(task, trim: Dict, checkpoint: str) -> None:
    """The task set to read DATA (binarised for the untrimmed model) for the trimmed checkpoint: its dictionaries
    the trimmed ones, `trimmed_ids` the lookups its datasets are read through (map_dataset; the multilingual task's
    data manager maps as it reads, read_languages_through_trim)."""
    if hasattr(task, "data_manager"):
        read_languages_through_trim(task, trim, checkpoint)
        return
    lookups, trimmed = trimmed_sides({side: getattr(task, attr) for side, attr in SIDES}, trim)
    for side, attr in SIDES:
        setattr(task, attr, trimmed[side])
    task.trimmed_ids = lookups


def read_languages_through_trim(task, trim: Dict, checkpoint: str) -> None:
    """translation_multi_simple_epoch: every dictionary the data manager holds becomes the trimmed one of its side
    (a source language's, else the target's) and each file it reads, `SPLIT.SRC-TGT.LANG`, is read through LANG's
    side's lookup."""
    manager, sources = task.data_manager, set(task.source_langs) | {"src"}  # "src": --source-dict's entry
    if manager.args.source_dict is not None or manager.args.target_dict is not None:
        raise UserError(f"{checkpoint}: a multilingual checkpoint whose vocabulary shrink --keep-vocab trimmed "
                        "reads DATA through its dict.LANG.txt files; --source-dict and --target-dict are not read "
                        "through a trim")
    lookups, trimmed = trimmed_sides({"source": task.source_dictionary, "target": task.target_dictionary}, trim)
    for lang in list(manager.dicts):
        manager.dicts[lang] = trimmed["source" if lang in sources else "target"]
    read = manager.load_data

    def load_data(path, vdict, impl):
        side = "source" if path.rsplit(".", 1)[-1] in sources else "target"
        dataset = read(path, vdict, impl)
        return None if dataset is None else MappedTokens(dataset, lookups[side])

    manager.load_data = load_data
    task.trimmed_ids = {**lookups, "mapped_as_read": True}


def map_dataset(task, dataset) -> None:
    """A language-pair dataset of DATA read through the task's lookups (read_through_trim), once."""
    lookups = getattr(task, "trimmed_ids", None)
    if lookups is None or lookups.get("mapped_as_read") or getattr(dataset, "read_through_trim", False):
        return
    dataset.src = MappedTokens(dataset.src, lookups["source"])
    if dataset.tgt is not None:
        dataset.tgt = MappedTokens(dataset.tgt, lookups["target"])
    dataset.src_dict, dataset.tgt_dict = task.src_dict, task.tgt_dict
    dataset.read_through_trim = True
