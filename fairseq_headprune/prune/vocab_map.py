"""A vocabulary map for CTranslate2 (`vmap.txt`, translated with `use_vmap=True`): the target words each source
word may bring into a batch, so that the output layer scores only the candidates of the batch's source words instead
of the whole target vocabulary. No retraining: the model is unchanged, the search is restricted.

The candidates come from co-occurrence in sentence pairs (the training pairs): the `frequent` most frequent target
tokens, which every batch may use (CTranslate2's line with an empty source), and each source token's `per_source`
target tokens, besides those, that co-occur with it most often (ranked without the frequent ones, which would
otherwise fill every source token's list).
CTranslate2 adds its unknown, start and end tokens itself. The format is CTranslate2's (`vocabulary_map.cc`): one
line per source token, `SOURCE<TAB>TARGET TARGET ...`. CTranslate2 reads any file without complaint (a line without
a tab replaces the always-allowed line, an unknown word becomes <unk>), so a folder's map is checked against its
vocabularies before it is used (check_vmap).

A map is judged on the export's check slice: one that costs more BLEU there than VocabMapBound allows is refused.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Dict, Iterable, List, Sequence, Set, Tuple

import numpy as np
from fairseq.data import indexed_dataset
from scipy import sparse

from fairseq_headprune.errors import UserError
from fairseq_headprune.options import given_flags, non_finite, option
from fairseq_headprune.records.log import atomic_output


def unused_map_options(enabled: bool, flags: Dict) -> None:
    """Refuse, in one line, an option of the vocabulary map given without --vocab-map (it would be ignored)."""
    if flags and not enabled:
        raise UserError(f"{next(iter(flags))} is an option of the vocabulary map: it needs --vocab-map")


@dataclass
class VocabMapOptions:
    """How many target words a map lets in: per source word, and always."""

    vocab_map_per_source: int = option(100, flag="--vocab-map-per-source", metavar="K",
                                       help="target tokens each source token brings in: the K that co-occur with it "
                                            "most often in the training pairs")
    vocab_map_frequent: int = option(500, flag="--vocab-map-frequent", metavar="N",
                                     help="the N most frequent target tokens, candidates of every batch")

    def check(self, enabled: bool) -> None:
        """The sizes; `enabled`: whether --vocab-map was given (without it, a size set is refused)."""
        unused_map_options(enabled, given_flags(VocabMapOptions, self))
        if self.vocab_map_per_source < 1:
            raise UserError(f"--vocab-map-per-source must be at least 1, not {self.vocab_map_per_source}")
        if self.vocab_map_frequent < 0:
            raise UserError(f"--vocab-map-frequent must be at least 0, not {self.vocab_map_frequent}")


@dataclass
class VocabMapBound:
    """How much BLEU a map may cost on the export's check slice before it is refused (nothing written)."""

    vocab_map_max_loss: float = option(1.0, flag="--vocab-map-max-loss", metavar="BLEU",
                                       help="refuse the map, writing nothing, when it costs the check slice more "
                                            "BLEU points than this")
    force_vocab_map: bool = option(False, flag="--force-vocab-map",
                                   help="write the map whatever it costs on the check slice (its cost is still "
                                        "printed)")

    def check(self, enabled: bool) -> None:
        """The bound; `enabled`: whether --vocab-map was given (without it, these options are refused)."""
        unused_map_options(enabled, given_flags(VocabMapBound, self))
        non_finite(self)
        if self.vocab_map_max_loss < 0:
            raise UserError(f"--vocab-map-max-loss must be at least 0 BLEU, not {self.vocab_map_max_loss:g}")

    def judge(self, change: Dict, subset: str) -> None:
        """Refuse in one line a map whose check (`change`: sentences, differing, bleu_without, bleu_with on the
        check slice of `subset`) loses more than the bound, unless forced."""
        loss = round(change["bleu_without"] - change["bleu_with"], 2)
        if loss <= self.vocab_map_max_loss or self.force_vocab_map:
            return
        raise UserError(f"--vocab-map: the map costs {loss:.2f} BLEU on the {change['sentences']} check sentences of "
                        f"'{subset}' ({change['bleu_without']:.2f} -> {change['bleu_with']:.2f}, "
                        f"{change['differing']} hypotheses change), more than --vocab-map-max-loss "
                        f"{self.vocab_map_max_loss:g}: nothing written (--force-vocab-map writes it anyway)")


