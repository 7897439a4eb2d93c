"""Decoding in CTranslate2 as fairseq-generate decodes: the translate_batch options of fairseq's generation options
(anything CTranslate2 cannot apply exactly refused in one line), fairseq's per-batch length cap, the language tokens
a task forces, one-thread translators of models written by engines.ct2_spec, and fairseq's batches translated once,
timed. Under the multilingual task the target language token fairseq forces first is CTranslate2's target prefix
(target_prefix); mBART's task, which ends hypotheses on the language token, is refused.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from dataclasses import replace
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_headprune.core.shape import ModelShape
from fairseq_headprune.engines.ct2_spec import build_spec, stack_heads, write_model
from fairseq_headprune.errors import UserError

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


# tasks whose decoding CTranslate2 repeats: translation from the source tokens alone, the multilingual task with its
# language tokens (the encoder's in the source, the decoder's as CTranslate2's target prefix); each also as its
# _headprune twin
CT2_TASKS = ("translation", "translation_multi_simple_epoch")
MBART_TASK = "translation_from_pretrained_bart"


def check_task(task_cfg, command: str = "deploy", instead: str = "") -> None:
    """Refuse, in one line naming the command (and what to do `instead`), a task whose hypotheses CTranslate2 would
    not repeat."""
    name = task_cfg.get("_name") if hasattr(task_cfg, "get") else getattr(task_cfg, "_name", None)
    base = (name or "").removesuffix("_headprune")
    if base == MBART_TASK:
        raise UserError(f"{command}: CTranslate2 cannot decode as {MBART_TASK} (mBART) does: it starts and ends "
                        f"every hypothesis with the target language token instead of EOS{instead}")
    if base not in CT2_TASKS:
        raise UserError(f"{command} runs CTranslate2 under {' and '.join(CT2_TASKS)} only, not {name}{instead}")


def check_compute_type(compute_type: str) -> None:
    """A compute type this machine's CTranslate2 runs on the CPU, or one line saying which it runs."""
    import ctranslate2  # optional heavy dependency: CTranslate2

    supported = sorted(ctranslate2.get_supported_compute_types("cpu"))
    if compute_type not in supported:
        raise UserError(f"--compute-type {compute_type}: CTranslate2 runs {', '.join(supported)} on this CPU")


# --------------------------------------------------------------------------------------------- models and translators


VMAP_FILE = "vmap.txt"  # the name CTranslate2 gives the vocabulary map inside a model folder


def translate_options(folder: str) -> Dict:
    """translate_batch's options for a CTranslate2 folder: a folder holding a vocabulary map is translated with
    it, as `ct2-translator --use_vmap` would."""
    return {"use_vmap": True} if os.path.exists(os.path.join(folder, VMAP_FILE)) else {}


def ct2_shape(model) -> ModelShape:
    """The shape CTranslate2 runs for `model`: every layer at its stack's largest head count (padded)."""
    shape = ModelShape.of(model)
    enc, dec = stack_heads(model)
    return replace(shape, heads={k: enc if k[0] == "enc-self" else dec for k in shape.heads})


def model_activation(loaded) -> str:
    """The activation of the loaded checkpoint's model (fairseq's name; relu when its config names none)."""
    return getattr(loaded.saved_cfg.model, "activation_fn", None) or "relu"


def write_ct2_model(loaded, model, folder: str, quantization: Optional[str], target_dictionary=None,
                    pad_to: Optional[Tuple[int, int]] = None, vocab_map: Optional[str] = None) -> str:
    """`model` (loaded's own, or a pruned or cut one with its cut `target_dictionary`) written as a CTranslate2 model
    into a new folder (quantization None: float32; `pad_to`: engines.ct2_spec.build_spec's; `vocab_map`: a
    vmap.txt shipped with it); the folder."""
    task = loaded.task
    spec = build_spec(model, task.source_dictionary, target_dictionary or task.target_dictionary,
                      model_activation(loaded), pad_to)
    write_model(spec, folder, quantization, vocab_map)
    return folder


def environment_threads() -> int:
    """The threads OMP_NUM_THREADS allows (1 when unset)."""
    return int(os.environ.get("OMP_NUM_THREADS", "1") or 1)


RESIDENT_PROBE = """
import os, sys
import ctranslate2
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
before = resident()
translator = ctranslate2.Translator(sys.argv[1], device="cpu", compute_type=sys.argv[2], intra_threads=int(sys.argv[3]))
translator.translate_batch([["."]], max_decoding_length=2)
print(resident() - before)
"""


