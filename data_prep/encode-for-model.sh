#!/usr/bin/env bash
# Encode a raw parallel text for an existing model with the model's own tokenizer, and binarise it with the model's
# dictionaries. The raw target is kept beside the binary for sacreBLEU.
#
# usage: data_prep/encode-for-model.sh MODEL_DIR SRC_LANG TGT_LANG RAW_PREFIX OUT_DIR [SPLIT] [--tokenized]
#   MODEL_DIR holds the model's tokenizer and dictionaries, one of:
#   - `code`, dict.SRC.txt and dict.TGT.txt: Moses tokenisation (sacremoses) and the subword-nmt BPE codes (the
#     bundled models, fairseq's WMT14 releases);
#   - fastBPE codes, dict.SRC.txt and dict.TGT.txt: Moses tokenisation as above, then the codes applied by the
#     `fastBPE` module (`make setup` builds it) as fairseq's --bpe fastbpe applies them: the WMT'19 releases, whose
#     `bpecodes` is read when the folder has no `code` (FASTBPE=FILE names another file);
#   - a SentencePiece model (spm.model, or the folder's one *.model file: M2M-100's spm.128k.model, NLLB's
#     sentencepiece.bpe.model; SPM=FILE names another) and dict.SRC.txt with dict.TGT.txt, or the one dictionary
#     of both sides the release ships (DICT=FILE: M2M-100's data_dict.128k.txt, NLLB's dictionary.txt): the text
#     cut into the model's pieces as fairseq's scripts/spm_encode.py does (--output_format piece), no Moses; the
#     language tokens are the task's (--encoder-langtok, --decoder-langtok), not the data's.
#   RAW_PREFIX.SRC and RAW_PREFIX.TGT are the text; SPLIT is the fairseq subset name (default test); --tokenized:
#   the text is tokenised already (Moses-tokenised; in SentencePiece mode, already in pieces).
set -euo pipefail
die() { echo "encode-for-model: error: $*" >&2; exit 2; }
[ $# -ge 5 ] || die "usage: encode-for-model.sh MODEL_DIR SRC_LANG TGT_LANG RAW_PREFIX OUT_DIR [SPLIT] [--tokenized]"
MODEL=$1; SRC=$2; TGT=$3; RAW=$4; OUT=$5; SPLIT=${6:-test}; TOKENIZED=${7:-}
VENV_BIN=$(dirname "$(readlink -f "$0")")/../.venv/bin
[ -x "$VENV_BIN/sacremoses" ] && export PATH=$VENV_BIN:$PATH
[ -d "$MODEL" ] || die "no such model folder: $MODEL"
SPM_MODEL=${SPM:-}; FASTBPE_CODES=${FASTBPE:-}
[ -z "$SPM_MODEL" ] || [ -z "$FASTBPE_CODES" ] || die "SPM= and FASTBPE= name two tokenizers: give one"
if [ -z "$SPM_MODEL$FASTBPE_CODES" ] && [ ! -f "$MODEL/code" ]; then
  if [ -f "$MODEL/bpecodes" ]; then
    # fastBPE's codes have a count on each line; a WMT14 release's bpecodes (subword-nmt) has none
    [ "$(awk 'NR == 1 {print NF; exit}' "$MODEL/bpecodes")" = 3 ] || die "$MODEL/bpecodes is not fastBPE codes" \
      "(LEFT RIGHT COUNT a line): subword-nmt codes (fairseq's WMT14 releases) go in as $MODEL/code"
    FASTBPE_CODES=$MODEL/bpecodes
  elif [ -f "$MODEL/spm.model" ]; then SPM_MODEL=$MODEL/spm.model
  else
    models=("$MODEL"/*.model)
    [ -f "${models[0]}" ] || die "$MODEL holds neither BPE codes (code) nor a SentencePiece model (*.model) nor" \
      "fastBPE codes (bpecodes)"
    [ ${#models[@]} = 1 ] || die "$MODEL holds ${#models[@]} SentencePiece models: name one with SPM=FILE"
    SPM_MODEL=${models[0]}
  fi
fi
SRC_DICT=${DICT:-$MODEL/dict.$SRC.txt}; TGT_DICT=${DICT:-$MODEL/dict.$TGT.txt}
if [ -n "$SPM_MODEL" ] && [ -z "${DICT:-}" ] && { [ ! -f "$SRC_DICT" ] || [ ! -f "$TGT_DICT" ]; }; then
  die "$MODEL has no dict.$SRC.txt and dict.$TGT.txt: name the release's dictionary of both sides with DICT=FILE"
fi
for f in "${SPM_MODEL:-${FASTBPE_CODES:-$MODEL/code}}" "$SRC_DICT" "$TGT_DICT" "$RAW.$SRC" "$RAW.$TGT"; do
  [ -f "$f" ] || die "missing $f"
done
# fairseq's scripts/spm_encode.py --output_format piece, one line in, one line out
SPM_ENCODE='
import sys
import sentencepiece
pieces = sentencepiece.SentencePieceProcessor(model_file=sys.argv[1])
for line in sys.stdin:
    print(" ".join(pieces.encode(line.rstrip("\n"), out_type=str)))
'
# fairseq's --bpe fastbpe (fastBPE.apply), one line in, one line out; codes its reader would crash on are one line
FASTBPE_ENCODE='
import os
import sys
def die(message):
    sys.stderr.write(f"encode-for-model: error: {message}\n")
    sys.exit(2)
try:
    import fastBPE
except ImportError:
    die("the fastBPE module is missing (make setup builds it from its sdist)")
with open(sys.argv[1], "rb") as codes:
    for number, line in enumerate(codes, 1):
        if len(line.rstrip(b"\n").split(b" ")) != 3:
            die(f"{sys.argv[1]} line {number} is not fastBPE codes (LEFT RIGHT COUNT a line)")
saved = os.dup(2)
os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # fastBPE reports its loading on stderr
bpe = fastBPE.fastBPE(sys.argv[1])
os.dup2(saved, 2)
for line in sys.stdin:
    print(bpe.apply([line.rstrip("\n")])[0])
'
[ -z "$FASTBPE_CODES" ] || python -c "$FASTBPE_ENCODE" "$FASTBPE_CODES" < /dev/null  # the codes, before any output
n_src=$(wc -l < "$RAW.$SRC"); n_tgt=$(wc -l < "$RAW.$TGT")
[ "$n_src" = "$n_tgt" ] || die "$RAW.$SRC has $n_src lines but $RAW.$TGT has $n_tgt"
for l in $SRC $TGT; do  # a folder binarised against other dictionaries (another model's DATA) is never mixed into
  given=$([ "$l" = "$SRC" ] && echo "$SRC_DICT" || echo "$TGT_DICT")
  if [ -f "$OUT/dict.$l.txt" ] && ! cmp -s <(awk '{print $1}' "$OUT/dict.$l.txt") <(awk '{print $1}' "$given"); then
    die "$OUT/dict.$l.txt holds other symbols than $given: $OUT is data binarised for another model; name another folder"
  fi
done
mkdir -p "$OUT/prep"
for l in $SRC $TGT; do
  if [ -n "$SPM_MODEL" ]; then
    if [ "$TOKENIZED" = "--tokenized" ]; then cp "$RAW.$l" "$OUT/prep/$SPLIT.bpe.$l"
    else python -c "$SPM_ENCODE" "$SPM_MODEL" < "$RAW.$l" > "$OUT/prep/$SPLIT.bpe.$l"; fi
  else
    if [ "$TOKENIZED" = "--tokenized" ]; then cp "$RAW.$l" "$OUT/prep/$SPLIT.tok.$l"
    else sacremoses -q -l "$l" -j 2 tokenize -a < "$RAW.$l" > "$OUT/prep/$SPLIT.tok.$l"; fi
    if [ -n "$FASTBPE_CODES" ]; then
      python -c "$FASTBPE_ENCODE" "$FASTBPE_CODES" < "$OUT/prep/$SPLIT.tok.$l" > "$OUT/prep/$SPLIT.bpe.$l"
    else subword-nmt apply-bpe -c "$MODEL/code" < "$OUT/prep/$SPLIT.tok.$l" > "$OUT/prep/$SPLIT.bpe.$l"; fi
  fi
  cp "$RAW.$l" "$OUT/$SPLIT.raw.$l"
done
# binarise into a folder of its own, then move: fairseq-preprocess names its output test.*, which would overwrite
# a test subset already in OUT when another split is encoded into the same folder
TMP_BIN=$OUT/prep/bin-$SPLIT
rm -rf "$TMP_BIN"
fairseq-preprocess --source-lang "$SRC" --target-lang "$TGT" --srcdict "$SRC_DICT" \
  --tgtdict "$TGT_DICT" --testpref "$OUT/prep/$SPLIT.bpe" --destdir "$TMP_BIN" --workers 1 \
  > "$OUT/prep/preprocess.log" 2>&1 || die "fairseq-preprocess failed: see $OUT/prep/preprocess.log"
for ext in bin idx; do for l in $SRC $TGT; do
  mv "$TMP_BIN/test.$SRC-$TGT.$l.$ext" "$OUT/$SPLIT.$SRC-$TGT.$l.$ext"; done; done
for l in $SRC $TGT; do cp "$TMP_BIN/dict.$l.txt" "$OUT/dict.$l.txt"; done
rm -rf "$TMP_BIN"
echo "encoded $n_src sentence pairs into $OUT (subset $SPLIT)" >&2
