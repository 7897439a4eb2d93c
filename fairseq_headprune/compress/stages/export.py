"""The export stage: with --keep-vocab, the recovered model's vocabulary trimmed to its corpora (prune.vocab_trim,
checked against the recovered model, written with its dictionaries); a CTranslate2 model of the model that ships
(ct2 engines), float32 parity against fairseq on --timing-subset, then the engine's compute type; nothing more for
--engine fairseq."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Dict, Optional, Tuple

from fairseq_headprune.compress.stages.contract import Context, Inputs, Results, Stage
from fairseq_headprune.compress.stages.results import Exported
from fairseq_headprune.compress.stages.shrink_recipe import trim_options
from fairseq_headprune.prune.export import ExportOptions, export
from fairseq_headprune.prune.shrink import trim_only
from fairseq_headprune.prune.vocab_map import VocabMapBound, VocabMapOptions
from fairseq_headprune.prune.vocab_trim import companions, describe, hypothesis_changes, plan_for
from fairseq_headprune.prune.vocabulary import read_corpora, read_corpus
from fairseq_headprune.decoding.evaluate import SubsetEvaluator
from fairseq_headprune.engines.engine_model import QUANTIZATION
from fairseq_headprune.fairseq_io.loading import load_other


@dataclass(frozen=True)
class ExportInputs(Inputs):
    """What the export reads besides the recovered model: the engine, the check, the vocabulary map and the bound
    its check is held to, the corpora --keep-vocab keeps the vocabulary of (the last three None without them: the
    records of runs before the options still resume). The check's sentences are the timing's (--timing-subset),
    which the cost table's identity, first in the chain, holds."""
    engine: str
    check_sentences: int
    vocab_map: Optional[Dict] = None
    vocabulary: Optional[Dict] = None
    vocab_map_bound: Optional[Dict] = None

    def map_options(self) -> Dict:
        """ExportOptions' map fields: the map and its bound as given, or none."""
        if self.vocab_map is None:
            return {}
        return {"vocab_map": True, "vocab_map_options": VocabMapOptions(**self.vocab_map),
                "vocab_map_bound": VocabMapBound(**self.vocab_map_bound)}


def key(options) -> ExportInputs:
    """The export's inputs from the options as shipped (the map on where the choice took it)."""
    vocabulary, mapped = options.vocabulary, options.vocab_map
    return ExportInputs(options.engine, options.check_sentences,
                        asdict(options.vocab_map_options) if mapped else None,
                        {"corpora": [read_corpus(path).sha256 for path in vocabulary.corpora],
                         "floor": vocabulary.floor, "check_on": options.calibration_subset}
                        if vocabulary.corpora else None,
                        asdict(options.vocab_map_bound) if mapped else None)


def inputs(context: Context, results: Results) -> ExportInputs:
    return key(context.shipped(results))


def trimmed(folder: str, context: Context, checkpoint: str) -> Tuple[Dict, object]:
    """The recovered model's vocabulary trimmed to --keep-vocab's corpora (shrink's trim, checked on
    --check-sentences of the calibration subset) as folder/trimmed/model.pt, its dictionaries beside it; the
    hypotheses of the first --check-sentences of --timing-subset that changed, and why; and the trimmed model loaded
    on DATA (read through the trim)."""
    options = context.options
    recovered = load_other(context.loaded, checkpoint)
    plan = plan_for(recovered, read_corpora(options.vocabulary), options.vocabulary.floor)
    out = os.path.join(folder, "trimmed", "model.pt")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    vocabulary = trim_only(recovered, trim_options(options), plan, out, log=lambda line: None)["vocabulary"]
    model = load_other(context.loaded, out)
    vocabulary["hypotheses"] = hypothesis_changes(recovered, model, options.timing_subset, options.check_sentences,
                                                  set(plan.source.dictionary.symbols),
                                                  set(plan.target.dictionary.symbols))
    context.log("export: " + describe(vocabulary).replace("\n", "; "))
    return {"checkpoint": out, "dictionaries": sorted(companions(plan, out)), "vocabulary": vocabulary}, model


def build(folder: str, inputs: ExportInputs, context: Context, results: Results) -> Exported:
    """The model that ships (the vocabulary trimmed with --keep-vocab) as a CTranslate2 folder, checked against
    fairseq (--engine fairseq: none)."""
    loaded, options, recovered = context.loaded, context.shipped(results), results["recover"]
    trim: Dict = {}
    if inputs.vocabulary:
        trim, pruned = trimmed(folder, context, recovered.checkpoint)
    if inputs.engine == "fairseq":
        return Exported.of({"engine": "fairseq", "ct2": None, **trim})

    if not trim:
        pruned = load_other(loaded, recovered.checkpoint)
    evaluator = SubsetEvaluator(pruned, options.timing_subset)
    out = os.path.join(folder, "ct2")
    info = export(pruned, evaluator, ExportOptions(out=out, quantization=QUANTIZATION[inputs.engine],
                                                   check_sentences=inputs.check_sentences, **inputs.map_options()),
                  options.timing_subset)
    return Exported.of({"engine": inputs.engine, "ct2": out, "check": info, **trim})


STAGE = Stage("export", inputs, build, Exported)
