"""The export stage: a CTranslate2 model of the recovered one (ct2 engines), float32 parity against fairseq on
--timing-subset, then the engine's compute type; nothing for --engine fairseq."""
from __future__ import annotations

import os
from dataclasses import asdict
from typing import Dict

from fairseq_headprune.compress.stages.contract import Context, Results, Stage
from fairseq_headprune.prune.export import ExportOptions, export
from fairseq_headprune.decoding.evaluate import SubsetEvaluator
from fairseq_headprune.engines.engine_model import QUANTIZATION
from fairseq_headprune.fairseq_io.loading import load_other


def key(options) -> Dict:
    """What the export reads besides the recovered model: the engine, the check, the vocabulary map."""
    key = {"engine": options.engine, "check_sentences": options.check_sentences}
    if options.vocab_map:  # (absent without one: the records of runs before the option still resume)
        key["vocab_map"] = asdict(options.vocab_map_options)
    return key


def identity(context: Context, results: Results) -> Dict:
    return key(context.shipped(results))


def build(folder: str, context: Context, results: Results) -> Dict:
    """The recovered model as a CTranslate2 folder, checked against fairseq (--engine fairseq: none)."""
    loaded, options, recovered = context.loaded, context.shipped(results), results["recover"]
    if options.engine == "fairseq":
        return {"engine": "fairseq", "ct2": None}

    pruned = load_other(loaded, recovered["checkpoint"])
    evaluator = SubsetEvaluator(pruned, options.timing_subset)
    out = os.path.join(folder, "ct2")
    info = export(pruned, evaluator, ExportOptions(out=out, quantization=QUANTIZATION[options.engine],
                                                   check_sentences=options.check_sentences,
                                                   vocab_map=options.vocab_map,
                                                   vocab_map_options=options.vocab_map_options,
                                                   vocab_map_bound=options.vocab_map_bound),
                  options.timing_subset)
    return {"engine": options.engine, "ct2": out, "check": info}


STAGE = Stage("export", identity, build)
