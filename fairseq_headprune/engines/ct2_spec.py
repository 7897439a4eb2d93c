"""A fairseq transformer as a CTranslate2 model, written through CTranslate2's own spec API (`ctranslate2.specs`),
never by editing its files: any transformer this package reads or writes, `headprune_transformer` included, read
module by module as loaded, whatever its heads.

CTranslate2 has one head count per stack (`encoder/num_heads`, `decoder/num_heads`, the decoder's self- and
cross-attention sharing it) but a per-layer `head_dim` and projection widths taken from the weights. A layer with
fewer heads than its stack's maximum is written zero-padded up to it: a padded head has zero queries, keys and
values (uniform attention over zero values) and zero out-projection columns, so it adds exactly nothing. An emptied
sublayer (no head left) becomes padded heads only: its output is out_proj's bias, as in fairseq. The padded model
computes what the pruned one does but costs what its largest layer per stack costs.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from fairseq_headprune.core.heads import attention_modules
from fairseq_headprune.core.masking import head_gates
from fairseq_headprune.errors import UserError

# fairseq's activation names -> CTranslate2's (common_spec.Activation); others cannot be expressed
ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "gelu_accurate": "GELUTanh", "gelu_fast": "GELUTanh",
               "swish": "SWISH"}


# --------------------------------------------------------------------------------------------- what CT2 can express


def _layers(model):
    return list(model.encoder.layers), list(model.decoder.layers)


def unsupported_parts(model, activation: str) -> List[str]:
    """The parts of a fairseq model CTranslate2's TransformerSpec cannot express (empty: it can)."""
    from fairseq.models.transformer import TransformerModel

    if not isinstance(model, TransformerModel):
        return [f"model class {type(model).__name__} (only fairseq transformer encoder-decoders)"]
    problems = []
    if head_gates(model):
        problems.append("L0 head gates (fold them first: fairseq-headprune gates CKPT --fold-out stock.pt)")
    if activation not in ACTIVATIONS:
        problems.append(f"activation {activation} (CTranslate2 has {', '.join(ACTIVATIONS)})")
    enc, dec = model.encoder, model.decoder
    for name, stack in (("encoder", enc), ("decoder", dec)):
        if stack.embed_positions is None:
            problems.append(f"{name} without positional embeddings (--no-token-positional-embeddings)")
        if getattr(stack, "quant_noise", None) is not None:
            problems.append(f"{name} quant-noise projection")
    if getattr(dec, "adaptive_softmax", None) is not None:
        problems.append("decoder adaptive softmax")
    if getattr(dec, "cross_self_attention", False):
        problems.append("decoder cross-self-attention")
    if (dec.project_in_dim is None) != (dec.project_out_dim is None):
        problems.append("a decoder input projection without an output projection (or the reverse)")
    if len({ln.eps for ln in model.modules() if isinstance(ln, torch.nn.LayerNorm)}) > 1:
        problems.append("layer norms with different epsilons")
    encoder_layers, decoder_layers = _layers(model)
    if len({layer.normalize_before for layer in encoder_layers}) > 1 or \
            len({layer.normalize_before for layer in decoder_layers}) > 1:
        problems.append("pre-norm and post-norm layers in one stack")
    for i, layer in enumerate(encoder_layers + decoder_layers):
        where = f"encoder layer {i + 1}" if i < len(encoder_layers) else f"decoder layer {i - len(encoder_layers) + 1}"
        for attr, what in (("attn_ln", "--scale-attn"), ("c_attn", "--scale-heads"), ("ffn_layernorm", "--scale-fc"),
                           ("w_resid", "--scale-resids")):
            if getattr(layer, attr, None) is not None:
                problems.append(f"{where}: NormFormer {what}")
    for (attn_type, layer), attn in attention_modules(model).items():
        if attn.bias_k is not None or getattr(attn, "add_zero_attn", False):
            problems.append(f"{attn_type} layer {layer}: --add-bias-kv / --add-zero-attn")
    return problems


def stack_heads(model) -> Tuple[int, int]:
    """CTranslate2's one head count per stack: the most heads any layer keeps (encoder self-attention; decoder
    self- and cross-attention together), at least 1 so that an emptied stack still has a (zero) head."""
    counts: Dict[str, int] = {"encoder": 1, "decoder": 1}
    for (attn_type, _layer), attn in attention_modules(model).items():
        stack = "encoder" if attn_type == "enc-self" else "decoder"
        counts[stack] = max(counts[stack], int(attn.num_heads))
    return counts["encoder"], counts["decoder"]


