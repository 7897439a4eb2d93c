#!/bin/bash
# The deployment table for the bundled En-Fr model: the unpruned model and shrink's 50% models (free and
# per-stack shape) in fairseq, CTranslate2 float32 and int8, BLEU on the first N sentences of newstest2014 (the
# shrink study's test slice), calibration on the first 1000 of newstest2013; beside them the recover study's free and
# decoder-only per-stack (8/4) models, recovered (-eN: N epochs). Resumable: finished steps are skipped.
#   [RUNS=3] bash recipes/deploy_en_fr.sh   (RUNS interleaved timing rounds; about 25 minutes on one free core)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
DATA=${DATA:-../shared/data}
MODEL=checkpoints/en-fr
WORK=${WORK:-work/deploy-en-fr}
OUT=${OUT:-results/deploy-en-fr}
N=${N:-500}
mkdir -p "$WORK/raw"
head -n 1000 "$DATA/wmt14_en_fr/newstest2013.tok.en" > "$WORK/raw/nt13.en"
head -n 1000 "$DATA/wmt14_en_fr/newstest2013.tok.fr" > "$WORK/raw/nt13.fr"
head -n "$N" "$DATA/wmt14_en_fr/newstest2014-fren.en" > "$WORK/raw/nt14.en"
head -n "$N" "$DATA/wmt14_en_fr/newstest2014-fren.fr" > "$WORK/raw/nt14.fr"
[ -f "$WORK/data/valid.en-fr.en.bin" ] || bash data_prep/encode-for-model.sh "$MODEL" en fr "$WORK/raw/nt13" \
  "$WORK/data" valid --tokenized > "$WORK/encode-valid.log"
[ -f "$WORK/data/test.en-fr.en.bin" ] || bash data_prep/encode-for-model.sh "$MODEL" en fr "$WORK/raw/nt14" \
  "$WORK/data" test > "$WORK/encode-test.log"
GEN=(-s en -t fr --max-len-a 1.5 --max-len-b 10 --bpe subword_nmt --bpe-codes "$MODEL/code" --tokenizer moses)
# the free shape beside the per-stack shrink that `deploy` makes itself (same calibration)
[ -f "$WORK/shrink-50-free.pt" ] || fairseq-headprune shrink "$WORK/data" --path "$MODEL/model.pt" "${GEN[@]}" \
  --max-tokens 4000 --remove 50% --calibration-subset valid --calibration-sentences 1000 \
  --out "$WORK/shrink-50-free.pt" > "$WORK/shrink-50-free.log" 2>&1
# the recovered models of the recover study (recipes/recover_en_fr.sh, RECOVER), where they are
RECOVER=${RECOVER:-work/recover-en-fr}
source recipes/recovered_label.sh
compare=("shrink-50=$WORK/shrink-50-free.pt")
# the per-stack model the targets judge, named before the table: the recovered decoder-only shape where it exists
# (the De-En choice carried over; no En-Fr set was left to choose on: newstest2013 calibrates), else deploy's shrink
candidate=shrink-ps50
for item in r50=r50 rdps50-w1000=rdps50-w1000; do
  path="$RECOVER/runs/${item#*=}.pt"
  if [ -f "$path" ]; then
    compare+=("${item%%=*}$(recovered_label "$path")=$path")
    [ "${item%%=*}" != rdps50-w1000 ] || candidate="${item%%=*}$(recovered_label "$path")"
  else echo "deploy_en_fr: skipping ${item%%=*}: no $path"; fi
done
fairseq-headprune deploy "$WORK/data" --path "$MODEL/model.pt" --gen-subset test \
  --references "$WORK/data/test.raw.fr" --results-dir "$OUT" --shrink-percent 50 --calibration-subset valid \
  --calibration-sentences 1000 --compare "${compare[@]}" --candidate "$candidate" --runs "${RUNS:-3}" --beam 5 \
  --batch-size 64 "${GEN[@]}"
