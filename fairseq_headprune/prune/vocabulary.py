"""Which vocabulary a deployment keeps (`shrink --keep-vocab CORPUS...`): plain functions over fairseq dictionaries
and text files; core.surgery.trim_vocabulary removes the rows, prune.vocab_trim applies, checks and records it.

A trimmed dictionary keeps, in the original order and with the original counts: the special symbols (every symbol
before `dictionary.nspecial`), every token of the given corpora (text already tokenized and split into subwords in
the model's vocabulary, as DATA's *.bpe.* or SentencePiece-encoded files), then the most frequent of the others
(the dictionary's counts, ties in dictionary order) until the dictionary holds `--keep-vocab-floor` symbols. A
corpus belongs to the side its file's last suffix names (train.bpe.de: German; the source side under -s de):
source tokens keep encoder rows, target tokens decoder rows. One dictionary serves both sides when the model shares
its embeddings or a language is both a source and a target of the pairs kept: the union is kept once.

What a task appends to the dictionary files it reads is appended again to the trimmed ones: under
`translation_multi_simple_epoch`, the language tokens (`__de__`) of the language list. The trimmed language list is
the languages of the pairs kept (its --lang-pairs and -s/-t), in the original list's order, written as langs.txt
(its --lang-dict). The files written beside the checkpoint (dict.LANG.txt for every language kept, langs.txt) are
the dictionaries stock fairseq builds the trimmed model's vocabulary from.
"""
from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

from fairseq.data import Dictionary
from fairseq.data.multilingual.multilingual_utils import augment_dictionary
from fairseq.tasks.translation import TranslationTask
from fairseq.tasks.translation_from_pretrained_bart import TranslationFromPretrainedBARTTask
from fairseq.tasks.translation_multi_simple_epoch import TranslationMultiSimpleEpochTask

from fairseq_headprune.errors import UserError
from fairseq_headprune.options import option

LANGUAGE_LIST = "langs.txt"
SPECIALS = 4  # bos, pad, eos, unk: every fairseq dictionary begins with them


@dataclass
class VocabularyOptions:
    """What `shrink --keep-vocab` keeps; field names are the command's options."""

    corpora: Tuple[str, ...] = option((), flag="--keep-vocab", nargs="+", metavar="CORPUS", parse=tuple,
                                      help="keep only the vocabulary a deployment needs: the special symbols, the "
                                           "language tokens of the pairs kept and every token of these tokenized "
                                           "corpora (in the model's subwords; the file's last suffix names its "
                                           "language, e.g. train.bpe.de); the dictionaries are written beside --out")
    floor: Optional[int] = option(None, flag="--keep-vocab-floor", metavar="N",
                                  help="also keep the most frequent other tokens until each kept dictionary "
                                       "holds N symbols (frequencies: the dictionary's counts)")

    def check(self) -> None:
        """The options alone, before anything is read."""
        if self.floor is not None and not self.corpora:
            raise UserError("--keep-vocab-floor is the floor of --keep-vocab: it needs --keep-vocab CORPUS")
        if self.floor is not None and self.floor < SPECIALS:
            raise UserError(f"--keep-vocab-floor {self.floor} is below the {SPECIALS} special symbols every "
                            "dictionary keeps")


# --------------------------------------------------------------------------------------------- corpora


@dataclass(frozen=True)
class Corpus:
    """A tokenized corpus as read: its language (the file's last suffix), hash, size and token types."""

    path: str
    language: str
    sha256: str
    lines: int
    tokens: int
    types: FrozenSet[str] = field(repr=False)


