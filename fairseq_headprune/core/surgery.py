"""Physical removal of attention heads: pure selection functions, one attention module, a model, a checkpoint.

Heads are named by their ORIGINAL 1-indexed ids everywhere here (those of `heads.Head` and of the papers), never
by positions: a pruned module records in `head_ids` which original heads it still holds, so a spec written
against the unpruned model keeps meaning the same heads after any number of pruning rounds.

Removing the head at position p deletes rows p*head_dim..(p+1)*head_dim-1 of q/k/v_proj and the same input
columns of out_proj; out_proj's bias stays. fairseq's Python attention path reshapes with
`embed_dim = num_heads * head_dim`, which a pruned module always takes (`skip_embed_dim_check`: the fused torch
kernel asserts full dimensions). Each layer keeps its own number of heads. Outputs equal those of the masked
model; attention weights returned for alignment average over the kept heads only (a mask scales head outputs,
not weights, so a masked model still averages over all).

A module with no head left becomes a `HeadlessAttention`: see there. A checkpoint written by
save_pruned_checkpoint records the heads each pruned layer keeps as `kept_heads` (JSON) in its model config; the
`headprune_transformer` model applies it before weights load, so the checkpoint reloads with fairseq's loaders.
"""
from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Sequence, Tuple, Union

import torch
from torch import nn

from fairseq_headprune.core.heads import ATTENTION_TYPES, Head, HeadLayout, HeadSpecError, attention_modules, head_ids
from fairseq_headprune.errors import UserError
from fairseq_headprune.core.masking import HeadMaskedMultiheadAttention, head_gates

PRUNED_ARCH = "headprune_transformer"


# --------------------------------------------------------------------------------------------- pure functions


class GatedModelError(UserError):
    """Physical removal asked of a model that still carries L0 head gates."""


def head_rows(positions: Iterable[int], head_dim: int, device=None) -> torch.Tensor:
    """The q/k/v rows (= out_proj input columns) of the heads at these 0-based positions, in that order.

    Heads are contiguous blocks of head_dim rows in fairseq's projections (it views them as (.., heads, head_dim)).
    """
    rows = [p * head_dim + i for p in positions for i in range(head_dim)]
    return torch.tensor(rows, dtype=torch.long, device=device)


def select_linear(linear: nn.Linear, index: Union[torch.Tensor, Sequence[int]], dim: int) -> nn.Linear:
    """A new nn.Linear keeping output rows (dim=0) or input columns (dim=1) of `linear` at `index`.

    Rows keep their bias entries; columns keep the whole bias (every output still gets it). Dtype, device and
    requires_grad follow the original; the original is left untouched. An empty index gives a zero-size layer.
    """
    if dim not in (0, 1):
        raise ValueError(f"dim must be 0 (rows) or 1 (input columns), not {dim}")
    weight = linear.weight
    index = torch.as_tensor(index, dtype=torch.long, device=weight.device)
    new_weight = weight.detach().index_select(dim, index).clone()
    bias = linear.bias
    new_bias = None if bias is None else (bias.detach().index_select(0, index) if dim == 0 else bias.detach()).clone()
    out_features, in_features = new_weight.shape
    with warnings.catch_warnings():  # skip_init still runs init on meta tensors, which warns at zero size
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors is a no-op")
        new = torch.nn.utils.skip_init(
            nn.Linear, in_features, out_features, bias=bias is not None, device=weight.device, dtype=weight.dtype
        )
    new.weight = nn.Parameter(new_weight, requires_grad=weight.requires_grad)
    if bias is not None:
        new.bias = nn.Parameter(new_bias, requires_grad=bias.requires_grad)
    return new


# --------------------------------------------------------------------------------------------- one module


class HeadlessAttention(HeadMaskedMultiheadAttention):
    """An attention module whose heads were all removed: it returns out_proj's bias for every position.

    That is exactly what a fully masked layer gives (out_proj of zeros), without reshaping anything by zero
    heads (where fairseq's views become ambiguous, the head average divides by zero and BLAS kernels may see an
    in_features=0 matrix). It reads neither keys nor values and keeps no incremental state, so incremental
    decoding, the static keys of encoder-decoder attention and beam reordering have nothing to do; attention
    weights are None (an average over no heads does not exist; fairseq's decoder and generator accept None).
    Its projections keep zero-size weights, so its state-dict keys are those of any other attention module.
    It is a HeadMaskedMultiheadAttention (with an empty mask) so mask utilities treat every layer alike.
    """

    @classmethod
    def convert(cls, attn) -> "HeadlessAttention":
        attn = HeadMaskedMultiheadAttention.convert(attn)
        attn.__class__ = cls
        return attn

    def forward(
        self,
        query,
        key=None,
        value=None,
        key_padding_mask=None,
        incremental_state=None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask=None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ):
        if before_softmax:
            raise NotImplementedError("a headless attention module has no attention weights to return")
        out = query.new_zeros(query.size(0), query.size(1), self.out_proj.out_features)
        bias = self.out_proj.bias
        return (out if bias is None else out + bias.to(out.dtype)), None


