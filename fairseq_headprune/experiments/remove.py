"""`fairseq-headprune remove`: write a checkpoint whose given heads are physically gone.

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
from fairseq_headprune.heads import HeadLayout, parse_head_spec
from fairseq_headprune.loading import batches, load
from fairseq_headprune.masking import head_gates, set_head_masks
from fairseq_headprune.surgery import prune_model, save_pruned_checkpoint


def add_args(parser) -> None:
    g = parser.add_argument_group("remove")
    g.add_argument("--heads", required=True, help="heads to remove: TYPE:LAYER:HEADS,... or @file.json")
    g.add_argument("--out", required=True, help="the pruned checkpoint to write")


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
    if head_gates(loaded.model):  # surgery slices q/k/v/out_proj, not the gates' per-head parameters
        raise UserError(f"{loaded.checkpoint} has L0 head gates: fold them into a stock checkpoint first "
                        "(fairseq-headprune gates CKPT --results-dir DIR --fold-out stock.pt), "
                        "then remove heads from that")
    layout = HeadLayout.of(loaded.model)
    layout.check(heads)
    if len(heads) >= len(layout.all_heads()):
        raise UserError(f"cannot remove all {len(layout.all_heads())} heads of the model")
    masked = loaded.model
    set_head_masks(masked, heads)
    pruned = prune_model(copy.deepcopy(masked), heads)
    diff = check_equivalent(masked, pruned, sample) if sample is not None else None
    set_head_masks(masked, [])
    save_pruned_checkpoint(pruned, loaded.checkpoint, out)
    params = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    return {"removed": len(heads), "kept": len(HeadLayout.of(pruned).all_heads()), "max_logit_diff": diff,
            "params_before": params(masked), "params_after": params(pruned)}


def run(cfg, args) -> None:
    loaded = load(cfg)
    heads = parse_head_spec(args.heads)
    if not heads:
        raise UserError("--heads names no head")
    _, samples = batches(loaded, cfg.dataset.gen_subset)
    sample = samples[0] if samples else None
    if os.path.abspath(args.out) == os.path.abspath(loaded.checkpoint):
        raise UserError("--out must not overwrite the checkpoint being pruned")
    info = remove_and_save(loaded, heads, args.out, sample)
    print(f"removed {info['removed']} heads ({info['kept']} kept): {info['params_before']:,} -> "
          f"{info['params_after']:,} parameters; max logit difference to the masked model "
          f"{info['max_logit_diff']:.1e}\nwrote {args.out}")
