"""`fairseq-headprune translate DIR`: raw sentences in, detokenised translations out, with a deployable folder
(compress.deployable) and CTranslate2.

The source is tokenised and segmented by fairseq's own encoders (`fairseq.data.encoders`: sacremoses, subword-nmt,
SentencePiece) with the options the folder carries, so a line goes through exactly what fairseq-interactive applies;
the language tokens the task adds go before the source and first in the target; the hypothesis loses the symbols
fairseq-generate strips and is decoded back (subword pieces joined, then detokenised) as its D- lines are.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, Iterator, List, Optional

import ctranslate2
from fairseq.data import encoders
from omegaconf import OmegaConf

from fairseq_headprune.prune import deployable
from fairseq_headprune.engines.ct2 import max_length
from fairseq_headprune.errors import UserError
from fairseq_headprune.options import option

COMPUTE_TYPES = ("default", "auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16",
                 "bfloat16", "float32")


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
        self.translator = ctranslate2.Translator(self.folder, device="cpu", compute_type=compute_type,
                                                 inter_threads=1, intra_threads=threads)
        decoding = self.settings["decoding"]
        self.options = {k: decoding[k] for k in ("beam_size", "length_penalty", "min_decoding_length",
                                                 "no_repeat_ngram_size", "max_input_length", "num_hypotheses",
                                                 "use_vmap") if k in decoding}
        if beam is not None:
            self.options["beam_size"] = beam
        self.generation = OmegaConf.create({"max_len_a": decoding["max_len_a"], "max_len_b": decoding["max_len_b"]})
        self.strip = set(self.settings.get("strip") or [])

    def encode(self, line: str) -> List[str]:
        """A raw sentence as the model's source tokens (fairseq-interactive's encode_fn, then the language token)."""
        text = line.strip()
        if self.tokenizer is not None:
            text = self.tokenizer.encode(text)
        if self.bpe is not None:
            text = self.bpe.encode(text)
        return list(self.settings.get("source_prefix") or []) + text.split()

    def decode(self, tokens: Iterable[str]) -> str:
        """A hypothesis as fairseq-generate's D- line: stripped symbols gone, pieces joined, detokenised."""
        text = " ".join(t for t in tokens if t not in self.strip)
        if self.bpe is not None:
            text = self.bpe.decode(text)
        if self.tokenizer is not None:
            text = self.tokenizer.decode(text)
        return text

    def translate(self, lines: List[str]) -> List[str]:
        """One batch of raw sentences; each hypothesis capped as fairseq caps it for the batch (max-len-a/b of the
        padded source width, EOS included)."""
        if not lines:
            return []
        sources = [self.encode(line) for line in lines]
        cap = max_length(self.generation, max(len(s) for s in sources) + 1, self.settings["decoding"]["max_positions"])
        prefix = self.settings.get("target_prefix") or []
        results = self.translator.translate_batch(sources, max_decoding_length=cap, **self.options,
                                                  target_prefix=[list(prefix) for _ in sources] if prefix else None)
        return [self.decode(r.hypotheses[0]) for r in results]

    def stream(self, lines: Iterable[str], batch_size: int) -> Iterator[str]:
        """Translations of `lines` in order, `batch_size` sentences at a time."""
        batch: List[str] = []
        for line in lines:
            batch.append(line.rstrip("\n"))
            if len(batch) == batch_size:
                yield from self.translate(batch)
                batch = []
        yield from self.translate(batch)


def run(options: TranslateOptions, lines: Iterable[str], write) -> int:
    """Translate `lines` (raw sentences) with the folder's model, each translation passed to `write`; the count."""
    options.check()
    translator = RawTranslator(options.folder, options.compute_type, options.beam,
                               int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    count = 0
    for text in translator.stream(lines, options.batch_size):
        write(text)
        count += 1
    return count