def remove_heads(attn, heads: Iterable[int]):
    """Remove heads, named by ORIGINAL 1-indexed ids, from a fairseq MultiheadAttention, in place; returns it.

    Projections are replaced by smaller copies (select_linear), the head_mask buffer of a masked module shrinks
    with them, and `head_ids`/`original_num_heads` keep the ids meaningful. Removing every head turns the module
    into a HeadlessAttention. Removing no head changes nothing.
    """
    remove = set(heads)
    if not remove:
        return attn
    ids = head_ids(attn)
    missing = sorted(remove - set(ids))
    if missing:
        raise ValueError(f"heads {missing} are not in this attention module (it holds heads {ids})")
    if attn.bias_k is not None:  # its Python path fails its own `k.size(1) == src_len` assertion with bias_k
        raise NotImplementedError("fairseq 0.12 cannot run a pruned attention module built with add_bias_kv")
    if getattr(attn, "row_head_mask", None) is not None:
        raise RuntimeError("cannot remove heads while per-row masks are active (inside row_head_masks)")
    keep = [i for i, h in enumerate(ids) if h not in remove]
    rows = head_rows(keep, attn.head_dim, device=attn.out_proj.weight.device)
    attn.original_num_heads = int(getattr(attn, "original_num_heads", attn.num_heads))
    attn.q_proj = select_linear(attn.q_proj, rows, 0)
    attn.k_proj = select_linear(attn.k_proj, rows, 0)
    attn.v_proj = select_linear(attn.v_proj, rows, 0)
    attn.out_proj = select_linear(attn.out_proj, rows, 1)
    if isinstance(attn, HeadMaskedMultiheadAttention):
        attn.head_mask = attn.head_mask[torch.as_tensor(keep, dtype=torch.long, device=attn.head_mask.device)]
    attn.num_heads = len(keep)
    attn.embed_dim = len(keep) * attn.head_dim
    attn.head_ids = tuple(ids[i] for i in keep)
    attn.skip_embed_dim_check = True
    return HeadlessAttention.convert(attn) if not keep else attn


# --------------------------------------------------------------------------------------------- a model


def _by_layer(heads: Iterable[Head]) -> Dict[Tuple[str, int], List[int]]:
    grouped: Dict[Tuple[str, int], List[int]] = {}
    for h in heads:
        grouped.setdefault((h.type, h.layer), []).append(h.head)
    return grouped


def prune_model(model, heads: Iterable[Head]):
    """Remove these heads (original ids) from a fairseq transformer, in place; returns the model.

    Every head is checked against the model first (HeadLayout.check: a head already removed, a layer or head
    beyond the model), so a bad list changes nothing. The modules' `head_ids` are the one record of the new
    shape: kept_heads_json(model) reads it, save_pruned_checkpoint writes it into the checkpoint's config.
    """
    if head_gates(model):  # slicing q/k/v/out_proj would leave the gates' per-head parameters the old shape
        raise GatedModelError("the model has L0 head gates: fold them into a stock checkpoint first "
                              "(fairseq-headprune gates CKPT --results-dir DIR --fold-out stock.pt), then remove "
                              "heads from that")
    heads = sorted(set(heads))
    HeadLayout.of(model).check(heads)
    modules = attention_modules(model)
    for key, ids in _by_layer(heads).items():
        remove_heads(modules[key], ids)
    return model


def kept_heads(model) -> Dict[str, Dict[str, List[int]]]:
    """{type: {layer: [original ids still held]}} for the pruned layers only (JSON-ready)."""
    out: Dict[str, Dict[str, List[int]]] = {}
    layout = HeadLayout.of(model)
    for attn_type in ATTENTION_TYPES:
        for layer in layout.layers(attn_type):
            held = layout.heads[(attn_type, layer)]
            if len(held) < layout.original_heads[(attn_type, layer)]:
                out.setdefault(attn_type, {})[str(layer)] = list(held)
    return out


def kept_heads_json(model) -> str:
    """The `--kept-heads` value that rebuilds this model's shape; "" for an unpruned model."""
    kept = kept_heads(model)
    return json.dumps(kept, separators=(",", ":")) if kept else ""


