"""Export to CTranslate2 (`fairseq-headprune export-ct2`): any fairseq transformer this package reads or writes,
written through CTranslate2's own spec API (`ctranslate2.specs`), never by editing its files.

Why not CTranslate2's `ct2-fairseq-converter`: it rebuilds the model from the checkpoint's architecture name, so it
refuses `headprune_transformer` (what `remove`, `shrink` and recovered checkpoints are) and needs `args` in the
checkpoint. Here the model is read as loaded, module by module, whatever its heads.

CTranslate2 has one head count per stack (`encoder/num_heads`, `decoder/num_heads`, the decoder's self- and
cross-attention sharing it) but a per-layer `head_dim` and projection widths taken from the weights. A layer with
fewer heads than its stack's maximum is written zero-padded up to it: a padded head has zero queries, keys and
values (uniform attention over zero values) and zero out-projection columns, so it adds exactly nothing. An emptied
sublayer (no head left) becomes padded heads only: its output is out_proj's bias, as in fairseq. The padded model
computes what the pruned one does but costs what its largest layer per stack costs: `shrink --shape per-stack`
gives shapes with nothing to pad.

Before anything is written the exported model translates a slice with CTranslate2 and fairseq alike: float32
token ids are compared one by one, and with quantization the BLEU of both is given. Under the multilingual task the
target language token fairseq forces first is CTranslate2's target prefix (target_prefix); mBART's task, which ends
hypotheses on the language token, is refused.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import sacrebleu
import torch

from fairseq_headprune.compress import deployable
from fairseq_headprune.errors import UserError
from fairseq_headprune.options import nested, option
from fairseq_headprune.core.heads import attention_modules
from fairseq_headprune.core.masking import head_gates
from fairseq_headprune.fairseq_io.loading import load_subset
from fairseq_headprune.compress.vocab_map import VMAP_FILE, VocabMapOptions, build_vmap, translate_options

QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")
# fairseq's activation names -> CTranslate2's (common_spec.Activation); others cannot be expressed
ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "gelu_accurate": "GELUTanh", "gelu_fast": "GELUTanh",
               "swish": "SWISH"}


@dataclass
class ExportOptions:
    """What `export-ct2` does; field names are the command's options (`inputs`: the paths the command reads)."""

    out: str = option(flag="--out", metavar="DIR", help="the CTranslate2 model folder to write")
    quantization: Optional[str] = option(None, flag="--quantization", metavar="TYPE",
                                         help=f"weight type of the written model: {', '.join(QUANTIZATIONS)} (default: "
                                              "float32)")
    force: bool = option(False, flag="--force",
                         help="replace an existing --out folder: an empty one or a CTranslate2 model folder only")
    check_sentences: int = option(100, flag="--check-sentences",
                                  help="sentences of --gen-subset (the first ones) both engines translate before "
                                       "writing")
    max_differing: float = option(0.05, flag="--max-differing",
                                  help="share of float32 hypotheses allowed to differ from fairseq's (float rounding) "
                                       "before the export is refused")
    inputs: Tuple[str, ...] = ()
    vocab_map: bool = option(False, flag="--vocab-map",  # compress.vocab_map
                             help="write a vocabulary map (vmap.txt, translated with use_vmap) built from DATA's "
                                  "train pairs: the output layer scores only the target words the batch's source "
                                  "words bring in")
    vocab_map_options: VocabMapOptions = nested(VocabMapOptions)
    vocab_map_subsets: Tuple[str, ...] = ("train",)  # the subsets of DATA whose pairs the map is built from

    def check(self) -> None:
        self.vocab_map_options.check()
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise UserError(f"--quantization {self.quantization} is not one CTranslate2 knows: "
                            f"{', '.join(QUANTIZATIONS)}")
        if self.check_sentences < 1:
            raise UserError(f"--check-sentences must be at least 1, not {self.check_sentences}")
        if not 0 <= self.max_differing <= 1:
            raise UserError(f"--max-differing is a share between 0 and 1, not {self.max_differing}")
        check_output_folder(self.out, self.force, self.inputs)


# the files CTranslate2's spec.save writes (vocabularies: .json since 3.0, .txt before) and the deployable folder's
# (compress.deployable), and the vocabulary map: a folder holding anything else is not one export-ct2 wrote, and
# --force never replaces it
CT2_REQUIRED = ("config.json", "model.bin")
CT2_VOCABULARY = re.compile(r"((shared|source|target)_)?vocabulary\.(json|txt)")


