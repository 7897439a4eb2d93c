#!/bin/bash
# Issue 29's deployment table for the bundled De-En model (results/deploy-de-en/): the unpruned model, deploy's own
# per-stack 50% shrink, and the shrunk and recovered models of the recover study (recipes/recover_de_en.sh, WORK):
# free and per-stack shapes, closed-form fits and the window fit, each recovered by `recover`'s defaults (-eN: the
# epochs its recover ran, read from its record; the checkpoint is the one of lowest valid loss). The decoder-only
# per-stack shapes: 8/4 (tdps50: 50% of the decoder's heads) and 8/3 (tdps62: 62.5%), the latter as `recover
# --epochs 4` hands it back (its run went on to 6 epochs: checkpoint4.pt is that model). The candidate the targets
# judge was chosen on Multi30k val before test2016 was decoded: the 8/3 model of 4 epochs (val 41.84; 6 epochs 41.66,
# lr 3e-4 41.83, the layer distillation 41.15: results/recover-de-en/README.md).
# BLEU on Multi30k test2016 (1000 sentences), speed in fairseq and CTranslate2 float32/int8, one thread.
#   [RUNS=2] [FHP=command] bash recipes/deploy_de_en.sh [WORK]   (about 12 minutes a round on one free core)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PWD/.venv/bin:$PATH OMP_NUM_THREADS=1 TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
WORK=${1:-work/recover}
OUT=${OUT:-results/deploy-de-en}
source recipes/recovered_label.sh
compare=()
for item in shrink-50=shrink-50 rt50-w1000=runs/rt50-w1000-3e-4 rtps50-w1000=runs/rtps50-w1000-3e-4 \
            rtdps50-w1000=runs/rtdps50-w1000-3e-4 rtdps62-w1000-e4=runs/rtdps62-w1000-3e-4.recover/checkpoint4; do
  path="$WORK/${item#*=}.pt"
  if [ -f "$path" ]; then compare+=("${item%%=*}$(recovered_label "$path")=$path")
  else echo "deploy_de_en: skipping ${item%%=*}: no $path"; fi
done
${FHP:-fairseq-headprune} deploy "$WORK/data-bin" --path checkpoints/de-en/model.pt --gen-subset test \
  --references "$WORK/data-bin/test.raw.en" --results-dir "$OUT" --shrink-percent 50 --calibration-subset valid \
  --compare "${compare[@]}" --candidate rtdps62-w1000-e4 --runs "${RUNS:-2}" --beam 5 --batch-size 64 \
  --bpe subword_nmt --bpe-codes checkpoints/de-en/code --tokenizer moses -s de -t en
