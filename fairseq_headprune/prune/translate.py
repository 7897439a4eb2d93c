"""`fairseq-headprune translate DIR`: raw sentences in, detokenised translations out, with a deployable folder
(prune.deployable) and CTranslate2.

The source is tokenised and segmented by fairseq's own encoders (`fairseq.data.encoders`: sacremoses, subword-nmt,
fastBPE, SentencePiece) with the options the folder carries, so a line goes through exactly what
fairseq-interactive applies; the language tokens the task adds go before the source and first in the target; the
hypothesis loses the symbols fairseq-generate strips and is decoded back (subword pieces joined, then detokenised)
as its D- lines are.

Every input line gives one output line, in order, read and written batch by batch (the input is never held whole).
A line that cannot be translated as given still gives its line, and a warning naming it: bytes that are not UTF-8
are read as U+FFFD, a source longer than the encoder's positions is truncated to them (EOS included), a line its
tokenizer cannot encode is answered empty. An empty line is answered with an empty line, without the model.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, Iterator, List, NamedTuple, Optional, Tuple

import ctranslate2
from fairseq.data import encoders
from omegaconf import OmegaConf

from fairseq_headprune.prune import deployable
from fairseq_headprune.prune.vocab_map import check_vmap
from fairseq_headprune.engines.ct2 import VMAP_FILE, max_length
from fairseq_headprune.errors import UserError
from fairseq_headprune.options import option

COMPUTE_TYPES = ("default", "auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16",
                 "bfloat16", "float32")
UNTRANSLATED_EXIT = 3  # the exit code when a warning named a line not translated as given
# sentences x (longest source + EOS)^2 one CTranslate2 call may take: its attention holds that many scores per head,
# so a batch with a source at the encoder's 1024 positions is split rather than padded to it whole
ATTENTION_AREA = 1 << 21


@dataclass
class TranslateOptions:
    """What `fairseq-headprune translate` does; every field has the command's default."""

    folder: str = option("", flag="folder", metavar="DIR",
                         help="the deployable model folder (a compress output or its ct2/)")
    beam: Optional[int] = option(None, flag="--beam",
                                 help="beam size (default: the one the model was exported and checked with)")
    batch_size: int = option(32, flag="--batch-size", help="sentences translated together")
    compute_type: str = option("default", flag="--compute-type", choices=COMPUTE_TYPES,
                               help="CTranslate2's compute type (default: the type the model was saved in)")

    def check(self) -> None:
        if self.beam is not None and self.beam < 1:
            raise UserError(f"--beam must be at least 1, not {self.beam}")
        if self.batch_size < 1:
            raise UserError(f"--batch-size must be at least 1, not {self.batch_size}")


class Line(NamedTuple):
    """One input line: its number (from 1), its text, and why it is not translated as given (none: it is)."""

    number: int
    text: str
    notes: Tuple[str, ...] = ()


class Source(NamedTuple):
    """One line ready for the model: its source tokens (none: answered empty without the model) and notes."""

    number: int
    tokens: List[str]
    notes: Tuple[str, ...]


class Translation(NamedTuple):
    """One output line: the input line's number, its translation, and why it was not translated as given."""

    number: int
    text: str
    notes: Tuple[str, ...]


def read_lines(stream: Iterable[bytes]) -> Iterator[Line]:
    """The lines of a byte stream (ended by b"\\n" only; a last line without one counts too), lazily; bytes that
    are not UTF-8 read as U+FFFD, with a note."""
    for number, raw in enumerate(stream, 1):
        raw = raw[:-1] if raw.endswith(b"\n") else raw
        try:
            line = Line(number, raw.decode("utf-8"))
        except UnicodeDecodeError:
            line = Line(number, raw.decode("utf-8", errors="replace"), ("bytes that are not UTF-8, read as U+FFFD",))
        yield line


def batches(items: Iterable, size: int) -> Iterator[list]:
    """`items` in lists of `size` (the last shorter), one list held at a time."""
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def length_groups(widths: List[int], area: int = ATTENTION_AREA) -> List[List[int]]:
    """The indices of `widths` (source lengths with EOS) in groups whose count x widest^2 stays within `area` (a
    single source wider than that alone), each group in input order; one group when the whole batch fits."""
    if len(widths) * max(widths) ** 2 <= area:
        return [list(range(len(widths)))]
    groups: List[List[int]] = []
    for i in sorted(range(len(widths)), key=lambda i: -widths[i]):  # widest first: each group's first is its widest
        if groups and (len(groups[-1]) + 1) * widths[groups[-1][0]] ** 2 <= area:
            groups[-1].append(i)
        else:
            groups.append([i])
    return [sorted(group) for group in groups]


def one_line(text: str) -> str:
    """A translation as one output line (a line break inside would shift every later line)."""
    return text.replace("\r", " ").replace("\n", " ")


def _encoder(kind: str, section: Optional[dict], folder: str):
    """fairseq's tokenizer or subword model of a folder's settings (file names resolved inside the folder)."""
    if not section:
        return None
    values = dict(section)
    if kind == "bpe":
        option_name = deployable.SUBWORD_FILES[values["_name"]][0]
        values[option_name] = os.path.join(folder, values[option_name])
        return encoders.build_bpe(OmegaConf.create(values))
    return encoders.build_tokenizer(OmegaConf.create(values))


def check_folder_map(folder: str, decoding: dict) -> None:
    """The folder's vocabulary map fits its model (prune.vocab_map.check_vmap), and is there when translate.json
    decodes with it; one line when not."""
    path = os.path.join(folder, VMAP_FILE)
    if os.path.exists(path):
        check_vmap(folder, path)
    elif decoding.get("use_vmap"):
        raise UserError(f"{folder} lacks {VMAP_FILE}, the vocabulary map its {deployable.SETTINGS} decodes with")


