"""The heads a gated (L0 fine-tuned) checkpoint keeps (`fairseq-headprune gates CHECKPOINT --results-dir DIR`).

Reads the gates from the checkpoint's state dict (no data needed) and writes, in DIR:
  gates.json         log α, evaluation gate and P(open) of every head; λ, updates, kept heads per type and layer
  closed-heads.json  the heads whose evaluation gate is exactly 0, in the {TYPE: {LAYER: [HEADS]}} form that
                     `--mask-heads @FILE` and `fairseq-headprune remove --heads @FILE` read
  kept-heads.md      heads kept per attention type and layer
With --fold-out OUT.pt it also writes a stock checkpoint (no gate parameters, no --gated-types) that computes what
the gated model computes in eval mode: each head's evaluation gate is multiplied into its out_proj columns. Open
gates are not all exactly 1 (a gate is fractional for |log α| < log 11), so masking the closed heads of the
fine-tuned weights alone is not the gated model; the folded checkpoint is, and `remove --heads
@closed-heads.json` on it gives the physically pruned gated model.
"""
from __future__ import annotations

import argparse
import copy
import os
from typing import Dict, List, Mapping, Optional, Tuple

import torch

from fairseq_headprune.errors import UserError
from fairseq_headprune.core.gates import (
    deterministic_gates,
    fold_gates_into_state_dict,
    log_alphas_from_state_dict,
    prob_open,
)
from fairseq_headprune.core.heads import ATTENTION_TYPES, Head
from fairseq_headprune.fairseq_io.loading import trust_fairseq_checkpoints
from fairseq_headprune.records import layout as names
from fairseq_headprune.records.identity import file_sha256
from fairseq_headprune.records.log import atomic_output, write_json_atomic
from fairseq_headprune.studies.ranking import heads_to_json
from fairseq_headprune.fairseq_io.checkpoint_io import save_state, write_checkpoint_pair

def read_checkpoint(path: str) -> dict:
    trust_fairseq_checkpoints()
    if not os.path.isfile(path):
        raise UserError(f"checkpoint not found: {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # not a torch file at all
        raise UserError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}") from None
    if not isinstance(state, dict) or "model" not in state:
        raise UserError(f"{path} is not a fairseq checkpoint")
    return state


def _cfg_get(state: dict, section: str, name: str, default=None):
    cfg = (state.get("cfg") or {}).get(section) or {}
    value = cfg.get(name, default) if hasattr(cfg, "get") else getattr(cfg, name, default)
    return default if value is None else value


def gate_summary(state: dict) -> dict:
    """Everything the gates of a checkpoint say: per-head values, closed heads, kept counts, λ and updates."""
    log_alphas = log_alphas_from_state_dict(state["model"])
    if not log_alphas:
        raise UserError("the checkpoint has no head gates (was it fine-tuned with --gated-types?)")
    temperature = round(next(float(v) for k, v in state["model"].items() if k.endswith(".head_gate.temperature")), 6)
    per_type: Dict[str, Dict[str, List]] = {}
    closed: List[Head] = []
    for (t, layer), la in sorted(log_alphas.items(), key=lambda kv: (ATTENTION_TYPES.index(kv[0][0]), kv[0][1])):
        gate = deterministic_gates(la)
        entry = per_type.setdefault(t, {"log_alpha": [], "gate": [], "p_open": [], "kept": []})
        entry["log_alpha"].append([round(float(x), 4) for x in la])
        entry["gate"].append([round(float(x), 4) for x in gate])
        entry["p_open"].append([round(float(x), 4) for x in prob_open(la, temperature)])
        entry["kept"].append(int((gate > 0).sum()))
        closed += [Head(t, layer, h + 1) for h in (gate == 0).nonzero().flatten().tolist()]
    gates = torch.cat([deterministic_gates(la) for la in log_alphas.values()])
    history = state.get("optimizer_history") or [{}]
    return {
        "l0_lambda": _cfg_get(state, "criterion", "l0_lambda"),
        "updates": history[-1].get("num_updates"),
        "gated_types": [t for t in ATTENTION_TYPES if t in per_type],
        "temperature": temperature,
        "total": int(gates.numel()),
        "kept": int((gates > 0).sum()),
        "closed": len(closed),
        "fractional": int(((gates > 0) & (gates < 1)).sum()),
        "kept_per_type": {t: sum(v["kept"]) for t, v in per_type.items()},
        "heads": per_type,
        "closed_heads": closed,
    }


