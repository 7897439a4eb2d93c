"""The held-out split of valid that --max-bleu-loss and --max-chrf-loss choose on (the choice makes it, the report
decodes it again after recovery), and a checkpoint's translations and score on it in the engine."""
from __future__ import annotations

import copy
import os
import shutil
from typing import Dict, List, Tuple

import sacrebleu

from fairseq_headprune.compress.stages.common import HELDOUT
from fairseq_headprune.decoding.evaluate import SubsetEvaluator
from fairseq_headprune.engines.engine_model import EngineModel
from fairseq_headprune.errors import UserError
from fairseq_headprune.fairseq_io.loading import load


def split_valid(loaded, out: str, heldout: int) -> Tuple[str, Dict]:
    """A data folder beside the user's: every file linked, except valid, whose binarised sentences are split by id:
    the first `heldout` (at most half) become the subset HELDOUT, the rest the subset valid. Returns the folder and
    the split (id ranges, half-open)."""
    import glob

    from fairseq.data import data_utils, indexed_dataset

    source = loaded.cfg.task.data.split(os.pathsep)[0]
    prefixes = sorted({p[:-4] for p in glob.glob(os.path.join(source, "valid.*.bin"))})
    if not prefixes:
        raise UserError(f"--max-bleu-loss splits valid, and {source} has no binarised valid subset")
    staged = out + ".partial"
    shutil.rmtree(staged, ignore_errors=True)
    os.makedirs(staged)
    for path in glob.glob(os.path.join(source, "*")):  # (a user's own HELDOUT files would be written through)
        if os.path.isfile(path) and not os.path.basename(path).startswith(("valid.", HELDOUT + ".")):
            os.symlink(os.path.abspath(path), os.path.join(staged, os.path.basename(path)))
    vocab = max(len(loaded.task.source_dictionary), len(loaded.task.target_dictionary))
    sizes = set()
    split = {}
    for prefix in prefixes:
        dataset = data_utils.load_indexed_dataset(prefix, None)
        n = len(dataset)
        sizes.add(n)
        cut = min(heldout, n // 2)
        if cut < 1:
            raise UserError(f"--max-bleu-loss: valid has {n} sentence(s), too few to hold any out")
        split = {"heldout": [0, cut], "valid": [cut, n]}
        rest = os.path.basename(prefix)[len("valid"):]
        for name, (a, b) in (("heldout", (0, cut)), ("valid", (cut, n))):
            target = os.path.join(staged, name + rest)
            builder = indexed_dataset.make_builder(target + ".bin", impl="mmap", vocab_size=vocab)
            for i in range(a, b):
                builder.add_item(dataset[i])
            builder.finalize(target + ".idx")
    if len(sizes) != 1:
        raise UserError(f"valid's files in {source} hold different numbers of sentences ({sorted(sizes)})")
    shutil.rmtree(out, ignore_errors=True)
    os.rename(staged, out)
    return out, split


def heldout_score(loaded, engine: str, data: str, checkpoint: str, folder: str, metric: str = "BLEU") -> float:
    """BLEU (or chrF: `metric`) of a checkpoint on the held-out split, decoded in the engine (references: the
    binarised targets)."""
    texts, references = heldout_texts(loaded, engine, data, checkpoint, folder)
    if metric == "chrF":
        return round(float(sacrebleu.corpus_chrf(texts, [references]).score), 2)
    return round(float(sacrebleu.corpus_bleu(texts, [references]).score), 2)


def heldout_texts(loaded, engine: str, data: str, checkpoint: str, folder: str) -> Tuple[List[str], List[str]]:
    """A checkpoint's translations of the held-out split, decoded in the engine, and their references (the
    binarised targets, as text)."""
    import torch

    cfg = copy.deepcopy(loaded.cfg)
    cfg.task.data, cfg.common_eval.path = data, checkpoint
    model = load(cfg)
    evaluator = SubsetEvaluator(model, HELDOUT)
    os.makedirs(folder, exist_ok=True)
    hyps = EngineModel(model, engine, folder=os.path.join(folder, "model")).run(
        evaluator.samples)["hypotheses"]
    texts = [evaluator.hypothesis_text({"tokens": torch.tensor(hyps[i], dtype=torch.long)})
             for i in range(evaluator.size)]
    shutil.rmtree(os.path.join(folder, "model"), ignore_errors=True)
    return texts, list(evaluator.references)