def foreign_entries(folder: str) -> List[str]:
    """What in `folder` a CTranslate2 model folder would not hold, so --force leaves it alone (empty: replaceable)."""
    names = sorted(os.listdir(folder))
    if not names:
        return []
    # a README.md without translate.json beside it is the user's
    ours = CT2_REQUIRED + (VMAP_FILE,) + (deployable.FILES if deployable.SETTINGS in names else ())
    foreign = [n for n in names if (n not in ours and not CT2_VOCABULARY.fullmatch(n))
               or os.path.islink(os.path.join(folder, n)) or not os.path.isfile(os.path.join(folder, n))]
    return foreign + [f"no {n}" for n in CT2_REQUIRED if n not in names]


def _inside(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or lies under it, links resolved (an input inside --out would be replaced)."""
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_output_folder(out: str, force: bool, inputs: Sequence[str] = ()) -> None:
    """The model folder to write: new, or with --force an empty folder or a CTranslate2 model folder (recognised
    by its files), never an input or a folder holding one; its parent must exist and be writable."""
    for given in inputs:
        if given and _inside(given, out):
            raise UserError(f"--out {out} is or holds an input of this command ({given}); write elsewhere")
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"--out {out} is a file, not a model folder")
    if os.path.exists(out) and not force:
        raise UserError(f"--out {out} exists; pass --force to replace it")
    if os.path.isdir(out):
        foreign = [] if os.path.islink(out) else foreign_entries(out)
        if os.path.islink(out) or foreign:
            why = "it is a link" if os.path.islink(out) else f"it holds {', '.join(foreign[:3])}"
            raise UserError(f"--out {out} is not a CTranslate2 model folder ({why}): --force replaces only an "
                            "empty folder or one export-ct2 wrote")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise UserError(f"--out: folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise UserError(f"--out: folder {parent} is not writable")


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


# --------------------------------------------------------------------------------------------- decoding


# fairseq generation options CTranslate2 has an exact counterpart for (mapped by ct2_decoding), and those that
# cannot change the best hypothesis of a translation model's beam search (printing, non-autoregressive models' own)
MAPPED = {"beam", "lenpen", "unnormalized", "max_len_a", "max_len_b", "min_len", "no_repeat_ngram_size"}
NEUTRAL = {"nbest", "print_step", "print_alignment", "decoding_format", "no_seed_provided", "no_early_stop",
           "no_beamable_mm", "iter_decode_eos_penalty", "iter_decode_max_iter", "iter_decode_force_max_iter",
           "iter_decode_with_beam", "iter_decode_with_external_reranker", "retain_iter_history", "sacrebleu",
           "eos_token"}


def refused_generation_options(generation_cfg) -> List[str]:
    """fairseq generation options set away from their defaults that CTranslate2's beam search cannot apply."""
    from fairseq.dataclass.configs import GenerationConfig

    default = GenerationConfig()
    refused = []
    for f in dataclasses.fields(GenerationConfig):
        if f.name in MAPPED or f.name in NEUTRAL:
            continue
        value = getattr(generation_cfg, f.name, getattr(default, f.name))
        if value != getattr(default, f.name):
            refused.append(f"--{f.name.replace('_', '-')} {value}")
    return refused


def ct2_decoding(generation_cfg) -> Dict:
    """translate_batch's options for fairseq's beam search with these generation options (max_decoding_length is
    set per batch by max_length); anything CTranslate2 cannot apply exactly is refused in one line."""
    refused = refused_generation_options(generation_cfg)
    if refused:
        raise UserError(f"CTranslate2 cannot decode as fairseq does with {', '.join(refused)}")
    return {"beam_size": int(generation_cfg.beam),
            "length_penalty": 0.0 if generation_cfg.unnormalized else float(generation_cfg.lenpen),
            "min_decoding_length": int(generation_cfg.min_len),
            "no_repeat_ngram_size": int(generation_cfg.no_repeat_ngram_size),
            "max_input_length": 0, "num_hypotheses": 1}


def max_length(generation_cfg, src_width: int, model_max_positions: int) -> int:
    """fairseq's cap on the hypothesis length (tokens before EOS): a x the batch's padded source width + b, at most
    the decoder's positions - 1 (SequenceGenerator)."""
    return min(int(generation_cfg.max_len_a * src_width + generation_cfg.max_len_b), model_max_positions - 1)


def target_prefix(task) -> List[str]:
    """The tokens fairseq forces at the start of every hypothesis under this task, for CTranslate2's target_prefix:
    the multilingual task's target language token (--decoder-langtok); a task whose decoding CTranslate2 cannot
    reproduce (mBART's language token as EOS, a language token replacing BOS) is refused in one line."""
    from fairseq.tasks.translation_from_pretrained_bart import TranslationFromPretrainedBARTTask

    if isinstance(task, TranslationFromPretrainedBARTTask):
        raise UserError("CTranslate2 cannot decode as translation_from_pretrained_bart (mBART) does: it starts and "
                        "ends every hypothesis with the target language token instead of EOS")
    args = getattr(task, "args", None)
    langtoks = getattr(args, "langtoks", None)
    if not langtoks or not hasattr(task, "data_manager"):
        return []
    _, spec = langtoks["main"]
    if not spec:
        return []
    if getattr(args, "lang_tok_replacing_bos_eos", False):
        raise UserError("CTranslate2 cannot decode with --lang-tok-replacing-bos-eos (the language token as BOS)")
    return [task.target_dictionary[task.data_manager.get_decoder_langtok(args.target_lang, spec)]]


def source_prefix(task) -> List[str]:
    """The tokens fairseq puts before every source sentence under this task: the multilingual task's encoder
    language token (--encoder-langtok); none under translation."""
    args = getattr(task, "args", None)
    langtoks = getattr(args, "langtoks", None)
    if not langtoks or not hasattr(task, "data_manager"):
        return []
    spec, _ = langtoks["main"]
    if not spec:
        return []
    index = task.data_manager.get_encoder_langtok(args.source_lang, args.target_lang, spec)
    return [] if index is None else [task.source_dictionary[index]]


def deployable_settings(loaded, generator) -> Dict:
    """What the deployable folder carries (compress.deployable): the tokenization, the language tokens, the symbols
    fairseq-generate strips from its output and the decoding options; refused in one line before any work."""
    task = loaded.task
    prefix = target_prefix(task)
    stripped = [task.target_dictionary[i] for i in sorted(getattr(generator, "symbols_to_strip_from_output", None)
                                                          or ())]
    return deployable.settings(loaded.cfg, ct2_decoding(loaded.cfg.generation), source_prefix(task), prefix,
                               stripped + prefix, loaded.model.decoder.max_positions())


def check_batches(loaded, subset: str, n: int):
    """The first n sentences of the subset (by id), batched as fairseq-generate batches (--max-tokens,
    --batch-size, sorted by length), without dropping any."""
    from fairseq import utils

    dataset = load_subset(loaded, subset)
    ids = np.arange(min(n, len(dataset)), dtype=np.int64)
    # (source, target) sizes through fairseq's size(): the multilingual task's ConcatDataset has no src_sizes
    sizes = np.array([[int(s or 0) for s in dataset.size(int(i))] for i in ids], dtype=np.int64).reshape(-1, 2)
    ids = ids[np.lexsort((ids, sizes[:, 1], sizes[:, 0]))]  # by source length, then target, as fairseq
    max_positions = utils.resolve_max_positions(loaded.task.max_positions(), loaded.model.max_positions())
    too_long = [int(i) for i in ids if not all(s <= m for s, m in zip(dataset.size(i), max_positions))]
    if too_long:
        raise UserError(f"sentence {too_long[0]} of '{subset}' is too long for the model's positions")
    cfg = loaded.cfg.dataset
    groups = dataset.batch_by_size(ids, max_tokens=cfg.max_tokens, max_sentences=cfg.batch_size,
                                   required_batch_size_multiple=1)
    return [dataset.collater([dataset[int(i)] for i in group]) for group in groups]


@torch.no_grad()
def fairseq_hypotheses(evaluator, samples) -> Dict[int, List[int]]:
    """fairseq-generate's best hypothesis per sentence id, as token ids without the final EOS."""
    task, model = evaluator.loaded.task, evaluator.loaded.model
    eos = task.target_dictionary.eos()
    out = {}
    for sample in samples:
        for sid, nbest in zip(sample["id"].tolist(), task.inference_step(evaluator.generator, [model], sample)):
            tokens = nbest[0]["tokens"].tolist()
            out[sid] = tokens[:-1] if tokens and tokens[-1] == eos else tokens
    return out


def ct2_hypotheses(translator, loaded, samples, decoding: Dict) -> Dict[int, List[int]]:
    """CTranslate2's best hypothesis per sentence id (token ids), decoding the same batches with fairseq's
    per-batch length cap and the tokens the task forces first (target_prefix)."""
    src_dict, tgt_dict = loaded.task.source_dictionary, loaded.task.target_dictionary
    prefix = target_prefix(loaded.task)
    max_positions = loaded.model.decoder.max_positions()
    out = {}
    for sample in samples:
        tokens = sample["net_input"]["src_tokens"]
        sources = []
        for row in tokens.tolist():
            row = [t for t in row if t != src_dict.pad()]
            if not row or row[-1] != src_dict.eos():
                raise UserError("a source sentence does not end with EOS: CTranslate2 appends it itself")
            sources.append([src_dict[t] for t in row[:-1]])
        cap = max_length(loaded.cfg.generation, tokens.size(1), max_positions)
        results = translator.translate_batch(sources, max_decoding_length=cap, **decoding,
                                             target_prefix=[list(prefix) for _ in sources] if prefix else None)
        for sid, result in zip(sample["id"].tolist(), results):
            out[sid] = [tgt_dict.index(t) for t in result.hypotheses[0]]
    return out


def length_cause(loaded, samples, reference: Dict[int, List[int]], other: Dict[int, List[int]]) -> str:
    """Why hypotheses differ when a binding length limit explains it: at beam > 1 fairseq and CTranslate2 end a
    hypothesis cut at --max-len-a/--max-len-b differently (at beam 1 they agree); "" when no differing hypothesis
    reaches the limit."""
    gen = loaded.cfg.generation
    max_positions = loaded.model.decoder.max_positions()
    capped = 0
    for sample in samples:
        cap = max_length(gen, sample["net_input"]["src_tokens"].size(1), max_positions)
        capped += sum(1 for sid in sample["id"].tolist() if reference[sid] != other[sid]
                      and max(len(reference[sid]), len(other[sid])) >= cap)
    if not capped or int(gen.beam) == 1:
        return ""
    return (f"; {capped} of them reach the length limit (--max-len-a {gen.max_len_a:g} --max-len-b "
            f"{gen.max_len_b}), which the two engines apply differently at --beam {gen.beam} (they agree at beam 1): "
            "raise --max-len-b")


def compare(evaluator, reference: Dict[int, List[int]], other: Dict[int, List[int]]) -> Dict:
    """How many hypotheses differ, and the BLEU of both on the slice (detokenised as fairseq-generate's D- lines)."""
    tgt_dict, post = evaluator.loaded.task.target_dictionary, evaluator.post_process
    ids = sorted(reference)

    def text(tokens):
        return evaluator.detokenize(tgt_dict.string(torch.tensor(tokens, dtype=torch.long), post, escape_unk=True))

    refs = [evaluator.references[i] for i in ids]
    bleu = lambda hyps: round(float(evaluator.bleu_metric().corpus_score(hyps, [refs]).score), 2)  # noqa: E731
    return {"sentences": len(ids), "differing": sum(reference[i] != other[i] for i in ids),
            "bleu_fairseq": bleu([text(reference[i]) for i in ids]), "bleu_ct2": bleu([text(other[i]) for i in ids]),
            "agreement": token_agreement([reference[i] for i in ids], [other[i] for i in ids])}


def token_agreement(reference: List[List[int]], other: List[List[int]]) -> float:
    """BLEU (0-100) of one engine's hypotheses against another's as the references, on token ids: 100 when they
    are the same; what int8 kernels, which round differently on each CPU, keep of fairseq's translations."""
    words = lambda hyps: [" ".join(map(str, h)) for h in hyps]  # noqa: E731
    score = sacrebleu.BLEU(tokenize="none").corpus_score(words(other), [words(reference)]).score
    return round(float(score), 2)


# --------------------------------------------------------------------------------------------- the command


def _translator(folder: str, compute_type: str = "default"):
    import ctranslate2

    return ctranslate2.Translator(folder, device="cpu", compute_type=compute_type, inter_threads=1,
                                  intra_threads=int(os.environ.get("OMP_NUM_THREADS", "1") or 1))


def _replace_folder(staged: str, out: str) -> None:
    """Put the staged model folder in place of `out` whole: the old one (with --force) is moved aside first and
    removed only once the new one is in place."""
    old = None
    if os.path.exists(out):
        old = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(out)), prefix=".old-ct2-")
        os.rmdir(old)
        os.rename(out, old)
    os.rename(staged, out)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def build_task_vmap(loaded, options: ExportOptions, folder: str) -> Tuple[str, Dict]:
    """The vocabulary map of the loaded task's training pairs (options.vocab_map_subsets of its data), written in
    `folder`: its path and what it holds."""
    cfg = loaded.task.cfg  # the task's own, with the language pair it inferred from the data
    src, tgt = getattr(cfg, "source_lang", None), getattr(cfg, "target_lang", None)
    if not src or not tgt:
        raise UserError("--vocab-map needs the language pair (-s SRC -t TGT) of the training pairs")
    data = str(cfg.data).split(os.pathsep)[0]
    path = os.path.join(folder, VMAP_FILE)
    source, target = loaded.task.source_dictionary, loaded.task.target_dictionary
    stats = build_vmap(path, [(data, subset, src, tgt) for subset in options.vocab_map_subsets], vocabulary(source),
                       vocabulary(target), [source.pad(), source.eos(), source.bos()], options.vocab_map_options)
    return path, stats


