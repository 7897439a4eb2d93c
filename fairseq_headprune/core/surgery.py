"""Physical removal of structures, one place for each: attention heads, FFN hidden units, whole layers, and target
words (rows of the output layer). Small functions on fairseq modules; what to remove is decided elsewhere (the
importance signals of core.importance, compress.select, compress.ffn, compress.layers), and the shape a model is
left with is read by core.shape.

Heads are named by their ORIGINAL 1-indexed ids everywhere here (those of `heads.Head` and of the papers), never
by positions: a pruned module records in `head_ids` which original heads it still holds, so a spec written
against the unpruned model keeps meaning the same heads after any number of pruning rounds.

Removing the head at position p deletes rows p*head_dim..(p+1)*head_dim-1 of q/k/v_proj and the same input
columns of out_proj; out_proj's bias stays. fairseq's Python attention path reshapes with
`embed_dim = num_heads * head_dim`, which a pruned module always takes (`skip_embed_dim_check`: the fused torch
kernel asserts full dimensions). Each layer keeps its own number of heads. Outputs equal those of the masked
model; attention weights returned for alignment average over the kept heads only (a mask scales head outputs,
not weights, so a masked model still averages over all). A module with no head left becomes a
`HeadlessAttention`: see there.

Vocabulary rows (trim_vocabulary) are rows of the token embeddings and of the output projection, selected by the
old ids a smaller dictionary keeps, sharing kept as the model had it; what a deployment keeps is chosen in
prune.vocabulary.

An FFN's hidden unit i is row i of fc1 and input column i of fc2: removing it computes exactly what the layer
computes with that unit's activation set to zero. Removing a pre- or post-norm transformer layer is exact too: the
model computes what the unpruned one computes with that layer skipped, since each layer maps the residual stream to
the next and nothing else reads it. A checkpoint records the result (fairseq_io.pruned_checkpoint: `kept_heads`,
`kept_ffn` and the depth in its model config); the `headprune_transformer` model applies it before weights load.
"""
from __future__ import annotations

import copy
import warnings
from typing import Dict, Iterable, List, Mapping, Sequence, Tuple, Union

import torch
from torch import nn

from fairseq_headprune.core.heads import ATTENTION_TYPES, Head, HeadLayout, HeadSpecError, attention_modules, head_ids
from fairseq_headprune.core.masking import HeadMaskedMultiheadAttention, head_gates
from fairseq_headprune.core.shape import (
    STACKS,
    Shape,
    Key,
    depths,
    even_layers,
    ffn_layers,
    kept_count,
    parse_kept_ffn,
    parse_kept_heads,
    stack_module,
)
from fairseq_headprune.errors import UserError


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
    shape: core.shape reads it, fairseq_io.pruned_checkpoint writes it into the checkpoint's config.
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


def apply_kept_heads(model, kept: Union[str, Mapping]):
    """Prune a model down to the recorded `kept_heads` (layers not listed keep theirs); returns the model.

    This is how a pruned checkpoint is rebuilt: the freshly built model gets its pruned shape before
    load_state_dict. The kept heads must exist in the model; anything else is a HeadSpecError.
    """
    kept_by_layer = parse_kept_heads(kept)
    layout = HeadLayout.of(model)
    layout.check(Head(t, layer, h) for (t, layer), ids in kept_by_layer.items() for h in ids)
    for attn_type, layer in kept_by_layer:  # a layer kept with no head must still exist
        if attn_type not in ATTENTION_TYPES or layer not in layout.layers(attn_type):
            raise HeadSpecError(f"--kept-heads names {attn_type} layer {layer}, which the model does not have")
    removed = [
        Head(t, layer, h) for (t, layer), ids in kept_by_layer.items() for h in layout.heads[(t, layer)] if h not in ids
    ]
    return prune_model(model, removed)


# --------------------------------------------------------------------------------------------- FFN hidden units


def remove_units(layer, keep: Sequence[int]) -> None:
    """Keep only these hidden units (0-based, in this order) of the layer's FFN, in place."""
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


def apply_kept_ffn(model, kept: Union[str, Mapping]):
    """Give a freshly built model the recorded FFN widths (its first units: the checkpoint's weights replace them)."""
    layers = ffn_layers(model)
    for key, units in parse_kept_ffn(kept).items():
        if key not in layers or units > layers[key].fc1.out_features:
            raise UserError(f"--kept-ffn names {key[0]} layer {key[1]} with {units} units, which the model cannot hold")
        remove_units(layers[key], list(range(units)))
    return model


