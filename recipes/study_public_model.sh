#!/usr/bin/env bash
# The head studies of a public multilingual fairseq checkpoint, M2M-100 418M (fairseq's examples/m2m_100), on one
# language pair, with the exact fairseq arguments that model needs. Nothing downloads: fetch its files yourself
# (https://github.com/facebookresearch/fairseq/tree/main/examples/m2m_100: 418M_last_checkpoint.pt,
# model_dict.128k.txt, data_dict.128k.txt, spm.128k.model, language_pairs_small_models.txt) into $M2M, put plain
# text valid.$SRC valid.$TGT test.$SRC test.$TGT (one sentence a line) into $RAW, then
#
#   M2M=~/m2m100 RAW=~/raw SRC=de TGT=fr bash recipes/study_public_model.sh [STAGE ...]
#
# Stages: prepare score single-loss keep-one prune shrink analyze (the default: what one CPU core can do), and
# single-bleu speed (asked by name: a GPU's work). Each writes into $OUT; a missing file stops it in one line.
# The file names can be overridden (CKPT, MODEL_DICT, DATA_DICT, SPM_MODEL, LANG_PAIRS): the test suite runs this
# recipe on a tiny multilingual model of the same task (tests/test_families.py).
#
# What each stage costs for M2M-100 418M (12+12 layers, d=1024, 16 heads: 576 heads, FFN 4096, 128k vocabulary),
# N=500 test sentences of ~30 tokens. Not measured on M2M itself (nothing downloads here): FLOPs are counted
# with fairseq_headprune/core/flops.py (29 GFLOPs per sentence decoded greedily, 109 at beam 5: 6,700-6,900x the tiny
# multilingual test model), and turned into time with this machine's measured float32 matrix-product rate on one
# core (86 GFLOP/s); that is a lower bound, fairseq's per-step overhead comes on top. On a GPU divide the FLOPs by
# its own rate (not measured here).
#
#   stage        work                                            FLOPs     one CPU core
#   score        1 forward+backward of valid (N)                 ~4e13     ~8 min
#   single-loss  577 teacher-forced passes of valid (N)          ~4e15     ~13 h  (each from its masked layer up)
#   keep-one     576 teacher-forced passes + 36 decodes, beam 5  ~6e15     ~19 h  (selection by NLL)
#   prune        11 decodes at beam 5 (0-100% by 10%)            ~6e14     ~2 h
#   shrink       calibration N sentences + 1 decode check        ~1e14     ~20 min
#   analyze      200 sentences decoded, then propagated (LRP)    >2e13     >4 min (the decode alone)
#   single-bleu  577 decodes of test at beam 5                   ~3e16     ~4 days: SKIP on a CPU, use single-loss
#   speed        3 models x 4 batch sizes x 3 runs x 128 sent.   ~5e14     ~1.6 h; a GPU's measurement
#
# A CPU user runs the default stages on a smaller N (N=100 divides each line by 5) and reads single-head effects
# by NLL (single-loss), not by BLEU.
set -euo pipefail

M2M=${M2M:-m2m100}
RAW=${RAW:-raw}
SRC=${SRC:-de}
TGT=${TGT:-fr}
OUT=${OUT:-results/m2m100-418m-$SRC-$TGT}
N=${N:-500}
CKPT=${CKPT:-$M2M/418M_last_checkpoint.pt}
MODEL_DICT=${MODEL_DICT:-$M2M/model_dict.128k.txt}
DATA_DICT=${DATA_DICT:-$M2M/data_dict.128k.txt}
SPM_MODEL=${SPM_MODEL:-$M2M/spm.128k.model}
LANG_PAIRS=${LANG_PAIRS:-$M2M/language_pairs_small_models.txt}
BIN=${BIN:-$(dirname "$0")/../.venv/bin}
STAGES=${*:-prepare score single-loss keep-one prune shrink analyze}

