#!/usr/bin/env bash
# The README's first command: score every head of the bundled De-En model on its bundled test slice
# (Multi30k test2016, 1000 sentences). Nothing is downloaded and ../shared is not needed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PWD/.venv/bin:$PATH OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
MODEL=checkpoints/de-en
SLICE=data/multi30k-test2016/test
OUT=work/demo
[ -f "$MODEL/model.pt" ] || { echo "demo: error: $MODEL/model.pt is missing" >&2; exit 2; }
[ -f "$OUT/data-bin/test.de-en.de.bin" ] || bash data_prep/encode-for-model.sh "$MODEL" de en "$SLICE" "$OUT/data-bin" test
fairseq-headprune score "$OUT/data-bin" --path "$MODEL/model.pt" --gen-subset test --max-tokens 4000 \
  --results-dir "$OUT/results"
echo "demo: importance of all 144 heads in $OUT/results/importance.json"