def stack_head_dims(model) -> Tuple[int, int]:
    """The head dimension of each stack, written out (a pruned stack's heads x head_dim is not its model width)."""
    dims: Dict[str, set] = {"encoder": set(), "decoder": set()}
    for (attn_type, _layer), attn in attention_modules(model).items():
        dims["encoder" if attn_type == "enc-self" else "decoder"].add(int(attn.head_dim))
    for stack, found in dims.items():
        if len(found) != 1:
            raise UserError(f"CTranslate2 cannot express this model: {stack} attention layers with head dimensions "
                            f"{sorted(found)} (one per stack)")
    return dims["encoder"].pop(), dims["decoder"].pop()


# --------------------------------------------------------------------------------------------- weights


def _array(t: torch.Tensor) -> np.ndarray:
    """A copy: .numpy() of a float32 CPU tensor shares its memory, and the spec's quantization (optimize) rewrites
    its arrays in place - the fairseq model it was built from would be quantized with it."""
    return t.detach().to(torch.float32).cpu().numpy().copy()


def padded_projections(attn, num_heads: int) -> Dict[str, np.ndarray]:
    """q/k/v weights and biases with zero rows up to `num_heads` heads, out_proj with zero input columns: a padded
    head contributes exactly nothing (and a module with no head left gives out_proj's bias, as fairseq does)."""
    kept, head_dim = int(attn.num_heads), int(attn.head_dim)
    if kept > num_heads:
        raise ValueError(f"{kept} heads do not fit in {num_heads}")
    missing = (num_heads - kept) * head_dim
    out = {}
    for name in ("q_proj", "k_proj", "v_proj"):
        linear = getattr(attn, name)
        weight = _array(linear.weight)
        out[f"{name}.weight"] = np.concatenate([weight, np.zeros((missing, weight.shape[1]), np.float32)])
        bias = _array(linear.bias) if linear.bias is not None else np.zeros(kept * head_dim, np.float32)
        out[f"{name}.bias"] = np.concatenate([bias, np.zeros(missing, np.float32)])
    weight = _array(attn.out_proj.weight)
    out["out_proj.weight"] = np.concatenate([weight, np.zeros((weight.shape[0], missing), np.float32)], axis=1)
    bias = attn.out_proj.bias
    out["out_proj.bias"] = _array(bias) if bias is not None else np.zeros(weight.shape[0], np.float32)
    return out


def _set_linear(spec, weight: np.ndarray, bias: Optional[np.ndarray]) -> None:
    spec.weight = weight
    if bias is not None:
        spec.bias = bias


def _set_module(spec, linear) -> None:
    _set_linear(spec, _array(linear.weight), None if linear.bias is None else _array(linear.bias))


def _set_norm(spec, norm) -> None:
    spec.gamma = _array(norm.weight)
    spec.beta = _array(norm.bias)


def set_attention(spec, attn, num_heads: int, self_attention: bool) -> None:
    """One attention sublayer, zero-padded to the stack's head count."""
    w = padded_projections(attn, num_heads)
    if self_attention:  # CT2 fuses q, k, v into one projection for self-attention
        parts = ("q_proj", "k_proj", "v_proj")
        _set_linear(spec.linear[0], np.concatenate([w[f"{p}.weight"] for p in parts]),
                    np.concatenate([w[f"{p}.bias"] for p in parts]))
    else:  # and k, v for encoder-decoder attention
        _set_linear(spec.linear[0], w["q_proj.weight"], w["q_proj.bias"])
        _set_linear(spec.linear[1], np.concatenate([w["k_proj.weight"], w["v_proj.weight"]]),
                    np.concatenate([w["k_proj.bias"], w["v_proj.bias"]]))
    _set_linear(spec.linear[-1], w["out_proj.weight"], w["out_proj.bias"])


def _positions(module) -> np.ndarray:
    """Position encodings from the first real position on (fairseq numbers positions from padding_idx + 1; its
    sinusoids are built for the model's maximum positions and grow on demand)."""
    weight = module.weight if isinstance(module, torch.nn.Embedding) else module.weights
    return _array(weight)[module.padding_idx + 1:]


def _set_inputs(spec, stack) -> None:
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _array(stack.embed_tokens.weight)
    spec.position_encodings.encodings = _positions(stack.embed_positions)
    spec.scale_embeddings = float(stack.embed_scale)
    if stack.layernorm_embedding is not None:
        _set_norm(spec.layernorm_embedding, stack.layernorm_embedding)
    if stack.layer_norm is not None:
        _set_norm(spec.layer_norm, stack.layer_norm)


def vocabulary(dictionary) -> List[str]:
    """A fairseq dictionary as CTranslate2's vocabulary: same ids; padding named `<blank>` as CT2 names it."""
    return ["<blank>" if i == dictionary.pad() else s for i, s in enumerate(dictionary.symbols)]


