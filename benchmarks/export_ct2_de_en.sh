#!/usr/bin/env bash
# The bundled De-En model exported to CTranslate2 and checked on ALL of Multi30k test2016 at beam 5: how many float32
# hypotheses differ from fairseq's (token ids), the BLEU of both, and int8's BLEU; then the export as a user runs it
# (the default 100-sentence check) timed on one thread. Output: results/deploy-de-en/export-check.txt
#   usage: benchmarks/export_ct2_de_en.sh   (needs work/de-en-test: see README "Bundled model")
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
BIN=.venv/bin
DATA=work/de-en-test
[ -f "$DATA/test.de-en.de.bin" ] || bash data_prep/encode-for-model.sh checkpoints/de-en de en \
  data/multi30k-test2016/test "$DATA" test
OUT=results/deploy-de-en
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
COMMON=("$DATA" --path checkpoints/de-en/model.pt --gen-subset test --beam 5 --batch-size 64
        --bpe subword_nmt --bpe-codes checkpoints/de-en/code --tokenizer moses -s de -t en
        --references "$DATA/test.raw.en")
{
  echo "# $(date -u +%FT%TZ) ctranslate2 $($BIN/python -c 'import ctranslate2; print(ctranslate2.__version__)'), one thread"
  echo "## all 1000 sentences of test2016, beam 5: float32 compared token by token, then int8"
  $BIN/fairseq-headprune export-ct2 "${COMMON[@]}" --check-sentences 1000 --quantization int8 --out "$TMP/int8"
  echo "## the export as a user runs it (default check: the first 100 sentences), wall time"
  /usr/bin/time -f "wall %e s, CPU %U+%S s" $BIN/fairseq-headprune export-ct2 "${COMMON[@]}" --out "$TMP/f32" 2>&1
} | tee "$OUT/export-check.txt"
