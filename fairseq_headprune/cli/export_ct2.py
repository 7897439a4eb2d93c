"""`fairseq-headprune export-ct2 DATA --path CKPT --out DIR`: a CTranslate2 model of any checkpoint this package
reads or writes (stock, `remove`d, `shrink`ed, folded-out gates), checked against fairseq before it is written.

  fairseq-headprune export-ct2 DATA --path CKPT --out DIR [--quantization int8] [--force] \\
      [--gen-subset test --check-sentences 100 --beam 5 --bpe subword_nmt --bpe-codes CODE --references REF]

The check decodes the first --check-sentences sentences of --gen-subset with fairseq and with the exported model
under the same decoding options (beam, lenpen, max/min length): float32 hypotheses are compared token by token;
with --quantization, the BLEU of both is printed. DIR is written whole or not at all; --force replaces only an empty
folder or a CTranslate2 model folder (never DATA, the folder holding --path, or a folder holding other files).
"""
from __future__ import annotations

import os

from fairseq_headprune.cli.common import options_from, readable_file
from fairseq_headprune.compress.vocab_map import VocabMapOptions
from fairseq_headprune.options import add_arguments
from fairseq_headprune.errors import UserError
from fairseq_headprune.compress.export import QUANTIZATIONS, ExportOptions, ct2_decoding, export
from fairseq_headprune.decoding.evaluate import SubsetEvaluator
from fairseq_headprune.fairseq_io.loading import load


def add_args(parser) -> None:
    g = parser.add_argument_group("export-ct2")
    g.add_argument("--out", required=True, metavar="DIR", help="the CTranslate2 model folder to write")
    g.add_argument("--quantization", metavar="TYPE",
                   help=f"weight type of the written model: {', '.join(QUANTIZATIONS)} (default: float32)")
    g.add_argument("--force", action="store_true",
                   help="replace an existing --out folder: an empty one or a CTranslate2 model folder only")
    g.add_argument("--check-sentences", type=int, default=100,
                   help="sentences of --gen-subset (the first ones) both engines translate before writing")
    g.add_argument("--max-differing", type=float, default=0.05,
                   help="share of float32 hypotheses allowed to differ from fairseq's (float rounding) before the "
                        "export is refused")
    g.add_argument("--references", help="raw reference file of --gen-subset for BLEU (default: the binarised targets)")
    g.add_argument("--vocab-map", action="store_true",
                   help="write a vocabulary map (vmap.txt, translated with use_vmap) built from DATA's train pairs: "
                        "the output layer scores only the target words the batch's source words bring in")
    add_arguments(g, VocabMapOptions)


def command_inputs(cfg, args) -> tuple:
    """Every path the command reads (DATA folders, checkpoints, references): --out may be none of them."""
    paths = (getattr(cfg.task, "data", None) or "").split(os.pathsep) + (cfg.common_eval.path or "").split(os.pathsep)
    return tuple(p for p in paths + [args.references] if p)


def run(cfg, args) -> None:
    options = options_from(ExportOptions, args, inputs=command_inputs(cfg, args))
    options.check()
    ct2_decoding(cfg.generation)  # refuses decoding options CTranslate2 cannot apply, before any loading
    task_name = str(getattr(cfg.task, "_name", "") or "")
    if task_name.startswith("translation_from_pretrained_bart"):  # compress.export.target_prefix, before loading
        raise UserError("CTranslate2 cannot decode as translation_from_pretrained_bart (mBART) does: it starts and "
                        "ends every hypothesis with the target language token instead of EOS")
    readable_file("--references", args.references)

    loaded = load(cfg)
    evaluator = SubsetEvaluator(loaded, cfg.dataset.gen_subset, args.references)
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
    print(f"wrote {info['out']} ({info['quantization']}) in {info['seconds']:.1f} s")