fail() { echo "study_public_model.sh: error: $*" >&2; exit 2; }
need() { [ -f "$1" ] || fail "missing $2: $1"; }
need "$CKPT" "the checkpoint (CKPT)"
need "$MODEL_DICT" "the model's fixed dictionary (MODEL_DICT, --fixed-dictionary)"
need "$DATA_DICT" "the data dictionary (DATA_DICT, fairseq-preprocess --srcdict/--tgtdict)"
need "$SPM_MODEL" "the sentencepiece model (SPM_MODEL, --sentencepiece-model)"
need "$LANG_PAIRS" "the language pairs file (LANG_PAIRS, --lang-pairs)"
for split in valid test; do for lang in "$SRC" "$TGT"; do need "$RAW/$split.$lang" "raw text"; done; done

DATA=$OUT/data-bin
mkdir -p "$OUT"
# fairseq's M2M-100 generation arguments (examples/m2m_100/README.md), with --bpe sentencepiece so that BLEU is
# computed by sacreBLEU on detokenised text
FAIRSEQ=("$DATA" --path "$CKPT" --task translation_multi_simple_epoch --lang-pairs "$LANG_PAIRS"
         --fixed-dictionary "$MODEL_DICT" --encoder-langtok src --decoder-langtok -s "$SRC" -t "$TGT"
         --bpe sentencepiece --sentencepiece-model "$SPM_MODEL" --max-tokens 4000 --results-dir "$OUT")
BLEU=(--gen-subset test --beam 5 --references "$OUT/test.ref.$TGT")

for stage in $STAGES; do
  echo "== $stage" >&2
  case $stage in
    prepare)  # the first N sentences of each split, sentencepiece-encoded, binarised with the data dictionary
      for split in valid test; do
        for lang in "$SRC" "$TGT"; do
          head -n "$N" "$RAW/$split.$lang" > "$OUT/$split.raw.$lang"
          "$BIN/python" -c 'import sys, sentencepiece as s; p = s.SentencePieceProcessor(model_file=sys.argv[1])
for line in open(sys.argv[2], encoding="utf-8"): print(" ".join(p.encode(line.rstrip("\n"), out_type=str)))' \
            "$SPM_MODEL" "$OUT/$split.raw.$lang" > "$OUT/$split.spm.$lang"
        done
      done
      cp "$OUT/test.raw.$TGT" "$OUT/test.ref.$TGT"
      "$BIN/fairseq-preprocess" --source-lang "$SRC" --target-lang "$TGT" --validpref "$OUT/valid.spm" \
        --testpref "$OUT/test.spm" --thresholdsrc 0 --thresholdtgt 0 --srcdict "$DATA_DICT" --tgtdict "$DATA_DICT" \
        --destdir "$DATA" --workers 1 ;;
    score) "$BIN/fairseq-headprune" score "${FAIRSEQ[@]}" --gen-subset valid ;;
    single-loss) "$BIN/fairseq-headprune" ablate "${FAIRSEQ[@]}" --mode single --metric loss --gen-subset valid ;;
    keep-one) "$BIN/fairseq-headprune" ablate "${FAIRSEQ[@]}" --mode keep-one --metric loss --select-subset valid \
                --report-subset test --report-metric bleu --report-references "$OUT/test.ref.$TGT" --beam 5 ;;
    prune) "$BIN/fairseq-headprune" prune "${FAIRSEQ[@]}" "${BLEU[@]}" --order importance \
             --importance "$OUT/importance.json" ;;
    shrink) "$BIN/fairseq-headprune" shrink "${FAIRSEQ[@]}" --gen-subset test --remove 50% \
              --calibration-subset valid --calibration-sentences "$N" --out "$OUT/m2m100-418m-50.pt" ;;
    analyze) "$BIN/fairseq-headprune" analyze "${FAIRSEQ[@]}" --gen-subset test --beam 5 --num-sentences 200 \
               --importance "$OUT/importance.json" ;;
    single-bleu) "$BIN/fairseq-headprune" ablate "${FAIRSEQ[@]}" "${BLEU[@]}" --mode single ;;
    speed) [ -n "${SPEED_HEADS:-}" ] || fail "the speed stage needs SPEED_HEADS: the heads to prune (spec or @file)"
           "$BIN/fairseq-headprune" speed "${FAIRSEQ[@]}" --gen-subset test --beam 5 --heads "$SPEED_HEADS" ;;
    *) fail "unknown stage '$stage' (prepare score single-loss keep-one prune shrink analyze single-bleu speed)" ;;
  esac
done
