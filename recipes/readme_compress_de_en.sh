#!/usr/bin/env bash
# The README's compress line, as written, on the bundled De-En model: the line (and the DEC it reads) taken from
# README.md by tools/documented_commands.py, its placeholders replaced (DATA: WORK/data-bin from
# recipes/compress_de_en_data.sh; model.pt and MODEL_DIR: checkpoints/de-en), nothing else changed, run in WORK
# (so its small/ is WORK/small/). Its log: WORK/readme-line.log.
# usage: [MULTI30K=DIR] recipes/readme_compress_de_en.sh [WORK]   (work/compress-de-en; resumable: rerun it)
# Budget: about 50 CPU minutes on one core (the first line printed says it from measured rates).
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-work/compress-de-en}
export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1 TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
recipes/compress_de_en_data.sh "$work"
model=$(realpath --relative-to="$work" checkpoints/de-en)
line=$(python tools/documented_commands.py README.md --starting "fairseq-headprune compress" --assignments \
  --set DATA=data-bin --set model.pt="$model/model.pt" --set MODEL_DIR="$model")
[ "$(grep -c '^fairseq-headprune compress' <<< "$line")" = 1 ] || { echo "$0: README.md holds not one compress line" >&2; exit 2; }
cd "$work"
printf '%s\n' "$line" | tee -a readme-line.log
bash -c "$line" 2>&1 | tee -a readme-line.log
