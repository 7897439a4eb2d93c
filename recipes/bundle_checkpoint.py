#!/usr/bin/env python
"""Turn training checkpoints into a small bundled model: the average of their weights, stored in fp16,
without optimizer state. The result loads with stock fairseq-generate and with --task translation_headprune.

usage: recipes/bundle_checkpoint.py OUT.pt CHECKPOINT [CHECKPOINT ...]
"""
import os
import sys

import torch


def average_weights(paths):
    total = None
    for path in paths:
        state = torch.load(path, map_location="cpu", weights_only=False)
        weights = {k: v.double() for k, v in state["model"].items()}
        total = weights if total is None else {k: total[k] + weights[k] for k in total}
    return state, {k: v / len(paths) for k, v in total.items()}


def half_keeping_shared(weights, reference):
    """fp16 copies of the weights; tensors that share storage in `reference` (tied embeddings) stay shared."""
    by_storage, out = {}, {}
    for key, value in weights.items():
        ptr = reference[key].untyped_storage().data_ptr()
        if ptr not in by_storage:
            by_storage[ptr] = value.half() if value.is_floating_point() else value
        out[key] = by_storage[ptr]
    return out


def main(out, *paths):
    if not paths:
        sys.exit("usage: bundle_checkpoint.py OUT.pt CHECKPOINT [CHECKPOINT ...]")
    last, weights = average_weights(paths)
    bundled = {
        "cfg": last["cfg"],
        "model": half_keeping_shared(weights, last["model"]),
        "optimizer_history": [{k: v for k, v in h.items() if k != "optimizer_name"}
                              for h in last["optimizer_history"][-1:]],
        "extra_state": {},
        "last_optimizer_state": None,
        "averaged_from": [os.path.basename(p) for p in paths],
    }
    tmp = out + ".tmp"
    torch.save(bundled, tmp)
    os.replace(tmp, out)
    print(f"wrote {out} ({os.path.getsize(out) / 2**20:.1f} MiB) from {len(paths)} checkpoint(s)")


if __name__ == "__main__":
    main(*sys.argv[1:])
