"""Writing a checkpoint whose given heads are physically gone (`fairseq-headprune remove`).

The result records the heads it keeps, reloads with `fairseq-generate --user-dir fairseq_headprune` and with
every command here, and can be pruned again. Before saving, the pruned model is checked against the masked
model on the subset's first batch (logits to 1e-4), so a checkpoint that would translate differently is never
written.
"""
from __future__ import annotations

import copy
import os

import torch

from fairseq_headprune.errors import UserError
from fairseq_headprune.core.heads import HeadLayout, format_head_spec
from fairseq_headprune.core.masking import head_gates, set_head_masks
from fairseq_headprune.core.surgery import prune_model
from fairseq_headprune.fairseq_io.pruned_checkpoint import save_pruned_checkpoint
from fairseq_headprune.records.identity import file_sha256


@torch.no_grad()
def check_equivalent(masked_model, pruned_model, sample, atol: float = 1e-4) -> float:
    """Largest logit difference between the masked and the pruned model on one batch; raises past atol."""
    a = masked_model(**sample["net_input"])[0]
    b = pruned_model(**sample["net_input"])[0]
    diff = float((a - b).abs().max())
    if not torch.isfinite(b).all() or diff > atol:
        raise UserError(f"the pruned model differs from the masked one (max logit difference {diff:.2e})")
    return diff


def remove_and_save(loaded, heads, out: str, sample=None) -> dict:
    layout = HeadLayout.of(loaded.model)
    layout.check(heads)
    if len(heads) >= len(layout.all_heads()):
        raise UserError(f"cannot remove all {len(layout.all_heads())} heads of the model")
    masked = loaded.model
    if head_gates(masked):
        prune_model(masked, heads)  # refuses with the one line that says what to do
    set_head_masks(masked, heads)
    try:
        pruned = prune_model(copy.deepcopy(masked), heads)
        diff = check_equivalent(masked, pruned, sample) if sample is not None else None
    finally:
        set_head_masks(masked, [])
    params = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    info = {"removed": len(heads), "kept": len(HeadLayout.of(pruned).all_heads()), "max_logit_diff": diff,
            "params_before": params(masked), "params_after": params(pruned)}
    record = {"command": "remove", "source_checkpoint": os.path.abspath(loaded.checkpoint),
              "source_sha256": file_sha256(loaded.checkpoint), "heads_removed": format_head_spec(heads), **info}
    save_pruned_checkpoint(pruned, loaded.checkpoint, out, record)
    return info
