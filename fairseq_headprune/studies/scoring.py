"""Michel et al.'s head importance I_h from one forward+backward pass over a subset (`fairseq-headprune score`).

`compute_importance` gives raw per-sentence-accumulated scores; `importance_result` the importance.json document;
`estimate_importance` the normalised scores per head (what rankings use). Weights never get a gradient, and their
`requires_grad` flags are restored afterwards."""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Dict, Mapping, Tuple

import torch

from fairseq_headprune.criterions.head_importance import HeadImportanceCriterion
from fairseq_headprune.core.heads import ATTENTION_TYPES, Head, HeadLayout
from fairseq_headprune.core.importance import normalize_by_layer, to_nested_lists
from fairseq_headprune.fairseq_io.loading import batches
from fairseq_headprune.records import layout as layout_names
from fairseq_headprune.records.identity import file_sha256
from fairseq_headprune.records.log import write_json_atomic
from fairseq_headprune.options import option

DEFINITION = (
    "I_h = mean over sentences x of |dL(x)/dxi_h|, L(x) = summed token NLL of x (teacher forcing, no label "
    "smoothing, eval mode), xi_h = 1 for every head"
)


PER_POSITION_DEFINITION = (
    "I_h = mean over target tokens t of |dl_t/dxi_h|, l_t = the token's NLL (teacher forcing, no label smoothing, "
    "eval mode), xi_h = 1 for every head: the reference code's definition"
)


def compute_importance(loaded, subset: str, progress=None, per_position: bool = False
                       ) -> Tuple[Dict, Dict[str, float]]:
    """Raw I_h per (type, layer) and the subset's statistics; no parameter is updated or given a gradient.
    per_position: |dl_t/dxi_h| per target token, as the reference code (default: per sentence, as the paper)."""
    model = loaded.model
    model.eval()
    with frozen_weights(model):
        return _accumulate(loaded, model, subset, progress, per_position)


@contextlib.contextmanager
def frozen_weights(model):
    """Weights without gradients while the block runs (the gradient flows to the ξ leaves only), as before after."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def _accumulate(loaded, model, subset: str, progress, per_position: bool) -> Tuple[Dict, Dict[str, float]]:
    criterion = HeadImportanceCriterion(loaded.task, sentence_avg=False, per_position=per_position)
    _, samples = batches(loaded, subset)
    nll, tokens = 0.0, 0
    device = next(model.parameters()).device
    for sample in progress(samples) if progress else samples:
        sample = _to(sample, device)
        loss, _, log = criterion(model, sample)
        if not per_position:  # per position, the criterion has taken its own gradient for every target token
            loss.backward()
        criterion.accumulate()
        nll += float(log["loss"])
        tokens += int(log["ntokens"])
    scores = criterion.accumulator.mean()
    stats = {
        "sentences": criterion.accumulator.sentences,
        "batches_skipped_overflow": criterion.accumulator.skipped,
        "target_tokens": tokens,
        "nll_per_token": nll / max(tokens, 1),
    }
    return scores, stats


def _to(sample, device):
    from fairseq import utils

    return utils.move_to_cuda(sample) if device.type == "cuda" else sample


def format_table(scores: Mapping[Tuple[str, int], torch.Tensor], layout: HeadLayout) -> str:
    """One block per attention type: a row per layer, a column per (original) head id."""
    lines = []
    for attn_type in ATTENTION_TYPES:
        layers = layout.layers(attn_type)
        if not layers:
            continue
        ids = sorted({h for layer in layers for h in layout.heads[(attn_type, layer)]})
        lines.append(f"{attn_type:<9}" + "".join(f"{'h' + str(h):>7}" for h in ids))
        for layer in layers:
            held = dict(zip(layout.heads[(attn_type, layer)], scores[(attn_type, layer)].tolist()))
            cells = "".join(f"{held[h]:7.3f}" if h in held else f"{'-':>7}" for h in ids)
            lines.append(f"layer {layer:<3}" + cells)
        lines.append("")
    return "\n".join(lines)


@dataclass
class ScoreOptions:
    """`fairseq-headprune score`: I_h on `subset`, l2-normalised per layer unless normalize is False."""

    subset: str = field(metadata={"flag": "--gen-subset"})
    normalize_by_layer: bool = option(True, flag="--no-normalize-by-layer", negate=True,
                                      help="keep raw scores instead of l2-normalising each layer")
    per_position: bool = option(False, flag="--per-position",
                                help="|dl_t/dxi_h| per target token, as Michel et al.'s code (default: per sentence, "
                                     "as the paper's expectation over examples)")


def task_option(task, name: str):
    """An option of the task as it runs (languages inferred from the data included): dataclass tasks keep their
    config in `cfg`, argparse tasks (translation_multi_simple_epoch) in `args`."""
    return getattr(getattr(task, "cfg", None) or getattr(task, "args", None), name, None)


def importance_result(loaded, options: ScoreOptions, progress=None) -> Tuple[Dict, Dict]:
    """(importance.json document, the scores it holds per (type, layer))."""
    raw, stats = compute_importance(loaded, options.subset, progress, options.per_position)
    scores = normalize_by_layer(raw) if options.normalize_by_layer else raw
    layout = HeadLayout.of(loaded.model)
    result = to_nested_lists(scores)
    result["meta"] = {
        "definition": PER_POSITION_DEFINITION if options.per_position else DEFINITION,
        "normalized_by_layer": options.normalize_by_layer,
        "per_position": options.per_position,
        "unnormalized": to_nested_lists(raw),
        "checkpoint": os.path.abspath(loaded.checkpoint),
        "checkpoint_sha256": file_sha256(loaded.checkpoint),
        "data": os.path.abspath(loaded.cfg.task.data),
        "subset": options.subset,
        "source_lang": task_option(loaded.task, "source_lang"),
        "target_lang": task_option(loaded.task, "target_lang"),
        "head_ids": {t: [list(layout.heads[(t, layer)]) for layer in layout.layers(t)] for t in ATTENTION_TYPES},
        **stats,
    }
    return result, scores


def run(loaded, options: ScoreOptions, results_dir: str, progress=None) -> str:
    """Write DIR/importance.json and print the table; returns the file's path."""
    result, scores = importance_result(loaded, options, progress)
    stats = result["meta"]
    out = os.path.join(results_dir, layout_names.IMPORTANCE)
    write_json_atomic(out, result)
    title = "l2-normalised per layer" if options.normalize_by_layer else "raw"
    print(f"head importance I_h ({title}) on {options.subset}: {stats['sentences']} sentences, "
          f"{stats['target_tokens']} target tokens, NLL {stats['nll_per_token']:.3f}/token")
    print(format_table(scores, HeadLayout.of(loaded.model)))
    return out


def estimate_importance(loaded, subset: str) -> Dict[Head, float]:
    """Normalised I_h per head, computed on `subset` (for rankings that re-estimate)."""
    raw, _ = compute_importance(loaded, subset)
    held = HeadLayout.of(loaded.model).heads
    scores = {}
    for (t, layer), values in normalize_by_layer(raw).items():
        scores.update({Head(t, layer, h): float(v) for h, v in zip(held[(t, layer)], values)})
    return scores
