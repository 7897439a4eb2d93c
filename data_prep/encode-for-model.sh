#!/usr/bin/env bash
# Encode a raw parallel text for an existing model: Moses tokenisation (sacremoses), the model's BPE codes,
# binarisation with the model's dictionaries. The raw target is kept beside the binary for sacreBLEU.
#
# usage: data_prep/encode-for-model.sh MODEL_DIR SRC_LANG TGT_LANG RAW_PREFIX OUT_DIR [SPLIT] [--tokenized]
#   MODEL_DIR holds code, dict.SRC.txt and dict.TGT.txt; RAW_PREFIX.SRC and RAW_PREFIX.TGT are the text;
#   SPLIT is the fairseq subset name (default test); --tokenized skips tokenisation (already Moses-tokenised text).
set -euo pipefail
die() { echo "encode-for-model: error: $*" >&2; exit 2; }
[ $# -ge 5 ] || die "usage: encode-for-model.sh MODEL_DIR SRC_LANG TGT_LANG RAW_PREFIX OUT_DIR [SPLIT] [--tokenized]"
MODEL=$1; SRC=$2; TGT=$3; RAW=$4; OUT=$5; SPLIT=${6:-test}; TOKENIZED=${7:-}
VENV_BIN=$(dirname "$(readlink -f "$0")")/../.venv/bin
[ -x "$VENV_BIN/sacremoses" ] && export PATH=$VENV_BIN:$PATH
for f in "$MODEL/code" "$MODEL/dict.$SRC.txt" "$MODEL/dict.$TGT.txt" "$RAW.$SRC" "$RAW.$TGT"; do
  [ -f "$f" ] || die "missing $f"
done
n_src=$(wc -l < "$RAW.$SRC"); n_tgt=$(wc -l < "$RAW.$TGT")
[ "$n_src" = "$n_tgt" ] || die "$RAW.$SRC has $n_src lines but $RAW.$TGT has $n_tgt"
mkdir -p "$OUT/prep"
for l in $SRC $TGT; do
  if [ "$TOKENIZED" = "--tokenized" ]; then cp "$RAW.$l" "$OUT/prep/$SPLIT.tok.$l"
  else sacremoses -q -l "$l" -j 2 tokenize -a < "$RAW.$l" > "$OUT/prep/$SPLIT.tok.$l"; fi
  subword-nmt apply-bpe -c "$MODEL/code" < "$OUT/prep/$SPLIT.tok.$l" > "$OUT/prep/$SPLIT.bpe.$l"
  cp "$RAW.$l" "$OUT/$SPLIT.raw.$l"
done
# binarise into a folder of its own, then move: fairseq-preprocess names its output test.*, which would overwrite
# a test subset already in OUT when another split is encoded into the same folder
TMP_BIN=$OUT/prep/bin-$SPLIT
rm -rf "$TMP_BIN"
fairseq-preprocess --source-lang "$SRC" --target-lang "$TGT" --srcdict "$MODEL/dict.$SRC.txt" \
  --tgtdict "$MODEL/dict.$TGT.txt" --testpref "$OUT/prep/$SPLIT.bpe" --destdir "$TMP_BIN" --workers 1 \
  > "$OUT/prep/preprocess.log" 2>&1 || die "fairseq-preprocess failed: see $OUT/prep/preprocess.log"
for ext in bin idx; do for l in $SRC $TGT; do
  mv "$TMP_BIN/test.$SRC-$TGT.$l.$ext" "$OUT/$SPLIT.$SRC-$TGT.$l.$ext"; done; done
for l in $SRC $TGT; do cp "$TMP_BIN/dict.$l.txt" "$OUT/dict.$l.txt"; done
rm -rf "$TMP_BIN"
echo "encoded $n_src sentence pairs into $OUT (subset $SPLIT)" >&2
