"""Whether compress's input is itself a pruned model, and where it came from.

A checkpoint this package pruned has the `headprune_transformer` architecture (fairseq_io.pruned_checkpoint). Its
card then says "the input model" with its shape, never "unpruned", and names the model it was made from when a
record beside it says so: compress's OUT/compress.json, shrink's OUT.json, recover's OUT.json (its teacher).
"""
from __future__ import annotations

import os
from typing import Dict, Optional

from fairseq_headprune.core.heads import HeadLayout
from fairseq_headprune.core.shape import depths
from fairseq_headprune.fairseq_io.checkpoint_io import record_path_for
from fairseq_headprune.fairseq_io.pruned_checkpoint import PRUNED_ARCH
from fairseq_headprune.records.log import read_json

UNPRUNED, INPUT = "unpruned", "input"  # what the card calls the model compress started from


def saved_arch(model_cfg) -> Optional[str]:
    """The architecture a checkpoint's model config names (a dict, DictConfig or Namespace)."""
    if hasattr(model_cfg, "get"):
        return model_cfg.get("arch") or model_cfg.get("_name")
    return getattr(model_cfg, "arch", None)


def shape_text(model) -> str:
    """A model's heads per stack and depth: "encoder 6 layers x 8 heads, decoder 3 layers x 2-4 heads"."""
    layout, depth = HeadLayout.of(model), depths(model)
    words = []
    for stack, name, kinds in (("enc", "encoder", ("enc-self",)), ("dec", "decoder", ("dec-self", "enc-dec"))):
        counts = sorted({len(ids) for (kind, _), ids in layout.heads.items() if kind in kinds})
        heads = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        words.append(f"{name} {depth[stack]} layers x {heads} heads")
    return ", ".join(words)


def made_from(checkpoint: str) -> Optional[str]:
    """The model a pruned checkpoint was made from, as the record beside it names it (None when none does;
    compress.json names it by a portable path, often its file name)."""
    compress_record = read_json(os.path.join(os.path.dirname(os.path.abspath(checkpoint)), "compress.json")) or {}
    record = read_json(record_path_for(checkpoint)) or {}
    return compress_record.get("source_checkpoint") or record.get("source_checkpoint") or record.get("teacher")


def describe(checkpoint: str, model_cfg, model) -> Optional[Dict]:
    """None for a model no pruning of this package made; else its shape and the model it was made from."""
    if saved_arch(model_cfg) != PRUNED_ARCH:
        return None
    return {"shape": shape_text(model), "made_from": made_from(checkpoint)}