def incidence(rows: Iterable[Sequence[int]], size: int, binary: bool) -> sparse.csr_matrix:
    """Sentences x vocabulary: how often each token occurs in each sentence (binary: whether it does)."""
    indptr, indices = [0], []
    for row in rows:
        tokens = sorted(set(row)) if binary else list(row)
        indices.extend(tokens)
        indptr.append(len(indices))
    data = np.ones(len(indices), dtype=np.float32)
    matrix = sparse.csr_matrix((data, np.asarray(indices, dtype=np.int64), np.asarray(indptr)),
                               shape=(len(indptr) - 1, size))
    matrix.sum_duplicates()
    return matrix


def cooccurrence(sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], source_size: int,
                 target_size: int) -> sparse.csr_matrix:
    """Source vocabulary x target vocabulary: in how many target tokens of the pairs holding a source token each
    target token occurs (a source token counted once per sentence)."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} source sentences against {len(targets)} targets")
    return (incidence(sources, source_size, binary=True).T @ incidence(targets, target_size, binary=False)).tocsr()


def top_targets(counts: sparse.csr_matrix, k: int, exclude: Sequence[int] = ()) -> Dict[int, List[int]]:
    """Each source token's k most co-occurring target tokens but `exclude` (the tokens every batch has anyway; ties
    broken by the lower id), source tokens with none left out."""
    out, excluded = {}, np.asarray(sorted(set(exclude)), dtype=np.int64)
    for source in range(counts.shape[0]):
        start, end = counts.indptr[source], counts.indptr[source + 1]
        cols, vals = counts.indices[start:end], counts.data[start:end]
        keep = ~np.isin(cols, excluded)
        cols, vals = cols[keep], vals[keep]
        if not len(cols):
            continue
        order = np.lexsort((cols, -vals))[:k]
        out[source] = sorted(int(c) for c in cols[order])
    return out


def most_frequent(targets: Sequence[Sequence[int]], target_size: int, n: int) -> List[int]:
    """The n most frequent target tokens (ties broken by the lower id)."""
    if n == 0:
        return []
    freq = np.bincount(np.fromiter((t for row in targets for t in row), dtype=np.int64), minlength=target_size)
    order = np.lexsort((np.arange(target_size), -freq))
    return sorted(int(t) for t in order[:n] if freq[t] > 0)


def vmap_lines(sources, targets, source_symbols: Sequence[str], target_symbols: Sequence[str],
               options: VocabMapOptions, skip_source: Sequence[int] = ()) -> List[str]:
    """CTranslate2's vocabulary map for these pairs (token ids of the two vocabularies, no EOS): the line of the
    always-allowed tokens first, then one line per source token that occurs (but `skip_source`, e.g. padding)."""
    counts = cooccurrence(sources, targets, len(source_symbols), len(target_symbols))
    always = most_frequent(targets, len(target_symbols), options.vocab_map_frequent)
    lines = ["\t" + " ".join(target_symbols[t] for t in always)]
    skip = set(skip_source)
    for source, candidates in top_targets(counts, options.vocab_map_per_source, exclude=always).items():
        if source not in skip:
            lines.append(source_symbols[source] + "\t" + " ".join(target_symbols[t] for t in candidates))
    return lines


def binarised_pairs(data: str, subset: str, src: str, tgt: str) -> Tuple[List[List[int]], List[List[int]]]:
    """The token ids of a binarised subset's sentence pairs (EOS dropped), every shard (train, train1, ...)."""
    sources, targets, shard = [], [], 0
    while True:
        name = subset + (str(shard) if shard else "")
        prefix = os.path.join(data, f"{name}.{src}-{tgt}.")
        if not os.path.exists(prefix + f"{src}.idx") or not os.path.exists(prefix + f"{tgt}.idx"):
            break
        src_ds = indexed_dataset.make_dataset(prefix + src, impl="mmap")
        tgt_ds = indexed_dataset.make_dataset(prefix + tgt, impl="mmap")
        for i in range(len(src_ds)):
            sources.append(src_ds[i].tolist()[:-1])
            targets.append(tgt_ds[i].tolist()[:-1])
        shard += 1
    if not sources:
        raise UserError(f"a vocabulary map is built from '{subset}' sentence pairs ({subset}.{src}-{tgt}.*.idx), "
                        f"which {data} does not hold")
    return sources, targets