def resident_bytes(folder: str, compute_type: str, threads: int) -> Optional[int]:
    """The memory a CTranslate2 model holds once loaded and run (resident set after a one-sentence translation,
    less the process's before loading it), in a process of its own; None where /proc is not there."""
    if not os.path.exists("/proc/self/statm"):
        return None
    proc = subprocess.run([sys.executable, "-c", RESIDENT_PROBE, folder, compute_type, str(threads)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"measuring the resident size of {folder}: {proc.stderr.strip().splitlines()[-1:]}")
    return int(proc.stdout.split()[-1])


def instruction_set() -> str:
    """The widest vector instruction set the CPU offers, as CTranslate2's CPU kernels dispatch on it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return "unknown"
    for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sse4_1", "SSE4.1")):
        if flag in flags:
            return name
    return "unknown"


def translator(folder: str, compute_type: str, threads: int):
    """A CPU translator of a CTranslate2 model folder: one batch at a time, `threads` threads within it."""
    import ctranslate2  # optional heavy dependency: CTranslate2

    return ctranslate2.Translator(folder, device="cpu", compute_type=compute_type, inter_threads=1,
                                  intra_threads=threads)


def ct2_translator(loaded, model, folder: str, quantization: Optional[str], target_dictionary=None,
                   vocab_map: Optional[str] = None, threads: int = 1):
    """`model` written as a CTranslate2 model into a new folder (write_ct2_model), and a translator of it on
    `threads` threads."""
    write_ct2_model(loaded, model, folder, quantization, target_dictionary, vocab_map=vocab_map)
    return translator(folder, quantization or "float32", threads)


# --------------------------------------------------------------------------------------------- translating batches


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


def ct2_run(translator_, loaded, decoding: Dict, samples, forced: int = 0) -> Dict:
    """Decode fairseq's batches with CTranslate2 once: seconds and each sentence's hypothesis (the ids of `loaded`'s
    target dictionary: CTranslate2 writes words, so a model with a cut vocabulary maps back as well)."""
    src_dict, tgt_dict = loaded.task.source_dictionary, loaded.task.target_dictionary
    prefix = target_prefix(loaded.task)  # the multilingual task's target language token
    decoding = dict(decoding)
    if forced:  # the same L + 1 steps as fairseq's L tokens and EOS
        decoding["min_decoding_length"] = forced + 1
    positions = loaded.model.decoder.max_positions()
    batches = []
    for sample in samples:  # prepared before the clock starts: fairseq's batches are ready-made too
        tokens = sample["net_input"]["src_tokens"]
        sources = [[src_dict[t] for t in row if t not in (src_dict.pad(), src_dict.eos())] for row in tokens.tolist()]
        cap = forced + 1 if forced else max_length(loaded.cfg.generation, tokens.size(1), positions)
        batches.append((sample["id"].tolist(), sources, cap))
    out = {}
    start = time.perf_counter()
    for ids, sources, cap in batches:
        results = translator_.translate_batch(sources, max_decoding_length=cap, **decoding,
                                              target_prefix=[list(prefix) for _ in sources] if prefix else None)
        for sid, result in zip(ids, results):
            out[sid] = result.hypotheses[0]
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "hypotheses": {sid: [tgt_dict.index(t) for t in h] for sid, h in out.items()}}


def timed_translation(translator_, batches, decoding: Dict, cap, prefix: Sequence[str] = ()) -> Dict:
    """Translate the batches once; seconds, sentences, tokens (EOS not counted) and the hypotheses.
    `cap(batch)` is each batch's max_decoding_length (fairseq's max-len-a/b rule, or a forced length); `prefix`
    the tokens fairseq forces first (the multilingual task's target language token)."""
    hypotheses = []
    start = time.perf_counter()
    for batch in batches:
        results = translator_.translate_batch(list(batch), max_decoding_length=cap(batch), **decoding,
                                              target_prefix=[list(prefix) for _ in batch] if prefix else None)
        hypotheses += [tuple(r.hypotheses[0]) for r in results]
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "sentences": len(hypotheses), "tokens": sum(len(h) for h in hypotheses),
            "hypotheses": hypotheses}


def fairseq_cap(loaded):
    """fairseq-generate's per-batch length cap for source token lists (padded width = longest source + EOS)."""
    generation, positions = loaded.cfg.generation, loaded.model.decoder.max_positions()
    return lambda batch: max_length(generation, max(len(s) for s in batch) + 1, positions)

