#!/usr/bin/env bash
# results/voita/analysis: Voita et al.'s head analysis of the bundled De-En model (confidence, LRP relevance,
# head functions; Sections 4-5) on the first 500 sentences of Multi30k val, beam 5, rare tokens counted on the
# training text, beside Michel et al.'s I_h on the whole val set. About 3-5 minutes of one core; `analyze`
# resumes per batch if killed.
#
# usage: recipes/voita_analysis.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
OUT=${1:-results/voita/analysis}
DATA=${DATA:-../shared/data}
MODEL=checkpoints/de-en
BIN=${BIN:-work/analysis/data-bin}
[ -f "$DATA/multi30k/val.de" ] || { echo "voita_analysis: error: $DATA/multi30k is needed" >&2; exit 2; }
[ -f "$BIN/valid.de-en.de.bin" ] || bash data_prep/encode-for-model.sh "$MODEL" de en "$DATA/multi30k/val" "$BIN" valid
mkdir -p "$OUT"
fairseq-headprune score "$BIN" --path "$MODEL/model.pt" --gen-subset valid --max-tokens 2000 --results-dir "$OUT"
fairseq-headprune analyze "$BIN" --path "$MODEL/model.pt" --gen-subset valid --beam 5 --max-tokens 2000 \
  --num-sentences 500 --results-dir "$OUT" --bpe subword_nmt --bpe-codes "$MODEL/code" --tokenizer moses -s de -t en \
  --frequency-text "$DATA/multi30k/train.de" --importance "$OUT/importance.json"
