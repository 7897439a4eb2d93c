"""A pruned model written as a fairseq checkpoint that fairseq's own loaders rebuild.

The checkpoint is its source's, with the pruned model's weights and a model config that rebuilds its shape
(core.shape): the `headprune_transformer` architecture with `kept_heads` (the heads each pruned layer keeps, JSON)
and `kept_ffn` (the narrowed FFNs' widths), and the depth as encoder_layers / decoder_layers. The model applies
them before weights load (models.headprune_transformer). Written whole or not at all (checkpoint_io).
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Mapping, Optional

import torch
from omegaconf import OmegaConf

from fairseq_headprune.core.shape import configured_widths, ffn_widths, kept_ffn_json, kept_heads_json
from fairseq_headprune.errors import UserError
from fairseq_headprune.fairseq_io.checkpoint_io import save_state, write_checkpoint_pair

PRUNED_ARCH = "headprune_transformer"

def pruned_model_cfg(model_cfg, kept_json: str, kept_ffn: str = ""):
    """A copy of a checkpoint's model config as `headprune_transformer` with `kept_heads` (and `kept_ffn` when an
    FFN was narrowed).

    fairseq-train 0.12 stores cfg["model"] of legacy architectures as an argparse Namespace; hydra-style
    configs are dicts or DictConfigs (returned as a plain dict, as fairseq saves them).
    """
    fields = {"_name": PRUNED_ARCH, "arch": PRUNED_ARCH, "kept_heads": kept_json,
              **({"kept_ffn": kept_ffn} if kept_ffn else {})}
    if isinstance(model_cfg, argparse.Namespace):  # legacy top-level `args` have no _name: add none
        fields = {k: v for k, v in fields.items() if k != "_name" or hasattr(model_cfg, "_name")}
        return argparse.Namespace(**{**vars(model_cfg), **fields})
    if OmegaConf.is_config(model_cfg):
        model_cfg = OmegaConf.to_container(model_cfg)
    if isinstance(model_cfg, Mapping):
        return {**model_cfg, **fields}
    raise TypeError(f"unsupported model config type {type(model_cfg).__name__}")


def _names_within(weights: Mapping, layers: Mapping[str, int]) -> set:
    """The source's parameter names, but those of encoder/decoder layers at or beyond the model's depth (a model
    with whole layers removed, prune.layers, holds the first n layers' names)."""
    def kept(name: str) -> bool:
        parts = name.split(".")
        if len(parts) > 2 and parts[0] in ("encoder", "decoder") and parts[1] == "layers" and parts[2].isdigit():
            return int(parts[2]) < layers[f"{parts[0]}_layers"]
        return True
    return {k for k in weights if kept(k)}


def _with_depth(model_cfg, layers: Mapping[str, int]):
    """The config with the model's encoder_layers and decoder_layers (a dict or a Namespace, as given)."""
    if isinstance(model_cfg, argparse.Namespace):
        return argparse.Namespace(**{**vars(model_cfg), **layers})
    out = {**model_cfg, **layers}
    for part in ("encoder", "decoder"):  # hydra-style TransformerConfig: {"encoder": {"layers": n, ...}}
        if isinstance(out.get(part), Mapping) and "layers" in out[part]:
            out[part] = {**out[part], "layers": layers[f"{part}_layers"]}
    return out


def _depth(model) -> dict:
    return {f"{part}_layers": len(getattr(getattr(model, part, None), "layers", ())) for part in ("encoder", "decoder")}


def weights_state(model, source_checkpoint) -> dict:
    """`source_checkpoint`'s state with `model`'s weights, its config as it was: a model whose only change is its
    vocabulary (shrink --keep-vocab alone) stays the architecture stock fairseq builds. Optimizer and EMA states,
    whose shapes no longer fit, are dropped. The model must come from that checkpoint (same parameter names)."""
    state = torch.load(source_checkpoint, map_location="cpu", weights_only=False)
    weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if set(weights) != _names_within(state["model"], _depth(model)):
        raise UserError(f"the model does not come from {source_checkpoint}: its parameter names differ")
    state["model"] = weights
    state.pop("last_optimizer_state", None)
    if isinstance(state.get("extra_state"), dict):
        state["extra_state"].pop("ema", None)
    return state


def pruned_checkpoint_state(model, source_checkpoint) -> dict:
    """`source_checkpoint`'s state with `model`'s (pruned) weights and a config that rebuilds its shape.

    The model must come from that checkpoint (same parameter names). cfg.model (and legacy `args`) becomes
    `headprune_transformer` with `kept_heads` from the model's layout; optimizer and EMA states, whose shapes no
    longer fit, are dropped. Reloading needs this package as fairseq user module (`--user-dir fairseq_headprune`).
    """
    state = weights_state(model, source_checkpoint)
    layers = _depth(model)
    kept = kept_heads_json(model)
    source_cfg = state["cfg"]["model"] if state.get("cfg") is not None else state.get("args")
    ffn = kept_ffn_json(ffn_widths(model), configured_widths(source_cfg)) if source_cfg is not None else ""
    if state.get("cfg") is not None:
        state["cfg"]["model"] = _with_depth(pruned_model_cfg(state["cfg"]["model"], kept, ffn), layers)
    if state.get("args") is not None:
        state["args"] = _with_depth(pruned_model_cfg(state["args"], kept, ffn), layers)
    return state


def save_pruned_checkpoint(model, source_checkpoint, out_path, record: Optional[dict] = None) -> Path:
    """Write pruned_checkpoint_state(model, source_checkpoint) to `out_path` (and `record` beside it as OUT.json,
    the pair as one), whole or not at all, under a lock on the path (checkpoint_io)."""
    state = pruned_checkpoint_state(model, source_checkpoint)
    write_checkpoint_pair(str(out_path), lambda path: save_state(state, path), record=record)
    return Path(out_path)