class RawTranslator:
    """A deployable folder's model with its tokenization: translate(lines) -> detokenised translations."""

    def __init__(self, folder: str, compute_type: str = "default", beam: Optional[int] = None, threads: int = 1):
        self.folder = deployable.model_folder(folder)
        self.settings = deployable.read(self.folder)
        self.tokenizer = _encoder("tokenizer", self.settings.get("tokenizer"), self.folder)
        self.bpe = _encoder("bpe", self.settings.get("bpe"), self.folder)
        supported = {"default", "auto", *ctranslate2.get_supported_compute_types("cpu")}
        if compute_type not in supported:
            raise UserError(f"--compute-type {compute_type}: CTranslate2 runs {', '.join(sorted(supported))} on "
                            "this CPU")
        decoding = self.settings["decoding"]
        check_folder_map(self.folder, decoding)
        self.translator = ctranslate2.Translator(self.folder, device="cpu", compute_type=compute_type,
                                                 inter_threads=1, intra_threads=threads)
        self.options = {k: decoding[k] for k in ("beam_size", "length_penalty", "min_decoding_length",
                                                 "no_repeat_ngram_size", "max_input_length", "num_hypotheses",
                                                 "use_vmap") if k in decoding}
        if beam is not None:
            self.options["beam_size"] = beam
        self.generation = OmegaConf.create({"max_len_a": decoding["max_len_a"], "max_len_b": decoding["max_len_b"]})
        self.strip = set(self.settings.get("strip") or [])
        self.source_positions = deployable.source_positions(self.settings)

    def pieces(self, line: str) -> List[str]:
        """A raw sentence as the model's subword pieces (fairseq-interactive's encode_fn)."""
        text = line.strip()
        if not text:
            return []
        if self.tokenizer is not None:
            text = self.tokenizer.encode(text)
        if self.bpe is not None:
            text = self.bpe.encode(text)
        return text.split()

    def encode(self, line: str) -> List[str]:
        """A raw sentence as the model's source tokens: its pieces after the language token ([] when empty)."""
        pieces = self.pieces(line)
        return list(self.settings.get("source_prefix") or []) + pieces if pieces else []

    def source(self, line: Line) -> Source:
        """A line as the model's source, truncated to the encoder's positions with EOS; a line the tokenizer
        cannot encode is answered empty (noted)."""
        try:
            tokens = self.encode(line.text)
        except Exception as error:  # noqa: BLE001 - a tokenizer's failure on one line must not lose the others
            return Source(line.number, [], line.notes + (f"cannot be encoded ({type(error).__name__}: {error}), "
                                                         "answered with an empty line",))
        keep = self.source_positions - 1  # and EOS, which CTranslate2 appends
        if len(tokens) <= keep:
            return Source(line.number, tokens, line.notes)
        return Source(line.number, tokens[:keep], line.notes + (
            f"{len(tokens)} source tokens, more than the model's {self.source_positions} positions hold with EOS: "
            f"truncated to the first {keep}",))

    def decode(self, tokens: Iterable[str]) -> str:
        """A hypothesis as fairseq-generate's D- line: stripped symbols gone, pieces joined, detokenised."""
        text = " ".join(t for t in tokens if t not in self.strip)
        if self.bpe is not None:
            text = self.bpe.decode(text)
        if self.tokenizer is not None:
            text = self.tokenizer.decode(text)
        return text

    def translate_tokens(self, sources: List[List[str]]) -> List[str]:
        """One batch of source token lists, each hypothesis capped as fairseq caps it for the batch (max-len-a/b of
        the padded source width, EOS included); an empty source is answered "" without the model."""
        todo = [s for s in sources if s]
        if not todo:
            return ["" for _ in sources]
        cap = max_length(self.generation, max(len(s) for s in todo) + 1, self.settings["decoding"]["max_positions"])
        prefix = self.settings.get("target_prefix") or []
        texts = [""] * len(todo)
        for group in length_groups([len(s) + 1 for s in todo]):  # the batch's cap for every group, as fairseq's
            results = self.translator.translate_batch([todo[i] for i in group], max_decoding_length=cap,
                                                      **self.options,
                                                      target_prefix=[list(prefix) for _ in group] if prefix else None)
            for i, result in zip(group, results):
                texts[i] = one_line(self.decode(result.hypotheses[0]))
        answers = iter(texts)
        return [next(answers) if s else "" for s in sources]

    def stream(self, lines: Iterable[Line], batch_size: int) -> Iterator[Translation]:
        """Translations of `lines` in order, `batch_size` lines read and translated at a time."""
        for batch in batches(lines, batch_size):
            sources = [self.source(line) for line in batch]
            for source, text in zip(sources, self.translate_tokens([s.tokens for s in sources])):
                yield Translation(source.number, text, source.notes)


def run(options: TranslateOptions, stream: Iterable[bytes], write, warn) -> Tuple[int, int]:
    """Translate the lines of `stream` (raw sentences, bytes) with the folder's model: each translation passed to
    `write`, each line not translated as given to `warn(number, notes)`. Returns (lines, lines warned about)."""
    options.check()
    translator = RawTranslator(options.folder, options.compute_type, options.beam,
                               int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    count = warned = 0
    for translation in translator.stream(read_lines(stream), options.batch_size):
        write(translation.text)
        if translation.notes:
            warn(translation.number, translation.notes)
            warned += 1
        count += 1
    return count, warned