# --------------------------------------------------------------------------------------------- whole layers


def check_kept_layers(model, kept: Mapping[str, Sequence[int]]) -> None:
    """Kept layers: known stacks, 1-indexed original numbers in the model, increasing, at least one per stack."""
    have = depths(model)
    for s, layers in kept.items():
        if s not in STACKS:
            raise UserError(f"unknown stack {s!r}: use enc or dec")
        layers = list(layers)
        if not layers:
            raise UserError(f"the {s} stack must keep at least one layer (fairseq and CTranslate2 need one)")
        bad = [i for i in layers if not isinstance(i, int) or not 1 <= i <= have[s]]
        if bad:
            raise UserError(f"{s} layer {bad[0]} does not exist: layers are 1..{have[s]}")
        if layers != sorted(set(layers)):
            raise UserError(f"{s} layers to keep must be increasing and distinct, not {layers}")


def _set_depth_in_cfg(model, stack: str, n: int) -> None:
    """The model's own config(s) say its new depth (fairseq 0.12 keeps a TransformerConfig in .cfg, legacy models
    an argparse Namespace in .args; encoder and decoder hold their own references)."""
    name = f"{'encoder' if stack == 'enc' else 'decoder'}_layers"
    part = stack_module(model, stack)
    for owner in (model, part):
        for attr in ("cfg", "args"):
            cfg = getattr(owner, attr, None)
            if cfg is None:
                continue
            sub = getattr(cfg, "encoder" if stack == "enc" else "decoder", None)
            if sub is not None and hasattr(sub, "layers"):
                sub.layers = n
            if hasattr(cfg, name):
                setattr(cfg, name, n)


def remove_layers(model, kept: Mapping[str, Sequence[int]]):
    """Keep only these layers (original 1-indexed numbers) of each named stack, in place; returns the model.

    Checked first, so bad input changes nothing. The kept layers are renumbered 1..n (their parameter names become
    those of the first n layers)."""
    check_kept_layers(model, kept)
    for s, layers in kept.items():
        part = stack_module(model, s)
        part.layers = nn.ModuleList([part.layers[i - 1] for i in layers])
        part.num_layers = len(part.layers)
        _set_depth_in_cfg(model, s, len(part.layers))
    return model


# --------------------------------------------------------------------------------------------- vocabulary rows


def select_embedding(embed: nn.Embedding, index: Sequence[int]) -> nn.Embedding:
    """A new nn.Embedding holding the rows of `embed` at `index`, in that order (new id i = old id index[i]); its
    padding row is wherever the old one went (None if dropped). The original is left untouched."""
    weight = embed.weight
    rows = weight.detach().index_select(0, torch.as_tensor(list(index), dtype=torch.long, device=weight.device))
    padding = list(index).index(embed.padding_idx) if embed.padding_idx in index else None
    new = torch.nn.utils.skip_init(nn.Embedding, rows.size(0), rows.size(1), padding_idx=padding,
                                   device=weight.device, dtype=weight.dtype)
    new.weight = nn.Parameter(rows.clone(), requires_grad=weight.requires_grad)
    return new


def check_vocabulary_ids(ids: Sequence[int], size: int, keep_first: int, side: str) -> None:
    """Kept ids: distinct, within the vocabulary, the first `keep_first` (the special symbols) first and in place."""
    ids = list(ids)
    if len(set(ids)) != len(ids) or not all(0 <= i < size for i in ids):
        raise ValueError(f"{side} ids to keep must be distinct and in 0..{size - 1}")
    if ids[:keep_first] != list(range(keep_first)):
        raise ValueError(f"{side} ids to keep must begin with the special symbols 0..{keep_first - 1}, in order")