def write_vmap(path: str, lines: Sequence[str]) -> None:
    with atomic_output(path) as f:
        f.write("\n".join(lines) + "\n")


def build_vmap(path: str, pairs: Sequence[Tuple[str, str, str, str]], source_symbols: Sequence[str],
               target_symbols: Sequence[str], skip_source: Sequence[int], options: VocabMapOptions) -> Dict:
    """Write the map of the sentence pairs of every (data, subset, src, tgt) in `pairs` to `path` (symbols: the
    CTranslate2 vocabularies, ids as fairseq's dictionaries); what it holds."""
    options.check(enabled=True)
    sources, targets = [], []
    for data, subset, src, tgt in pairs:
        s, t = binarised_pairs(data, subset, src, tgt)
        sources += s
        targets += t
    lines = vmap_lines(sources, targets, source_symbols, target_symbols, options, skip_source)
    write_vmap(path, lines)
    return {"sentence_pairs": len(sources), "source_tokens": len(lines) - 1,
            "always": options.vocab_map_frequent, "per_source": options.vocab_map_per_source}


# --------------------------------------------------------------------------------------------- a folder's map


def folder_vocabulary(folder: str, side: str) -> List[str]:
    """The `side` (source or target) vocabulary of a CTranslate2 model folder: its own file or the shared one
    (.json since CTranslate2 3.0, one token a line before)."""
    for name in (f"{side}_vocabulary", "shared_vocabulary"):
        path = os.path.join(folder, name + ".json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        path = os.path.join(folder, name + ".txt")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                return f.read().rstrip("\n").split("\n")
    raise UserError(f"{folder} holds no {side} vocabulary ({side}_vocabulary.json or shared_vocabulary.json)")


def map_line_problem(line: str, source: Set[str], target: Set[str]) -> str:
    """What is wrong with one line of a vocabulary map (SOURCE<TAB>TARGET TARGET ...), "" when nothing is."""
    if line.count("\t") != 1:
        return "not SOURCE<TAB>TARGETS (CTranslate2 would read it as the always-allowed line)"
    key, targets = line.split("\t")
    unknown = [t for t in key.split(" ") if t and t not in source]
    if unknown:
        return f"source word {unknown[0]!r} is not in the model's source vocabulary"
    unknown = [t for t in (targets.split(" ") if targets else []) if t not in target]
    if unknown:
        return f"target word {unknown[0]!r} is not in the model's target vocabulary"
    return ""


def check_vmap(folder: str, path: str) -> None:
    """Refuse in one line a vocabulary map that does not fit the folder's model: bytes that are not UTF-8, a line
    without its tab, a word outside the model's vocabularies (CTranslate2 would read it as <unk> silently)."""
    source, target = set(folder_vocabulary(folder, "source")), set(folder_vocabulary(folder, "target"))
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8").rstrip("\n")
            except UnicodeDecodeError:
                raise UserError(f"{path} does not fit this model: line {number} is not UTF-8") from None
            problem = map_line_problem(line, source, target)
            if problem:
                raise UserError(f"{path} does not fit this model: line {number}: {problem}")
