#!/usr/bin/env bash
# The data folder of the De-En compress recipes (recipes/compress_de_en.sh, recipes/readme_compress_de_en.sh):
# WORK/data-bin, binarised with the bundled model's dictionaries and BPE (the splits: compress_de_en.sh's header).
# usage: [MULTI30K=DIR] recipes/compress_de_en_data.sh WORK   (resumable: a split already binarised is kept)
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:?usage: recipes/compress_de_en_data.sh WORK}
export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
data=${MULTI30K:-../shared/data/multi30k} model=checkpoints/de-en bin=$work/data-bin
for f in train val test_2016_flickr; do
  [ -f "$data/$f.de" ] && [ -f "$data/$f.en" ] || { echo "$0: no Multi30k $f.{de,en} in $data (set MULTI30K=DIR)" >&2; exit 2; }
done
mkdir -p "$work/raw"
for l in de en; do
  [ -f "$work/raw/train.$l" ] || head -n -1000 "$data/train.$l" > "$work/raw/train.$l"
  [ -f "$work/raw/traintail.$l" ] || tail -n 1000 "$data/train.$l" > "$work/raw/traintail.$l"
  [ -f "$work/raw/valid.$l" ] || tail -n +501 "$data/val.$l" > "$work/raw/valid.$l"
  [ -f "$work/raw/val500.$l" ] || head -n 500 "$data/val.$l" > "$work/raw/val500.$l"
  [ -f "$work/raw/test.$l" ] || cp "$data/test_2016_flickr.$l" "$work/raw/test.$l"
done
for split in train traintail valid val500 test; do
  [ -f "$bin/$split.de-en.en.idx" ] ||
    bash data_prep/encode-for-model.sh "$model" de en "$work/raw/$split" "$bin" "$split" > "$work/encode-$split.log" 2>&1
done
