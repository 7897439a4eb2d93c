"""`fairseq-headprune score`: Michel et al.'s head importance from one forward+backward pass over a subset."""
from __future__ import annotations

import os
from typing import Dict, Mapping, Tuple

import torch

from fairseq_headprune.criterions.head_importance import HeadImportanceCriterion
from fairseq_headprune.heads import ATTENTION_TYPES, HeadLayout
from fairseq_headprune.importance import normalize_by_layer, to_nested_lists
from fairseq_headprune.loading import batches, file_sha256, load
from fairseq_headprune.results.log import write_json_atomic

DEFINITION = (
    "I_h = mean over sentences x of |dL(x)/dxi_h|, L(x) = summed token NLL of x (teacher forcing, no label "
    "smoothing, eval mode), xi_h = 1 for every head"
)


def add_args(parser) -> None:
    group = parser.add_argument_group("score")
    group.add_argument("--results-dir", required=True, help="folder for importance.json")
    group.add_argument(
        "--no-normalize-by-layer", action="store_true", help="keep raw scores instead of l2-normalising each layer"
    )


def compute_importance(loaded, subset: str, progress=None) -> Tuple[Dict, Dict[str, float]]:
    """Raw I_h per (type, layer) and the subset's statistics; no parameter is updated or given a gradient."""
    model = loaded.model
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)  # the gradient flows to the ξ leaves only: no weight-gradient work
    criterion = HeadImportanceCriterion(loaded.task, sentence_avg=False)
    _, samples = batches(loaded, subset)
    nll, tokens = 0.0, 0
    device = next(model.parameters()).device
    for sample in progress(samples) if progress else samples:
        sample = _to(sample, device)
        loss, _, log = criterion(model, sample)
        loss.backward()
        criterion.accumulate()
        nll += float(log["loss"])
        tokens += int(log["ntokens"])
    scores = criterion.accumulator.mean()
    stats = {
        "sentences": criterion.accumulator.sentences,
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


def run(cfg, args) -> None:
    from fairseq.logging import progress_bar

    loaded = load(cfg)
    subset = cfg.dataset.gen_subset

    def progress(itr):
        return progress_bar.progress_bar(
            itr,
            log_format=cfg.common.log_format,
            log_interval=cfg.common.log_interval,
            default_log_format="tqdm" if not cfg.common.no_progress_bar else "none",
            prefix=f"score {subset}",
        )

    raw, stats = compute_importance(loaded, subset, progress)
    normalize = not args.no_normalize_by_layer
    scores = normalize_by_layer(raw) if normalize else raw
    layout = HeadLayout.of(loaded.model)
    result = to_nested_lists(scores)
    result["meta"] = {
        "definition": DEFINITION,
        "normalized_by_layer": normalize,
        "unnormalized": to_nested_lists(raw),
        "checkpoint": os.path.abspath(loaded.checkpoint),
        "checkpoint_sha256": file_sha256(loaded.checkpoint),
        "data": os.path.abspath(cfg.task.data),
        "subset": subset,
        "source_lang": loaded.task.cfg.source_lang,
        "target_lang": loaded.task.cfg.target_lang,
        "head_ids": {t: [list(layout.heads[(t, layer)]) for layer in layout.layers(t)] for t in ATTENTION_TYPES},
        **stats,
    }
    out = os.path.join(args.results_dir, "importance.json")
    write_json_atomic(out, result)
    title = "l2-normalised per layer" if normalize else "raw"
    print(f"head importance I_h ({title}) on {subset}: {stats['sentences']} sentences, "
          f"{stats['target_tokens']} target tokens, NLL {stats['nll_per_token']:.3f}/token")
    print(format_table(scores, layout))
    print(f"wrote {out}")
