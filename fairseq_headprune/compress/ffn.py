"""FFN hidden units as units of pruning: their importance, their removal, and the widths a checkpoint records.

A layer's FFN is fc2(act(fc1 x)); hidden unit i is row i of fc1 and input column i of fc2. Removing it deletes
both (surgery.select_linear), which computes exactly what the layer computes with that unit's activation set to
zero. Each layer keeps its own number of units: CTranslate2 reads a layer's width from its weights, and the
`headprune_transformer` model builds the widths a checkpoint records (`kept_ffn`, JSON {"enc"|"dec": {LAYER:
UNITS}}, the layers narrower than the config's width) before fairseq loads the weights.

Importance is Kwon et al. (2022)'s mask Fisher: for a mask m_i on unit i's activation a_i, the loss gradient of
sentence s is ∂L_s/∂m_i = Σ_t a_t,i · ∂L/∂a_t,i over its tokens (one backward pass gives every sentence's: the
sentences of a batch do not interact), and F_i = Σ_s (∂L_s/∂m_i)². Each FFN keeps its highest-Fisher units; the
reconstruction then refits fc2 on the units kept (compress.reconstruct), which is Kwon's mask tuning.
"""
from __future__ import annotations

import json
from typing import Dict, Iterable, List, Mapping, Sequence, Tuple, Union

import torch

from fairseq_headprune.errors import UserError

Key = Tuple[str, int]  # ("enc" | "dec", 1-indexed layer)
STACKS = ("enc", "dec")


def ffn_layers(model) -> Dict[Key, torch.nn.Module]:
    """{(stack, layer): the transformer layer holding that FFN}, encoder first."""
    return {(s, i): layer for s, part in (("enc", model.encoder), ("dec", model.decoder))
            for i, layer in enumerate(part.layers, 1)}


def widths(model) -> Dict[Key, int]:
    return {key: layer.fc1.out_features for key, layer in ffn_layers(model).items()}


def remove_units(layer, keep: Sequence[int]) -> None:
    """Keep only these hidden units (0-based, in this order) of the layer's FFN, in place."""
    from fairseq_headprune.core.surgery import select_linear

    layer.fc1, layer.fc2 = select_linear(layer.fc1, keep, 0), select_linear(layer.fc2, keep, 1)


def prune_ffn(model, kept: Mapping[Key, Sequence[int]]):
    """Keep these units of each named FFN (the others whole), in place; returns the model. Checked first."""
    layers = ffn_layers(model)
    for key, units in kept.items():
        if key not in layers:
            raise UserError(f"the model has no {key[0]} layer {key[1]}")
        width = layers[key].fc1.out_features
        if not units or sorted(set(units)) != sorted(units) or not all(0 <= u < width for u in units):
            raise UserError(f"{key[0]} layer {key[1]}: units to keep must be distinct, in 0..{width - 1}, at least one")
    for key, units in kept.items():
        remove_units(layers[key], sorted(units))
    return model


def configured_widths(model_cfg) -> Dict[str, int]:
    """{stack: the FFN width the config builds} (legacy Namespace or dict config)."""
    get = (lambda k: model_cfg.get(k)) if isinstance(model_cfg, Mapping) else (lambda k: getattr(model_cfg, k, None))
    return {"enc": get("encoder_ffn_embed_dim"), "dec": get("decoder_ffn_embed_dim")}


def kept_ffn_json(model, configured: Mapping[str, int]) -> str:
    """The `--kept-ffn` value that rebuilds this model's FFN widths (the layers narrower than `configured`)."""
    out: Dict[str, Dict[str, int]] = {}
    for (s, i), units in widths(model).items():
        if units != configured.get(s):
            out.setdefault(s, {})[str(i)] = units
    return json.dumps(out, separators=(",", ":")) if out else ""


def parse_kept_ffn(kept: Union[str, Mapping]) -> Dict[Key, int]:
    """{(stack, layer): units} from the JSON; a hand-edited checkpoint gets one line, not a traceback."""
    if isinstance(kept, str):
        try:
            kept = json.loads(kept) if kept.strip() else {}
        except json.JSONDecodeError as e:
            raise UserError(f"--kept-ffn is not valid JSON: {e}") from None
    if not isinstance(kept, Mapping) or not all(s in STACKS and isinstance(v, Mapping) for s, v in kept.items()):
        raise UserError('--kept-ffn must be a JSON object {"enc"|"dec": {LAYER: UNITS}}')
    out = {}
    for s, layers in kept.items():
        for layer, units in layers.items():
            if not str(layer).isdigit() or not isinstance(units, int) or isinstance(units, bool) or units < 1:
                raise UserError(f"--kept-ffn: bad entry {s}/{layer}: expected a layer number and a unit count")
            out[(s, int(layer))] = units
    return out


def apply_kept_ffn(model, kept: Union[str, Mapping]):
    """Give a freshly built model the recorded FFN widths (its first units: the checkpoint's weights replace them)."""
    layers = ffn_layers(model)
    for key, units in parse_kept_ffn(kept).items():
        if key not in layers or units > layers[key].fc1.out_features:
            raise UserError(f"--kept-ffn names {key[0]} layer {key[1]} with {units} units, which the model cannot hold")
        remove_units(layers[key], list(range(units)))
    return model


# --------------------------------------------------------------------------------------------- importance


def unit_gradients(model, samples: Iterable[dict], pad: int) -> Dict[Key, torch.Tensor]:
    """{(stack, layer): (sentences, units) float64 tensor of ∂L_s/∂m_i}, rows in the order of the samples' rows
    (L_s: sentence s's summed token NLL, teacher-forced, eval mode; no weight gets a gradient)."""
    from fairseq_headprune.compress.select import sentence_nll

    model.eval()
    layers = ffn_layers(model)
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    chunks: Dict[Key, List[torch.Tensor]] = {key: [] for key in layers}
    seen: Dict[Key, torch.Tensor] = {}

    def keep_input(key):
        def hook(module, args):
            x = args[0]
            if not x.requires_grad:
                x = x.detach().requires_grad_(True)
            x.retain_grad()
            seen[key] = x
            return (x,) + tuple(args[1:])
        return hook

    handles = [layer.fc2.register_forward_pre_hook(keep_input(key)) for key, layer in layers.items()]
    try:
        for sample in samples:
            seen.clear()
            sentence_nll(model, sample, pad).backward()
            rows = sample["target"].size(0)
            for key, x in seen.items():  # fairseq's layers are time-major: (T, B, units)
                if x.dim() != 3 or x.size(1) != rows:
                    raise RuntimeError(f"{key}: fc2 input of shape {tuple(x.shape)} is not (T, {rows}, units)")
                grad = x.grad if x.grad is not None else torch.zeros_like(x)
                chunks[key].append((x.detach() * grad).sum(0).double().cpu())
    finally:
        for h in handles:
            h.remove()
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
    return {key: torch.cat(parts) for key, parts in chunks.items()}


def fisher_kept(grads: Mapping[Key, torch.Tensor], percent: float) -> Dict[Key, List[int]]:
    """Each FFN keeps its kept_count(units, percent) highest-Fisher units (ties: the lower index), in index order."""
    from fairseq_headprune.studies.ceilings import kept_count

    out = {}
    for key, g in grads.items():
        fisher = g.pow(2).sum(0)
        n = kept_count(fisher.numel(), percent)
        order = sorted(range(fisher.numel()), key=lambda i: (-float(fisher[i]), i))
        out[key] = sorted(order[:n])
    return out
