#!/usr/bin/env bash
# `compress` on the bundled De-En model (results/compress-de-en), every option at its default but the data:
#   train      Multi30k train minus its last 1000 sentences (calibration and recovery)
#   valid      Multi30k val minus its first 500 sentences (514: early stopping, timing; --max-bleu-loss's choice)
#   test       test2016, decoded once, at the end
#   val500     the first 500 sentences of val: the second reported set, held out of every choice and every
#              training run of the compression (the bundled model never trained on them; its checkpoint was picked
#              on all of val); decoded once, at the end
#   traintail  the last 1000 train sentences: held out of calibration and recovery, but the bundled model trained on
#              them, so their scores are training-set scores (--teacher-trained-on: the card says so); decoded once,
#              at the end, for what they show
#
# usage: [MULTI30K=DIR] recipes/compress_de_en.sh [WORK] [TARGET]   (work/compress-de-en, "--speedup 1.5").
# MULTI30K: a folder with Multi30k's train.{de,en}, val.{de,en} and test_2016_flickr.{de,en} (default
# ../shared/data/multi30k). Resumable: rerun it.
# Budget: about 50 CPU minutes a target on one core (the first line printed says it from measured rates); the
# recovery uses OMP_NUM_THREADS threads when set (default 1; every timing runs on one).
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-work/compress-de-en} target=${2:---speedup 1.5}
export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
recipes/compress_de_en_data.sh "$work"
model=checkpoints/de-en bin=$work/data-bin
name=$(echo "$target" | tr -d ' %-' | tr ./ _- | tr := --)
# shellcheck disable=SC2086
fairseq-headprune compress "$bin" --path "$model/model.pt" -s de -t en --out "$work/de-en-$name" $target --engine ct2-int8 \
  --gen-subset test --references "$bin/test.raw.en" --also-report val500,traintail --teacher-trained-on traintail \
  --also-references "$bin/val500.raw.en,$bin/traintail.raw.en" --beam 5 --batch-size 64 \
  --tokenizer moses --bpe subword_nmt --bpe-codes "$model/code" ${STOP:+--stop-after $STOP} \
  2>&1 | tee -a "$work/de-en-$name.log"
