"""`fairseq-headprune export-ct2 DATA --path CKPT --out DIR`: a CTranslate2 model of any checkpoint this package
reads or writes (stock, `remove`d, `shrink`ed, folded-out gates), checked against fairseq before it is written.

  fairseq-headprune export-ct2 DATA --path CKPT --out DIR [--quantization int8] [--force] \\
      [--gen-subset test --check-sentences 100 --beam 5 --bpe subword_nmt --bpe-codes CODE --references REF]

DIR also holds what goes from raw text to raw text (compress.deployable: the tokenizer's settings and files, the
language tokens, a README): `fairseq-headprune translate DIR < raw.txt`.

The check decodes the first --check-sentences sentences of --gen-subset with fairseq and with the exported model
under the same decoding options (beam, lenpen, max/min length): float32 hypotheses are compared token by token;
with --quantization, the BLEU of both is printed. DIR is written whole or not at all; --force replaces only an empty
folder or a CTranslate2 model folder (never DATA, the folder holding --path, or a folder holding other files).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from fairseq_headprune.cli.common import options_from, readable_file
from fairseq_headprune.errors import UserError
from fairseq_headprune.options import add_arguments, option
from fairseq_headprune.prune.export import ExportOptions, export
from fairseq_headprune.engines.ct2 import ct2_decoding
from fairseq_headprune.decoding.evaluate import SubsetEvaluator
from fairseq_headprune.fairseq_io.loading import load


@dataclass
class ExportCommand:
    """export-ct2's options beside ExportOptions': the references of the check's BLEU."""

    references: Optional[str] = option(None, flag="--references",
                                       help="raw reference file of --gen-subset for BLEU (default: the binarised "
                                            "targets)")


def add_args(parser) -> None:
    g = parser.add_argument_group("export-ct2")
    add_arguments(g, ExportOptions)  # its nested VocabMapOptions too
    add_arguments(g, ExportCommand)


def command_inputs(cfg, references: Optional[str]) -> tuple:
    """Every path the command reads (DATA folders, checkpoints, references): --out may be none of them."""
    paths = (getattr(cfg.task, "data", None) or "").split(os.pathsep) + (cfg.common_eval.path or "").split(os.pathsep)
    return tuple(p for p in paths + [references] if p)


def run(cfg, args) -> None:
    references = options_from(ExportCommand, args).references
    options = options_from(ExportOptions, args, inputs=command_inputs(cfg, references))
    options.check()
    ct2_decoding(cfg.generation)  # refuses decoding options CTranslate2 cannot apply, before any loading
    task_name = str(getattr(cfg.task, "_name", "") or "")
    if task_name.startswith("translation_from_pretrained_bart"):  # engines.ct2.target_prefix, before loading
        raise UserError("CTranslate2 cannot decode as translation_from_pretrained_bart (mBART) does: it starts and "
                        "ends every hypothesis with the target language token instead of EOS")
    readable_file("--references", references)

    loaded = load(cfg)
    evaluator = SubsetEvaluator(loaded, cfg.dataset.gen_subset, references)
    info = export(loaded, evaluator, options, cfg.dataset.gen_subset)
    f32 = info["float32"]
    print(f"CTranslate2 heads per stack: encoder {info['encoder_heads']}, decoder {info['decoder_heads']}")
    print(f"float32 check on {f32['sentences']} sentences of '{cfg.dataset.gen_subset}': {f32['differing']} "
          f"hypotheses differ from fairseq's; BLEU fairseq {f32['bleu_fairseq']:.2f}, "
          f"CTranslate2 {f32['bleu_ct2']:.2f}")
    if info["quantization"] != "float32":
        q = info[info["quantization"]]
        print(f"{info['quantization']}: {q['differing']} hypotheses differ; BLEU fairseq {q['bleu_fairseq']:.2f}, "
              f"CTranslate2 {info['quantization']} {q['bleu_ct2']:.2f}")
    if "vocab_map" in info:
        m = info["vocab_map"]
        print(f"vocabulary map: {m['source_tokens']} source tokens x {m['per_source']} candidates + {m['always']} "
              f"always, from {m['sentence_pairs']} training pairs; with it {m['differing']} of {m['sentences']} "
              f"hypotheses change, BLEU {m['bleu_without']:.2f} -> {m['bleu_with']:.2f}")
    print(f"wrote {info['out']} ({info['quantization']}) in {info['seconds']:.1f} s, with "
          f"{', '.join(info['deployable'])}: fairseq-headprune translate {info['out']} < raw.txt")
