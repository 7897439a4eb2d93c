"""The report stage: --gen-subset and each --also-report set decoded once by both models in the engine (the only
reads of them): BLEU and chrF, each difference with its paired-bootstrap p (BLEU's with its 95% interval too); with
--max-bleu-loss or --max-chrf-loss, the held-out split after recovery, its loss with its interval and the verdict.
No choice reads it."""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Optional

import sacrebleu

from fairseq_headprune.compress.stages.common import also_sets, engine_model, references_sha
from fairseq_headprune.compress.stages.contract import Context, Inputs, Results, Stage
from fairseq_headprune.compress.stages.heldout import heldout_texts
from fairseq_headprune.compress.stages.results import Choice, Reported, shipped_checkpoint
from fairseq_headprune.decoding.evaluate import SubsetEvaluator
from fairseq_headprune.fairseq_io.loading import load_other, load_subset
from fairseq_headprune.records.identity import decoding_identity
from fairseq_headprune.stats import BleuBootstrap, ChrfBootstrap

BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED = 1000, 1


@dataclass(frozen=True)
class ReportInputs(Inputs):
    """What the report reads besides the models: the reported sets and references by content, the decoding."""
    gen_subset: str
    references: str
    also: List
    decoding: Dict


def inputs(context: Context, results: Results) -> ReportInputs:
    loaded, options = context.loaded, context.shipped(results)
    return ReportInputs(options.gen_subset, references_sha(loaded, options),
                        [[s, references_sha(loaded, options, s, r)] for s, r in also_sets(options)],
                        decoding_identity(loaded.cfg))


def build(folder: str, inputs: ReportInputs, context: Context, results: Results) -> Reported:
    """--gen-subset and each --also-report set, decoded once by both models: the only reads of them."""
    loaded, o = context.loaded, context.shipped(results)
    options, ct2, choice = o, results["export"].ct2, results["choice"]
    shipped = shipped_checkpoint(results)
    pruned = load_other(loaded, shipped)
    with tempfile.TemporaryDirectory(prefix="compress-report-") as tmp:
        models = {"unpruned": engine_model(loaded, o.engine, None, tmp, "unpruned"),
                  "compressed": engine_model(pruned, o.engine, ct2, tmp, "compressed", unpruned=loaded)}
        main = scored_pair(loaded, models, folder, o.gen_subset, o.references)
        also = [{**scored_pair(loaded, models, folder, subset, references),
                 "overlap": overlap(loaded, options, subset)} for subset, references in also_sets(options)]
    heldout = heldout_result(loaded, o, choice, shipped, folder) if choice.data else None
    return Reported.of({**main, "heldout": heldout, "also": also, "engine": o.engine,
                        "significance": f"paired bootstrap of sacreBLEU against the unpruned model in {o.engine} "
                                        f"({BOOTSTRAP_SAMPLES} resamples, seed {BOOTSTRAP_SEED}, one-sided)"})


def heldout_result(loaded, options, choice: Choice, checkpoint: str, folder: str) -> Dict:
    """--max-bleu-loss or --max-chrf-loss: the held-out split the choice read, decoded by both models after
    recovery: the loss, its 95% interval (paired bootstrap) and the verdict (quality_verdict)."""
    metric, before = choice.metric, choice.heldout_unpruned
    base, references = heldout_texts(loaded, options.engine, choice.data, loaded.checkpoint,
                                     os.path.join(folder, "heldout-unpruned"))
    texts, _ = heldout_texts(loaded, options.engine, choice.data, checkpoint, os.path.join(folder, "heldout"))
    bootstrap = BleuBootstrap(references, base, BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED)
    scorer = ChrfBootstrap(bootstrap, references) if metric == "chrF" else bootstrap
    after = round(scorer.score(texts) if metric == "chrF" else float(sacrebleu.corpus_bleu(texts, [references]).score),
                  2)
    low, high = scorer.difference_interval(texts)
    loss = round(before - after, 2)
    bound = options.quality_bound()[1]
    return {"metric": metric, "unpruned": before, "compressed": after, "loss": loss,
            "delta_interval": [round(low, 2), round(high, 2)], "verdict": quality_verdict(loss, -low, bound),
            "loss_before_recovery": choice.chosen.heldout_loss, "sentences": choice.split}


def quality_verdict(loss: float, worst: float, bound: float) -> str:
    """A quality bound against a measured loss and the worst end of its 95% interval: "met" when even the worst
    end is within the bound, "inconclusive" when the loss is but the set is too small to tell (its interval
    reaches beyond the bound), "missed" when the loss is beyond it."""
    if loss > bound:
        return "missed"
    return "met" if worst <= bound else "inconclusive"


def overlap(loaded, options, subset: str) -> Dict[str, int]:
    """How many of a reported set's source sentences also occur in each set a choice or training read (identical
    captions happen; a count near the set's size means it was not held out)."""
    def sources(name: str) -> set:
        dataset = load_subset(loaded, name)
        return {tuple(dataset[i]["source"].tolist()) for i in range(len(dataset))}

    mine = load_subset(loaded, subset)  # (the multilingual task's datasets have no .src)
    mine = [tuple(mine[i]["source"].tolist()) for i in range(len(mine))]
    overlap = {}
    for name in dict.fromkeys(("train", "valid", options.calibration_subset)):
        seen = sources(name)
        overlap[name] = sum(sentence in seen for sentence in mine)
    return overlap


def scored_pair(loaded, models: Dict, folder: Optional[str], subset: str, references: Optional[str]) -> Dict:
    """One set decoded by both models ({"unpruned": EngineModel, "compressed": EngineModel}) in their engine: BLEU of
    each, the difference and its paired-bootstrap p; the hypotheses written to folder as NAME.SUBSET.txt."""
    import torch

    evaluator = SubsetEvaluator(loaded, subset, references)
    texts = {}
    for name, model in models.items():
        hyps = model.run(evaluator.samples)["hypotheses"]
        texts[name] = [evaluator.hypothesis_text({"tokens": torch.tensor(hyps[i], dtype=torch.long)})
                       for i in range(evaluator.size)]
        if folder:
            with open(os.path.join(folder, f"{name}.{subset}.txt"), "w", encoding="utf-8") as f:
                f.write("\n".join(texts[name]) + "\n")
    bleu = {k: round(float(evaluator.bleu(v).score), 2) for k, v in texts.items()}
    bootstrap = BleuBootstrap(evaluator.references, texts["unpruned"], BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED)
    p = bootstrap.test(texts["compressed"]).p_value
    low, high = bootstrap.difference_interval(texts["compressed"])
    chrf = ChrfBootstrap(bootstrap, evaluator.references)
    chrf_scores = {k: round(chrf.score(v), 2) for k, v in texts.items()}
    return {"subset": subset, "sentences": evaluator.size, "references": evaluator.reference_source,
            "bleu_unpruned": bleu["unpruned"], "bleu_compressed": bleu["compressed"],
            "bleu_delta": round(bleu["compressed"] - bleu["unpruned"], 2), "p": round(float(p), 4),
            "bleu_delta_interval": [round(low, 2), round(high, 2)],
            "chrf_unpruned": chrf_scores["unpruned"], "chrf_compressed": chrf_scores["compressed"],
            "chrf_delta": round(chrf_scores["compressed"] - chrf_scores["unpruned"], 2),
            "chrf_p": round(float(chrf.test(texts["compressed"]).p_value), 4),
            "signature": evaluator.bleu_signature(), "chrf_signature": chrf.signature()}


STAGE = Stage("report", inputs, build, Reported)
