"""A model decoding fairseq's batches in one engine, on a given number of threads (1 by default), behind one
run(samples, forced): fairseq's
generator, or CTranslate2 float32 or int8 (the model written by engines.ct2_spec, or a folder exported before)."""
from __future__ import annotations

from typing import Dict, Optional

from fairseq_headprune.engines.ct2 import ct2_decoding, ct2_run, ct2_translator, translate_options, translator
from fairseq_headprune.engines.fairseq_engine import fairseq_run, torch_threads
from fairseq_headprune.errors import UserError

QUANTIZATION = {"ct2-int8": "int8", "ct2-float32": None, "fairseq": None}  # the weights each engine's model holds
COMPUTE_TYPE = {"ct2-int8": "int8", "ct2-float32": "float32"}


class EngineModel:
    """A model (the loaded one, or a cut or pruned one with its target dictionary) decoding fairseq's batches in one
    engine on `threads` threads: run(samples, forced) -> seconds and each sentence's hypothesis (ids of loaded's target
    dictionary, no EOS). In CTranslate2, with a vocabulary map (`vocab_map`, a vmap.txt) when one is given."""

    def __init__(self, loaded, engine: str, model=None, target_dictionary=None, folder: Optional[str] = None,
                 ct2_folder: Optional[str] = None, vocab_map: Optional[str] = None, threads: int = 1):
        self.loaded, self.engine, self.threads = loaded, engine, threads
        self.model = loaded.model if model is None else model
        self.target_dictionary = target_dictionary
        if engine == "fairseq":
            if vocab_map:
                raise UserError("a vocabulary map restricts CTranslate2's output layer: fairseq's engine has none")
            self.translator = None
            return
        self.decoding = ct2_decoding(loaded.cfg.generation)
        if ct2_folder:  # an exported model (compress's own export), with its vocabulary map when it has one
            self.translator = translator(ct2_folder, COMPUTE_TYPE[engine], threads)
            self.decoding = {**self.decoding, **translate_options(ct2_folder)}
        else:  # with `vocab_map`: the model ships it and decodes with it, as an exported folder with a map does
            self.translator = ct2_translator(loaded, self.model, folder, QUANTIZATION[engine], target_dictionary,
                                             vocab_map, threads)
            self.decoding = {**self.decoding, **translate_options(folder)}
        self.model = None  # CTranslate2 decodes its own copy: a slice's torch weights are not held as long as it

    def run(self, samples, forced: int = 0) -> Dict:
        if self.translator is not None:
            return ct2_run(self.translator, self.loaded, self.decoding, samples, forced)

        with torch_threads(self.threads):
            return fairseq_run(self.loaded, self.model, samples, forced, self.target_dictionary)