def build_spec(model, source_dictionary, target_dictionary, activation: str,
               pad_to: Optional[Tuple[int, int]] = None):
    """A CTranslate2 TransformerSpec holding exactly what `model` computes (refused in one line when it cannot).
    `pad_to` (encoder, decoder heads) pads further than the stack's largest layer: a pruned model padded back to
    the unpruned shape computes the pruned function at the unpruned cost (the `masked` model of `speed`)."""
    from ctranslate2.specs import common_spec, transformer_spec

    problems = unsupported_parts(model, activation)
    if problems:
        raise UserError(f"CTranslate2 cannot express this model: {'; '.join(problems)}")
    enc, dec = model.encoder, model.decoder
    encoder_layers, decoder_layers = _layers(model)
    enc_heads, dec_heads = stack_heads(model)
    if pad_to is not None:
        if pad_to[0] < enc_heads or pad_to[1] < dec_heads:
            raise ValueError(f"cannot pad {enc_heads}+{dec_heads} heads per stack down to {pad_to}")
        enc_heads, dec_heads = pad_to
    enc_dim, dec_dim = stack_head_dims(model)
    act = getattr(common_spec.Activation, ACTIVATIONS[activation])
    encoder = transformer_spec.TransformerEncoderSpec(
        len(encoder_layers), enc_heads, pre_norm=bool(encoder_layers[0].normalize_before),
        no_final_norm=enc.layer_norm is None, activation=act, layernorm_embedding=enc.layernorm_embedding is not None,
        head_dim=enc_dim)
    decoder = transformer_spec.TransformerDecoderSpec(
        len(decoder_layers), dec_heads, pre_norm=bool(decoder_layers[0].normalize_before),
        no_final_norm=dec.layer_norm is None, activation=act, layernorm_embedding=dec.layernorm_embedding is not None,
        project_in_out=dec.project_in_dim is not None, head_dim=dec_dim)
    _set_inputs(encoder, enc)
    for spec, layer in zip(encoder.layer, encoder_layers):
        set_attention(spec.self_attention, layer.self_attn, enc_heads, self_attention=True)
        _set_norm(spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        _set_ffn(spec.ffn, layer)
    _set_inputs(decoder, dec)
    _set_module(decoder.projection, dec.output_projection)
    if dec.project_in_dim is not None:
        _set_module(decoder.project_in, dec.project_in_dim)
        _set_module(decoder.project_out, dec.project_out_dim)
    for spec, layer in zip(decoder.layer, decoder_layers):
        set_attention(spec.self_attention, layer.self_attn, dec_heads, self_attention=True)
        _set_norm(spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        set_attention(spec.attention, layer.encoder_attn, dec_heads, self_attention=False)
        _set_norm(spec.attention.layer_norm, layer.encoder_attn_layer_norm)
        _set_ffn(spec.ffn, layer)
    spec = transformer_spec.TransformerSpec(encoder, decoder)
    spec.register_source_vocabulary(vocabulary(source_dictionary))
    spec.register_target_vocabulary(vocabulary(target_dictionary))
    config = spec.config
    config.bos_token, config.eos_token = target_dictionary.bos_word, target_dictionary.eos_word
    config.unk_token = target_dictionary.unk_word
    config.decoder_start_token = target_dictionary.eos_word  # fairseq starts decoding from EOS
    config.add_source_eos = True  # and appends EOS to every source
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    if norms:
        config.layer_norm_epsilon = float(norms[0].eps)
    return spec


def _set_ffn(spec, layer) -> None:
    _set_norm(spec.layer_norm, layer.final_layer_norm)
    _set_module(spec.linear_0, layer.fc1)
    _set_module(spec.linear_1, layer.fc2)


def write_model(spec, folder: str, quantization: Optional[str], vocab_map: Optional[str] = None) -> None:
    """Validate, quantize (None: float32 as loaded) and save the spec into a folder that does not exist yet, with
    the vocabulary map file `vocab_map` (saved as the folder's vmap.txt) when given."""
    if vocab_map:
        spec.register_vocabulary_mapping(vocab_map)
    spec.validate()
    spec.optimize(quantization=quantization or "float32")
    os.makedirs(folder)
    spec.save(folder)


def float32_weight_bytes(spec) -> int:
    """The bytes of the spec's weights as CTranslate2 stores them in float32 (a table shared by several layers
    once), read from the spec: nothing is written. A saved model.bin adds the weights' names and shapes."""
    spec.validate()
    spec.optimize(quantization="float32")
    return sum(value.num_bytes() for _, value in spec.variables(ordered=True) if not isinstance(value, str))