def vocabulary_modules(model, source_ids: Sequence[int], target_ids: Sequence[int], keep_first: int = 4):
    """New (encoder embeddings, decoder embeddings, output projection) of a fairseq transformer holding only the rows
    of these ids (old ids in their new order: source ids for the encoder, target ids for the decoder's input and
    output rows), `model` untouched. What the model shares stays shared: one embedding for both stacks
    (--share-all-embeddings, which needs equal id lists), the output projection tied to the decoder's embeddings
    (--share-decoder-input-output-embed). The first `keep_first` ids (the special symbols) keep their places."""
    encoder, decoder = model.encoder, model.decoder
    if getattr(decoder, "adaptive_softmax", None) is not None or decoder.output_projection is None:
        raise ValueError("a decoder with an adaptive softmax has no output projection rows to select")
    if not isinstance(encoder.embed_tokens, nn.Embedding) or not isinstance(decoder.embed_tokens, nn.Embedding):
        raise ValueError("only token embedding tables (nn.Embedding) have rows to select")
    check_vocabulary_ids(source_ids, encoder.embed_tokens.num_embeddings, keep_first, "source")
    check_vocabulary_ids(target_ids, decoder.embed_tokens.num_embeddings, keep_first, "target")
    shared = encoder.embed_tokens is decoder.embed_tokens
    if shared and list(source_ids) != list(target_ids):
        raise ValueError("shared embeddings keep one list of ids for both stacks")
    target_embed = select_embedding(decoder.embed_tokens, target_ids)
    source_embed = target_embed if shared else select_embedding(encoder.embed_tokens, source_ids)
    projection = decoder.output_projection
    if projection.weight is decoder.embed_tokens.weight:
        new = nn.Linear(target_embed.embedding_dim, target_embed.num_embeddings, bias=False,
                        device=projection.weight.device, dtype=projection.weight.dtype)
        new.weight = target_embed.weight  # tied as fairseq ties them: one parameter
    else:
        new = select_linear(projection, target_ids, 0)
    return source_embed, target_embed, new


def trim_vocabulary(model, source_ids: Sequence[int], target_ids: Sequence[int], keep_first: int = 4):
    """Keep only these vocabulary rows (vocabulary_modules), in place; returns the model. A token it drops has no
    row: the model computes, for the tokens it keeps, exactly what it computed before, its softmax normalised over
    them alone."""
    source_embed, target_embed, projection = vocabulary_modules(model, source_ids, target_ids, keep_first)
    model.encoder.embed_tokens = source_embed
    model.decoder.embed_tokens = target_embed
    model.decoder.output_projection = projection
    return model


# --------------------------------------------------------------------------------------------- target words


def cut_target_vocabulary(model, target_dictionary, words: Iterable[int]):
    """Keep only these target words (ids; the special symbols always) in the decoder's input embeddings and output
    layer, in place, and return the dictionary cut alike (same order). CTranslate2 addresses words by their text, so
    its output maps back to the full dictionary's ids."""
    keep = sorted(set(range(target_dictionary.nspecial)) | set(words))
    dictionary = copy.copy(target_dictionary)
    dictionary.symbols = [target_dictionary.symbols[i] for i in keep]
    dictionary.indices = {s: i for i, s in enumerate(dictionary.symbols)}
    decoder = model.decoder
    decoder.output_projection = select_linear(decoder.output_projection, keep, 0)
    decoder.embed_tokens = select_embedding(decoder.embed_tokens, keep)  # the specials keep their ids
    return dictionary


# --------------------------------------------------------------------------------------------- a crude shape


def crude_model(model, target_dictionary, shape: Shape):
    """A copy of `model` cut to `shape` (the first heads, FFN units and target words kept, evenly spaced layers) and
    its target dictionary, cut alike. Only its speed means anything: a speed ceiling (deploy --ceilings)."""
    shape.check(model)
    model = copy.deepcopy(model)
    depth = {s: n for s, n in (("enc", shape.enc_layers), ("dec", shape.dec_layers)) if n is not None}
    remove_layers(model, {s: even_layers(len(stack_module(model, s).layers), n) for s, n in depth.items()})
    removed: List[Head] = []
    for (attn_type, layer), attn in attention_modules(model).items():
        kept = shape.enc_heads if attn_type == "enc-self" else shape.dec_heads
        removed += [Head(attn_type, layer, h) for h in head_ids(attn)[kept:]]
    prune_model(model, removed)
    for layer in list(model.encoder.layers) + list(model.decoder.layers):
        remove_units(layer, list(range(kept_count(layer.fc1.out_features, shape.ffn_percent))))
    words = kept_count(len(target_dictionary), shape.vocab_percent, least=target_dictionary.nspecial + 1)
    return model, cut_target_vocabulary(model, target_dictionary, range(words))