def export(loaded, evaluator, options: ExportOptions, subset: str) -> Dict:
    """Build the spec, check it against fairseq on the first `check_sentences` sentences of `subset`, then write
    the model folder whole. Returns what the command prints (and the benchmark records)."""
    options.check()
    decoding = ct2_decoding(loaded.cfg.generation)
    # a task CTranslate2 cannot decode as fairseq does, a tokenization the folder cannot carry: refused before work
    settings = deployable_settings(loaded, evaluator.generator)
    activation = getattr(loaded.saved_cfg.model, "activation_fn", None) or "relu"
    start = time.perf_counter()
    spec = build_spec(loaded.model, loaded.task.source_dictionary, loaded.task.target_dictionary, activation)
    parent = os.path.dirname(os.path.abspath(options.out))
    staging = tempfile.mkdtemp(dir=parent, prefix=".ct2-export-")
    try:
        float_dir = os.path.join(staging, "float32")
        write_model(spec, float_dir, None)
        samples = check_batches(loaded, subset, options.check_sentences)
        reference = fairseq_hypotheses(evaluator, samples)
        enc_heads, dec_heads = stack_heads(loaded.model)
        float_hyps = ct2_hypotheses(_translator(float_dir), loaded, samples, decoding)
        info = {"encoder_heads": enc_heads, "decoder_heads": dec_heads,
                "float32": compare(evaluator, reference, float_hyps)}
        share = info["float32"]["differing"] / max(info["float32"]["sentences"], 1)
        if share > options.max_differing:
            cause = length_cause(loaded, samples, reference, float_hyps)
            raise UserError(f"the exported model's float32 hypotheses differ from fairseq's on "
                            f"{info['float32']['differing']} of {info['float32']['sentences']} sentences (more than "
                            f"--max-differing {options.max_differing}){cause}: nothing written")
        final = float_dir
        vmap = None
        if options.vocab_map:
            vmap, info["vocab_map"] = build_task_vmap(loaded, options, staging)
        if options.quantization not in (None, "float32") or vmap:
            final = os.path.join(staging, options.quantization or "float32-vmap")
            spec = build_spec(loaded.model, loaded.task.source_dictionary, loaded.task.target_dictionary, activation)
            write_model(spec, final, options.quantization, vmap)
            translator = _translator(final)
            plain = ct2_hypotheses(translator, loaded, samples, decoding)
            if options.quantization not in (None, "float32"):
                info[options.quantization] = compare(evaluator, reference, plain)
            if vmap:  # the same model restricted by its map: what the map changes
                mapped = ct2_hypotheses(translator, loaded, samples, {**decoding, **translate_options(final)})
                change = compare(evaluator, plain, mapped)
                info["vocab_map"].update(sentences=change["sentences"], differing=change["differing"],
                                         bleu_without=change["bleu_fairseq"], bleu_with=change["bleu_ct2"])
        info["deployable"] = [deployable.SETTINGS, deployable.GUIDE, *settings["files"]]
        deployable.write(final, settings)  # the tokenizer's files and settings beside the model
        check_output_folder(options.out, options.force, options.inputs)  # as checked before the work began
        _replace_folder(final, options.out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    info["seconds"] = round(time.perf_counter() - start, 1)
    info["quantization"] = options.quantization or "float32"
    info["out"] = options.out
    return info