def _parse_kept(kept: Union[str, Mapping]) -> Dict[Tuple[str, int], List[int]]:
    """{(type, layer): [ids]} from the JSON; a checkpoint edited by hand gets a one-line error, not a traceback."""
    if isinstance(kept, str):
        try:
            kept = json.loads(kept) if kept.strip() else {}
        except json.JSONDecodeError as e:
            raise HeadSpecError(f"--kept-heads is not valid JSON: {e}") from None
    if not isinstance(kept, Mapping) or not all(isinstance(v, Mapping) for v in kept.values()):
        raise HeadSpecError("--kept-heads must be a JSON object {TYPE: {LAYER: [HEADS]}}")
    out = {}
    for attn_type, layers in kept.items():
        for layer, ids in layers.items():
            if not str(layer).isdigit() or not (
                isinstance(ids, list) and all(isinstance(h, int) and not isinstance(h, bool) for h in ids)
            ):
                raise HeadSpecError(f"--kept-heads: bad entry {attn_type}/{layer}: expected a layer number and a list")
            out[(attn_type, int(layer))] = ids
    return out


def apply_kept_heads(model, kept: Union[str, Mapping]):
    """Prune a model down to the recorded `kept_heads` (layers not listed keep theirs); returns the model.

    This is how a pruned checkpoint is rebuilt: the freshly built model gets its pruned shape before
    load_state_dict. The kept heads must exist in the model; anything else is a HeadSpecError.
    """
    kept_by_layer = _parse_kept(kept)
    layout = HeadLayout.of(model)
    layout.check(Head(t, layer, h) for (t, layer), ids in kept_by_layer.items() for h in ids)
    for attn_type, layer in kept_by_layer:  # a layer kept with no head must still exist
        if attn_type not in ATTENTION_TYPES or layer not in layout.layers(attn_type):
            raise HeadSpecError(f"--kept-heads names {attn_type} layer {layer}, which the model does not have")
    removed = [
        Head(t, layer, h) for (t, layer), ids in kept_by_layer.items() for h in layout.heads[(t, layer)] if h not in ids
    ]
    return prune_model(model, removed)


# --------------------------------------------------------------------------------------------- a checkpoint


def pruned_model_cfg(model_cfg, kept_json: str, kept_ffn: str = ""):
    """A copy of a checkpoint's model config as `headprune_transformer` with `kept_heads` (and `kept_ffn` when an
    FFN was narrowed).

    fairseq-train 0.12 stores cfg["model"] of legacy architectures as an argparse Namespace; hydra-style
    configs are dicts or DictConfigs (returned as a plain dict, as fairseq saves them).
    """
    from omegaconf import OmegaConf

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
    with whole layers removed, compress.layers, holds the first n layers' names)."""
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


def pruned_checkpoint_state(model, source_checkpoint) -> dict:
    """`source_checkpoint`'s state with `model`'s (pruned) weights and a config that rebuilds its shape.

    The model must come from that checkpoint (same parameter names). cfg.model (and legacy `args`) becomes
    `headprune_transformer` with `kept_heads` from the model's layout; optimizer and EMA states, whose shapes no
    longer fit, are dropped. Reloading needs this package as fairseq user module (`--user-dir fairseq_headprune`).
    """
    from fairseq_headprune.compress.ffn import configured_widths, kept_ffn_json
    from fairseq_headprune.errors import UserError

    state = torch.load(source_checkpoint, map_location="cpu", weights_only=False)
    weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    layers = {f"{part}_layers": len(getattr(getattr(model, part, None), "layers", ()))
              for part in ("encoder", "decoder")}
    if set(weights) != _names_within(state["model"], layers):
        raise UserError(f"the model does not come from {source_checkpoint}: its parameter names differ")
    state["model"] = weights
    kept = kept_heads_json(model)
    source_cfg = state["cfg"]["model"] if state.get("cfg") is not None else state.get("args")
    ffn = kept_ffn_json(model, configured_widths(source_cfg)) if source_cfg is not None else ""
    if state.get("cfg") is not None:
        state["cfg"]["model"] = _with_depth(pruned_model_cfg(state["cfg"]["model"], kept, ffn), layers)
    if state.get("args") is not None:
        state["args"] = _with_depth(pruned_model_cfg(state["args"], kept, ffn), layers)
    state.pop("last_optimizer_state", None)
    if isinstance(state.get("extra_state"), dict):
        state["extra_state"].pop("ema", None)
    return state


def save_pruned_checkpoint(model, source_checkpoint, out_path) -> Path:
    """Write pruned_checkpoint_state(model, source_checkpoint) to `out_path`, whole or not at all, under a lock on
    the path (fairseq_headprune.fairseq_io.checkpoint_io)."""
    from fairseq_headprune.fairseq_io.checkpoint_io import save_state, write_checkpoint_pair

    state = pruned_checkpoint_state(model, source_checkpoint)
    write_checkpoint_pair(str(out_path), lambda path: save_state(state, path))
    return Path(out_path)
