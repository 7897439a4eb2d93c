#!/usr/bin/env bash
# Multi30k German->English for the bundled De-En model: Moses tokenisation (sacremoses, cased, aggressive
# dash splits, with Moses' XML escapes such as &apos;, sacremoses' default), joint BPE learned on the training set (subword-nmt), fairseq binarisation with
# a joined dictionary. Out-of-domain test sets (Bible, LibreOffice help, IWSLT14) are encoded with the same BPE.
#
# usage: data_prep/prepare-multi30k.sh [SHARED_DATA_DIR] [OUT_DIR] [BPE_MERGES]
set -euo pipefail
DATA=${1:-../shared/data}
OUT=${2:-data-bin/multi30k_de_en}
MERGES=${3:-6000}
TMP=$OUT/prep
SRC=de; TGT=en
VENV_BIN=$(dirname "$(readlink -f "$0")")/../.venv/bin
[ -x "$VENV_BIN/sacremoses" ] && export PATH=$VENV_BIN:$PATH

die() { echo "prepare-multi30k: error: $*" >&2; exit 2; }
for f in train.$SRC train.$TGT val.$SRC val.$TGT test_2016_flickr.$SRC test_2016_flickr.$TGT; do
  [ -f "$DATA/multi30k/$f" ] || die "missing $DATA/multi30k/$f (pass the shared data folder as first argument)"
done
mkdir -p "$TMP"

tok() { sacremoses -q -l "$1" -j 2 tokenize -a < "$2" > "$3"; }
# split name -> raw file prefix (raw files are read, never modified)
declare -A RAW=(
  [train]=$DATA/multi30k/train
  [valid]=$DATA/multi30k/val
  [test]=$DATA/multi30k/test_2016_flickr
  [test_bible]=$DATA/bible_de_en/test
  [valid_libreoffice]=$DATA/libreoffice_help_en_de/valid
)
for split in "${!RAW[@]}"; do
  [ -f "${RAW[$split]}.$SRC" ] || { echo "skipping $split: ${RAW[$split]}.$SRC not found" >&2; continue; }
  for l in $SRC $TGT; do
    [ -s "$TMP/$split.tok.$l" ] || tok $l "${RAW[$split]}.$l" "$TMP/$split.tok.$l"
    cp "${RAW[$split]}.$l" "$TMP/$split.raw.$l"   # detokenised references for sacreBLEU
  done
done

if [ ! -s "$OUT/code" ]; then
  echo "learning $MERGES joint BPE merges" >&2
  cat "$TMP/train.tok.$SRC" "$TMP/train.tok.$TGT" | subword-nmt learn-bpe -s "$MERGES" > "$OUT/code"
fi
for f in "$TMP"/*.tok.*; do
  b=$(basename "$f"); out="$TMP/${b/.tok./.bpe.}"
  [ -s "$out" ] || subword-nmt apply-bpe -c "$OUT/code" < "$f" > "$out"
done
# IWSLT14 test is lowercased and already Moses-tokenised with the same XML escapes as our training text:
# only the BPE step applies
if [ -f "$DATA/iwslt14/tok/test.$SRC" ]; then
  for l in $SRC $TGT; do
    subword-nmt apply-bpe -c "$OUT/code" < "$DATA/iwslt14/tok/test.$l" > "$TMP/test_iwslt14.bpe.$l"
    cp "$DATA/iwslt14/tok/test.$l" "$TMP/test_iwslt14.raw.$l"
  done
fi

testprefs=$TMP/test.bpe
for extra in test_bible valid_libreoffice test_iwslt14; do
  [ -f "$TMP/$extra.bpe.$SRC" ] && testprefs="$testprefs,$TMP/$extra.bpe"
done
fairseq-preprocess --source-lang $SRC --target-lang $TGT --joined-dictionary \
  --trainpref "$TMP/train.bpe" --validpref "$TMP/valid.bpe" --testpref "$testprefs" \
  --destdir "$OUT" --workers 2 > "$OUT/preprocess.log"
echo "binarised data in $OUT (subsets: test = Multi30k test2016, then test1, test2, ... = ${testprefs#*,})" >&2
