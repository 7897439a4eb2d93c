#!/usr/bin/env bash
# MTNT v1.1 English->French (noisy Reddit text) encoded for an existing En->Fr model: its BPE codes and its
# dictionaries (data_prep/encode-for-model.sh, which Moses-tokenises with sacremoses), so that a model trained on
# one data set (e.g. WMT14, data_prep/prepare-wmt14en2fr.sh) is tested on another. Subsets valid and test; the
# raw references are kept beside the binaries as {valid,test}.raw.{en,fr} for sacreBLEU.
#
# usage: data_prep/prepare-mtnt.sh MODEL_DIR OUT_DIR [MTNT_DIR]
#   MODEL_DIR  holds code, dict.en.txt and dict.fr.txt (a model folder, or the OUT_DIR of prepare-wmt14en2fr.sh)
#   MTNT_DIR   holds {valid,test}.en-fr.{en,fr}, or {valid,test}.en-fr.tsv (id, English, French) from which they
#              are split (default: ../shared/data/mtnt beside the project)
set -euo pipefail
PROG=prepare-mtnt
die() { echo "$PROG: error: $*" >&2; exit 2; }
USAGE="usage: prepare-mtnt.sh MODEL_DIR OUT_DIR [MTNT_DIR]"
HERE=$(dirname "$(readlink -f "$0")")
SRC=en; TGT=fr
case ${1:-} in -h|--help) echo "$USAGE"; exit 0 ;; esac
[ $# -ge 2 ] && [ $# -le 3 ] || die "$USAGE"
MODEL=$1; OUT=$2; MTNT=${3:-$(readlink -m "$HERE/../../shared/data/mtnt")}

[ -d "$MODEL" ] || die "missing model folder $MODEL"
for f in code dict.$SRC.txt dict.$TGT.txt; do
  [ -s "$MODEL/$f" ] || die "model folder $MODEL has no $f (needs code, dict.$SRC.txt, dict.$TGT.txt)"
done
[ -d "$MTNT" ] || die "missing MTNT folder $MTNT"

mkdir -p "$OUT/prep"
for split in valid test; do   # valid first: encode-for-model.sh binarises into test.* before renaming
  raw=$MTNT/$split.en-fr
  if [ ! -f "$raw.$SRC" ] && [ ! -f "$raw.$TGT" ] && [ -f "$raw.tsv" ]; then
    # id <TAB> English <TAB> French; a line with another number of fields is an error
    awk -F '\t' -v out="$OUT/prep/mtnt.$split" -v src=$SRC -v tgt=$TGT '
      NF != 3 { printf "%s line %d has %d tab-separated fields, not 3 (id, %s, %s)\n", FILENAME, NR, NF, src, tgt; exit 3 }
      { print $2 > (out "." src); print $3 > (out "." tgt) }' "$raw.tsv" > "$OUT/prep/tsv.err" \
      || die "$(cat "$OUT/prep/tsv.err")"
    raw=$OUT/prep/mtnt.$split
  fi
  for l in $SRC $TGT; do [ -f "$raw.$l" ] || die "missing $raw.$l (or $MTNT/$split.en-fr.tsv)"; done
  n_src=$(sed -e '$a\' "$raw.$SRC" | wc -l); n_tgt=$(sed -e '$a\' "$raw.$TGT" | wc -l)
  [ "$n_src" = "$n_tgt" ] || die "$raw.$SRC has $n_src lines but $raw.$TGT has $n_tgt"
  [ "$n_src" -gt 0 ] || die "$raw.$SRC is empty"
  bash "$HERE/encode-for-model.sh" "$MODEL" $SRC $TGT "$raw" "$OUT" $split 2> "$OUT/prep/encode-$split.log" \
    || die "encode-for-model.sh failed for $split: $(tail -n 1 "$OUT/prep/encode-$split.log")"
done
echo "MTNT $SRC-$TGT encoded for $MODEL into $OUT: valid=$(wc -l < "$OUT/valid.raw.$SRC") test=$(wc -l < "$OUT/test.raw.$SRC") (raw references: $OUT/{valid,test}.raw.{$SRC,$TGT})" >&2
