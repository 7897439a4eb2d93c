#!/usr/bin/env bash
# `compress --speedup 1.5` on the bundled De-En model, as results/compress-de-en was made: Multi30k train minus its
# last 1000 sentences (kept out of calibration and recovery, as recipes/depth_de_en.sh does), val for early stopping
# and timing, test2016 decoded once at the end; every other option at its default.
#
# usage: recipes/compress_de_en.sh [WORK] [SPEEDUP]   (work/compress-de-en, 1.5). Resumable: rerun the same command.
# Budget: about 50 CPU minutes on one core (the first line printed says it from measured rates).
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-work/compress-de-en} speedup=${2:-1.5}
export PATH=$PWD/.venv/bin:$PATH OMP_NUM_THREADS=1 TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
data=../shared/data/multi30k
fhp=${FHP:-fairseq-headprune}  # another build of the command (a snapshot of the tree) for long runs
mkdir -p "$work/raw"
for l in de en; do
  [ -f "$work/raw/heldout.$l" ] || { head -n -1000 "$data/train.$l" > "$work/raw/train.$l"
                                      tail -n 1000 "$data/train.$l" > "$work/raw/heldout.$l"; }
done
for split in train:$work/raw/train heldout:$work/raw/heldout valid:$data/val test:$data/test_2016_flickr; do
  [ -f "$work/data-bin/${split%%:*}.de-en.en.idx" ] ||
    bash data_prep/encode-for-model.sh checkpoints/de-en de en "${split#*:}" "$work/data-bin" "${split%%:*}"
done
$fhp compress "$work/data-bin" --path checkpoints/de-en/model.pt -s de -t en --out "$work/de-en-$speedup" \
  --speedup "$speedup" --engine ct2-int8 --gen-subset test --beam 5 --batch-size 64 \
  --references "$work/data-bin/test.raw.en" --tokenizer moses --bpe subword_nmt --bpe-codes checkpoints/de-en/code \
  2>&1 | tee -a "$work/de-en-$speedup.log"
