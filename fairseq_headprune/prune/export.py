"""Export to CTranslate2 (`fairseq-headprune export-ct2`): any fairseq transformer this package reads or writes,
written through CTranslate2's own spec API (`ctranslate2.specs`), never by editing its files.

Why not CTranslate2's `ct2-fairseq-converter`: it rebuilds the model from the checkpoint's architecture name, so it
refuses `headprune_transformer` (what `remove`, `shrink` and recovered checkpoints are) and needs `args` in the
checkpoint. Here the model is read as loaded, module by module, whatever its heads.

A layer with fewer heads than its stack's maximum is written zero-padded up to it (engines.ct2_spec): the padded
model computes what the pruned one does but costs what its largest layer per stack costs: `shrink --shape
per-stack` gives shapes with nothing to pad.

Before anything is written the exported model translates a slice with CTranslate2 and fairseq alike: float32
token ids are compared one by one, and with quantization the BLEU of both is given; a vocabulary map that costs
more BLEU on that slice than --vocab-map-max-loss is refused (prune.vocab_map.VocabMapBound). Under the multilingual
task the target language token fairseq forces first is CTranslate2's target prefix (target_prefix); mBART's task,
which ends hypotheses on the language token, is refused.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import sacrebleu
import torch

from fairseq_headprune.prune import deployable
from fairseq_headprune.prune.vocab_map import VocabMapBound, VocabMapOptions, build_vmap
from fairseq_headprune.engines.ct2 import (VMAP_FILE, ct2_decoding, ct2_hypotheses, environment_threads, max_length,
                                           source_prefix, target_prefix, translate_options, translator)
from fairseq_headprune.engines.ct2_spec import build_spec, stack_heads, vocabulary, write_model
from fairseq_headprune.engines.fairseq_engine import check_batches, fairseq_hypotheses
from fairseq_headprune.errors import UserError
from fairseq_headprune.options import nested, option

QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")



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
    vocab_map_options: VocabMapOptions = nested(VocabMapOptions, section="vocabulary map")
    vocab_map_bound: VocabMapBound = nested(VocabMapBound, section="vocabulary map")
    vocab_map_subsets: Tuple[str, ...] = ("train",)  # the subsets of DATA whose pairs the map is built from

    def check(self) -> None:
        self.vocab_map_options.check(self.vocab_map)
        self.vocab_map_bound.check(self.vocab_map)
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


# --------------------------------------------------------------------------------------------- the check


def deployable_settings(loaded, generator) -> Dict:
    """What the deployable folder carries (compress.deployable): the tokenization, the language tokens, the symbols
    fairseq-generate strips from its output and the decoding options; refused in one line before any work."""
    task = loaded.task
    prefix = target_prefix(task)
    stripped = [task.target_dictionary[i] for i in sorted(getattr(generator, "symbols_to_strip_from_output", None)
                                                          or ())]
    return deployable.settings(loaded.cfg, ct2_decoding(loaded.cfg.generation), source_prefix(task), prefix,
                               stripped + prefix, loaded.model.decoder.max_positions(),
                               loaded.model.encoder.max_positions())


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


def build_task_vmap(loaded, folder: str, vocab_map_options: VocabMapOptions,
                    subsets: Sequence[str] = ("train",)) -> Tuple[str, Dict]:
    """The vocabulary map of the loaded task's training pairs (`subsets` of its data), written in `folder`: its
    path and what it holds."""
    cfg = loaded.task.cfg  # the task's own, with the language pair it inferred from the data
    src, tgt = getattr(cfg, "source_lang", None), getattr(cfg, "target_lang", None)
    if not src or not tgt:
        raise UserError("--vocab-map needs the language pair (-s SRC -t TGT) of the training pairs")
    data = str(cfg.data).split(os.pathsep)[0]
    path = os.path.join(folder, VMAP_FILE)
    source, target = loaded.task.source_dictionary, loaded.task.target_dictionary
    stats = build_vmap(path, [(data, subset, src, tgt) for subset in subsets], vocabulary(source),
                       vocabulary(target), [source.pad(), source.eos(), source.bos()], vocab_map_options)
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
        float_hyps = ct2_hypotheses(translator(float_dir, "default", environment_threads()), loaded, samples, decoding)
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
            vmap, info["vocab_map"] = build_task_vmap(loaded, staging, options.vocab_map_options,
                                                      options.vocab_map_subsets)
        if options.quantization not in (None, "float32") or vmap:
            final = os.path.join(staging, options.quantization or "float32-vmap")
            spec = build_spec(loaded.model, loaded.task.source_dictionary, loaded.task.target_dictionary, activation)
            write_model(spec, final, options.quantization, vmap)
            written = translator(final, "default", environment_threads())
            plain = ct2_hypotheses(written, loaded, samples, decoding)
            if options.quantization not in (None, "float32"):
                info[options.quantization] = compare(evaluator, reference, plain)
            if vmap:  # the same model restricted by its map: what the map changes
                mapped = ct2_hypotheses(written, loaded, samples, {**decoding, **translate_options(final)})
                change = compare(evaluator, plain, mapped)
                info["vocab_map"].update(sentences=change["sentences"], differing=change["differing"],
                                         bleu_without=change["bleu_fairseq"], bleu_with=change["bleu_ct2"])
                options.vocab_map_bound.judge(info["vocab_map"], subset)  # before anything is written
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