def kept_table(summary: Mapping) -> str:
    """Markdown: a row per gated type, a column per layer, cells = heads kept (of the layer's heads)."""
    heads = summary["heads"]
    n_layers = max(len(v["kept"]) for v in heads.values())
    lines = ["| type | " + " | ".join(f"layer {i}" for i in range(1, n_layers + 1)) + " | kept |",
             "|---|" + "---|" * (n_layers + 1)]
    for t, v in heads.items():
        cells = [f"{k}/{len(g)}" for k, g in zip(v["kept"], v["gate"])] + ["-"] * (n_layers - len(v["kept"]))
        lines.append(f"| {t} | " + " | ".join(cells) + f" | {sum(v['kept'])}/{sum(len(g) for g in v['gate'])} |")
    return "\n".join(lines)


def fold_checkpoint(state: dict) -> dict:
    """A stock checkpoint (see the module docstring): gates folded into out_proj, gate options cleared."""
    folded = copy.copy(state)
    folded["model"] = fold_gates_into_state_dict(state["model"])
    folded["cfg"] = copy.deepcopy(state["cfg"])
    task = folded["cfg"]["task"]
    if isinstance(task, argparse.Namespace):  # an argparse task's twin (translation_multi_simple_epoch_headprune)
        if getattr(task, "gated_types", ""):
            task.gated_types = ""
    elif "gated_types" in task:
        task["gated_types"] = ""
    folded["last_optimizer_state"] = None
    return folded


def write_results(summary: dict, checkpoint: str, results_dir: str) -> Tuple[str, str, str]:
    closed = summary["closed_heads"]
    meta = {k: v for k, v in summary.items() if k != "closed_heads"}
    meta.update(checkpoint=checkpoint, checkpoint_sha256=file_sha256(checkpoint))
    meta["closed_spec"] = ",".join(map(str, closed))
    paths = tuple(os.path.join(results_dir, name) for name in (names.GATES, names.CLOSED_HEADS, names.KEPT_HEADS))
    write_json_atomic(paths[0], meta)
    write_json_atomic(paths[1], heads_to_json(closed))
    with atomic_output(paths[2]) as f:
        f.write(f"# Heads kept by the L0 gates of {checkpoint}\n\n"
                f"λ = {summary['l0_lambda']}, {summary['updates']} updates, temperature {summary['temperature']}: "
                f"**{summary['kept']} of {summary['total']} gated heads kept** ({summary['closed']} closed; "
                f"{summary['fractional']} open gates are fractional at evaluation).\n\n{kept_table(summary)}\n")
    return paths


def run(checkpoint: str, results_dir: str, fold_out: Optional[str] = None) -> List[str]:
    """gates.json, closed-heads.json, kept-heads.md (and the folded stock checkpoint); returns the files written."""
    state = read_checkpoint(checkpoint)
    summary = gate_summary(state)
    paths = list(write_results(summary, checkpoint, results_dir))
    print(f"{summary['kept']} of {summary['total']} gated heads kept (lambda {summary['l0_lambda']}, "
          f"{summary['updates']} updates); {summary['fractional']} open gates fractional\n{kept_table(summary)}")
    if fold_out:
        folded = fold_checkpoint(state)
        write_checkpoint_pair(fold_out, lambda path: save_state(folded, path), option="--fold-out")
        print(f"{fold_out}: a stock checkpoint, gates folded into out_proj")
        paths.append(fold_out)
    return paths