def read_corpus(path: str) -> Corpus:
    """The corpus's token types (fairseq's whitespace split); missing, empty or not UTF-8: one line. A file is read
    once per process while it stays as it was (the same file, size and modification time): compress checks it
    before the first stage, plans with it, holds its digest in the export's identity and trims to it."""
    if not os.path.isfile(path):
        raise UserError(f"--keep-vocab {path}: no such file")
    stat = os.stat(path)
    return _read_once(path, os.path.abspath(path), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _read_once(path: str, *_state) -> Corpus:
    """corpus_of_file, remembered by the file's state (a refusal is not remembered: it raises)."""
    return corpus_of_file(path)


def corpus_of_file(path: str) -> Corpus:
    """The corpus read from its file, every line (read_corpus remembers it)."""
    digest, types, lines, tokens = hashlib.sha256(), set(), 0, 0
    with open(path, "rb") as f:
        for raw in f:
            digest.update(raw)
            lines += 1
            try:
                words = raw.decode("utf-8").split()
            except UnicodeDecodeError as e:
                raise UserError(f"--keep-vocab {path}: line {lines} is not UTF-8 text ({e.reason})") from None
            tokens += len(words)
            types.update(words)
    if not tokens:
        raise UserError(f"--keep-vocab {path}: the file is empty (no tokens)")
    language = os.path.splitext(path)[1].lstrip(".")
    return Corpus(os.path.abspath(path), language, digest.hexdigest(), lines, tokens, frozenset(types))


def read_corpora(options: VocabularyOptions) -> List[Corpus]:
    """Every corpus read and checked, in the order given (the options checked first)."""
    options.check()
    return [read_corpus(path) for path in options.corpora]


# --------------------------------------------------------------------------------------------- the task's layout


@dataclass(frozen=True)
class TaskVocabulary:
    """How a task builds its dictionaries: the languages whose dictionary files serve the encoder and the decoder
    (of the pairs kept), and under the multilingual task the language list and what it appends to every file."""

    source_langs: Tuple[str, ...]
    target_langs: Tuple[str, ...]
    languages: Tuple[str, ...] = ()  # the original language list (multilingual task); () for translation
    kept_languages: Tuple[str, ...] = ()
    augment: Optional[dict] = None  # augment_dictionary's style arguments (multilingual task)

    def appended(self, dictionary: Dictionary, languages: Sequence[str]) -> None:
        """Append what the task appends to a dictionary file it reads, for this language list (in place)."""
        if self.augment is not None:
            augment_dictionary(dictionary=dictionary, language_list=list(languages), **self.augment)

    def appended_symbols(self) -> List[str]:
        """What the task appended to the loaded dictionaries (the full language list's tokens)."""
        probe = Dictionary()
        start = len(probe)
        self.appended(probe, self.languages)
        return probe.symbols[start:]

    def one_dictionary(self, shared: bool) -> bool:
        """Whether one trimmed dictionary serves both sides (shared embeddings, or a language on both sides)."""
        return shared or bool(set(self.source_langs) & set(self.target_langs))


def task_vocabulary(task) -> TaskVocabulary:
    """The loaded task's layout; a task whose dictionaries cannot be rewritten here is one line."""
    if isinstance(task, TranslationFromPretrainedBARTTask):
        raise UserError("--keep-vocab: translation_from_pretrained_bart (mBART) appends its language tokens to one "
                        "dict.txt for every language; only translation and translation_multi_simple_epoch "
                        "vocabularies can be trimmed here")
    if isinstance(task, TranslationMultiSimpleEpochTask):
        args = task.args
        pairs = [p.split("-") for p in args.lang_pairs] + [[args.source_lang, args.target_lang]]
        source, target = {p[0] for p in pairs}, {p[1] for p in pairs}
        languages = tuple(task.data_manager.langs)
        augment = {"lang_tok_style": args.lang_tok_style, "langtoks_specs": list(args.langtoks_specs),
                   "extra_data": args.extra_data}
        kept = tuple(lang for lang in languages if lang in source | target)
        return TaskVocabulary(tuple(sorted(source)), tuple(sorted(target)), languages, kept, augment)
    if isinstance(task, TranslationTask):
        return TaskVocabulary((task.cfg.source_lang,), (task.cfg.target_lang,))
    raise UserError(f"--keep-vocab: the task {type(task).__name__} is not translation or "
                    "translation_multi_simple_epoch: its dictionaries cannot be rewritten here")


# --------------------------------------------------------------------------------------------- the choice


def file_ids(dictionary: Dictionary, appended: Sequence[str]) -> List[int]:
    """The ids of the symbols the dictionary file holds: after the special symbols, not appended by the task."""
    skip = set(appended)
    return [i for i in range(dictionary.nspecial, len(dictionary)) if dictionary.symbols[i] not in skip]


def chosen_file_ids(dictionary: Dictionary, candidates: Sequence[int], wanted: FrozenSet[str],
                    floor: Optional[int], fixed: int) -> Tuple[List[int], int]:
    """The file ids kept, in dictionary order: the wanted symbols', then the most frequent others until `fixed`
    (the special and appended symbols) plus them reach `floor`; and how many the floor added."""
    kept = {i for i in candidates if dictionary.symbols[i] in wanted}
    from_corpora = len(kept)
    if floor is not None:
        for i in sorted(candidates, key=lambda i: (-dictionary.count[i], i)):
            if fixed + len(kept) >= floor:
                break
            kept.add(i)
    return sorted(kept), len(kept) - from_corpora


def kept_dictionary(dictionary: Dictionary, kept_ids: Sequence[int], layout: TaskVocabulary) -> Tuple[
        Dictionary, List[int]]:
    """The trimmed dictionary as the task builds it from the written file (the special symbols, the kept file
    symbols, then what the task appends for the kept languages), and the old id of each of its ids."""
    new = copy.copy(dictionary)
    new.symbols = list(dictionary.symbols[:dictionary.nspecial])
    new.count = list(dictionary.count[:dictionary.nspecial])
    new.indices = {s: i for i, s in enumerate(new.symbols)}
    old_ids = list(range(dictionary.nspecial))
    for i in kept_ids:  # overwrite: a symbol the file lists twice (#fairseq:overwrite) stays listed twice
        new.add_symbol(dictionary.symbols[i], n=dictionary.count[i], overwrite=True)
        old_ids.append(i)
    start = len(new)
    layout.appended(new, layout.kept_languages)
    old_ids += [dictionary.indices[s] for s in new.symbols[start:]]
    return new, old_ids


def dictionary_text(dictionary: Dictionary, file_symbols: int) -> str:
    """The dict.LANG.txt of a trimmed dictionary: its file symbols with their counts, as fairseq writes them."""
    seen = set(dictionary.symbols[:dictionary.nspecial])
    lines = []
    for i in range(dictionary.nspecial, dictionary.nspecial + file_symbols):
        symbol = dictionary.symbols[i]
        lines.append(f"{symbol} {dictionary.count[i]}" + (" #fairseq:overwrite" if symbol in seen else ""))
        seen.add(symbol)
    return "".join(line + "\n" for line in lines)


# --------------------------------------------------------------------------------------------- the plan


@dataclass
class Side:
    """One side's trimmed dictionary: the old id of each new id, and what it holds."""

    dictionary: Dictionary
    old_ids: List[int]
    text: str  # its dict.LANG.txt
    summary: Dict


@dataclass
class VocabularyPlan:
    """What to keep on each side and the files that say it (file name in the model's folder -> text)."""

    source: Side
    target: Side
    files: Dict[str, str]
    one_dictionary: bool
    shared_embeddings: bool
    layout: TaskVocabulary
    corpora: List[Corpus]
    floor: Optional[int]


def plan_side(dictionary: Dictionary, layout: TaskVocabulary, wanted: FrozenSet[str],
              floor: Optional[int]) -> Side:
    """One side: the file ids chosen, the dictionary built from them, its text and summary."""
    candidates = file_ids(dictionary, layout.appended_symbols())
    probe, _ = kept_dictionary(dictionary, [], layout)  # the special and appended symbols alone
    if floor is not None and floor > len(dictionary):
        raise UserError(f"--keep-vocab-floor {floor}: the dictionary holds only {len(dictionary)} symbols")
    if floor is not None and floor < len(probe):
        raise UserError(f"--keep-vocab-floor {floor} is below the {len(probe)} special and language symbols the "
                        "dictionary keeps in any case")
    kept, by_floor = chosen_file_ids(dictionary, candidates, wanted, floor, len(probe))
    new, old_ids = kept_dictionary(dictionary, kept, layout)
    unknown = len(wanted - set(dictionary.symbols))
    summary = {"before": len(dictionary), "after": len(new), "specials": dictionary.nspecial,
               "from_corpora": len(kept) - by_floor, "from_floor": by_floor,
               "appended": new.symbols[dictionary.nspecial + len(kept):], "corpus_types_not_in_dictionary": unknown}
    return Side(new, old_ids, dictionary_text(new, len(kept)), summary)


def side_texts(layout: TaskVocabulary, source: Side, target: Side) -> Dict[str, str]:
    """The files beside the checkpoint: dict.LANG.txt of every language kept (its side's text), and langs.txt
    (the kept language list) under the multilingual task."""
    files = {f"dict.{lang}.txt": target.text for lang in layout.target_langs}
    files.update({f"dict.{lang}.txt": source.text for lang in layout.source_langs})
    if layout.augment is not None:
        files[LANGUAGE_LIST] = "".join(lang + "\n" for lang in layout.kept_languages)
    return files


def plan_vocabulary(task, corpora: Sequence[Corpus], floor: Optional[int], shared: bool) -> VocabularyPlan:
    """The trimmed vocabulary of a loaded task's model (`shared`: its stacks share one embedding table); a corpus
    whose suffix names no language of the pairs kept, or one file for two different dictionaries, is one line."""
    layout = task_vocabulary(task)
    source_dict, target_dict = task.source_dictionary, task.target_dictionary
    one = layout.one_dictionary(shared)
    if one and source_dict.symbols != target_dict.symbols:
        raise UserError("--keep-vocab: one dictionary must serve both sides (shared embeddings or a language on "
                        "both sides of the pairs), but the source and target dictionaries differ")
    wanted = {"source": set(), "target": set()}
    for corpus in corpora:
        sides = [side for side, langs in (("source", layout.source_langs), ("target", layout.target_langs))
                 if corpus.language in langs]
        if not sides:
            raise UserError(f"--keep-vocab {corpus.path}: its suffix .{corpus.language} names no language of the "
                            f"pairs kept (source {', '.join(layout.source_langs)}; target "
                            f"{', '.join(layout.target_langs)}): name each corpus as DATA's files, e.g. train.bpe.de")
        for side in sides:
            wanted[side].update(corpus.types)
    if one:
        source = target = plan_side(source_dict, layout, frozenset(wanted["source"] | wanted["target"]), floor)
    else:
        source = plan_side(source_dict, layout, frozenset(wanted["source"]), floor)
        target = plan_side(target_dict, layout, frozenset(wanted["target"]), floor)
    return VocabularyPlan(source, target, side_texts(layout, source, target), one, shared, layout, list(corpora),
                          floor)


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def plan_record(plan: VocabularyPlan) -> Dict:
    """What was kept and from what (JSON-ready): sizes before and after, the corpora's hashes, the files' hashes,
    and the old id of every new id (`kept_ids`: new id i is old id kept_ids[side][i])."""
    corpora = [{"path": c.path, "sha256": c.sha256, "language": c.language, "lines": c.lines, "tokens": c.tokens,
                "types": len(c.types)} for c in plan.corpora]
    return {"corpora": corpora, "floor": plan.floor, "one_dictionary": plan.one_dictionary,
            "shared_embeddings": plan.shared_embeddings,
            "languages": list(plan.layout.kept_languages) or None,
            "source": plan.source.summary, "target": plan.target.summary,
            "files": {name: text_sha256(text) for name, text in sorted(plan.files.items())},
            "kept_ids": {"source": plan.source.old_ids, "target": plan.target.old_ids}}


def file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def refuse_foreign_dictionaries(out: str, record_path: str) -> None:
    """The folder of --out receives dict.LANG.txt and langs.txt: refused in one line when it already holds one that
    no earlier trim of the same --out wrote (DATA's own, or another model's), before anything loads."""
    folder = os.path.dirname(os.path.abspath(out))
    written: Dict[str, str] = {}
    if os.path.isfile(record_path):
        try:
            with open(record_path, encoding="utf-8") as f:
                written = (json.load(f).get("vocabulary") or {}).get("files") or {}
        except (OSError, ValueError, AttributeError):
            written = {}
    for name in sorted(os.listdir(folder)):
        is_dictionary = name == LANGUAGE_LIST or (name.startswith("dict.") and name.endswith(".txt"))
        path = os.path.join(folder, name)
        if is_dictionary and os.path.isfile(path) and written.get(name) != file_sha256(path):
            raise UserError(f"--out {out}: its folder holds {name}, which no earlier --keep-vocab run for this --out "
                            "wrote (DATA's dictionaries, or another model's): write the trimmed model to a folder "
                            "of its own")
