#!/bin/bash
# The deployment table for the bundled De-En model (results/deploy-de-en/): the unpruned model, deploy's own
# per-stack 50% shrink, and the shrunk and recovered models of the recover study (recipes/recover_de_en.sh, WORK):
# free and per-stack shapes, closed-form fits and the window fit, each recovered by `recover`'s defaults (-eN: the
# epochs its recover ran, read from its record; the checkpoint is the one of lowest valid loss). The decoder-only
# per-stack shapes: 8/4 (tdps50: 50% of the decoder's heads) and 8/3 (tdps62: 62.5%), the latter as `recover
# --epochs 4` hands it back (its run went on to 6 epochs: checkpoint4.pt is that model). The candidate the targets
# judge was chosen on Multi30k val before test2016 was decoded: the 8/3 model of 4 epochs (val 41.84; 6 epochs 41.66,
# lr 3e-4 41.83, the layer distillation 41.15: results/recover-de-en/README.md).
# BLEU on Multi30k test2016 (1000 sentences), speed in fairseq and CTranslate2 float32/int8, one thread.
# CEILINGS="8/4 8/3 ..." adds `deploy --ceilings`: shapes timed as crude slices of the unpruned model (int8, equal
# work), what each lever would buy; CEILINGS=grid is the grid below (results/deploy-de-en/ceilings/: OUT=that
# CEILINGS=grid RUNS=3, alone on the machine, after `recover_de_en.sh WORK f` rebuilt the candidate).
#   [RUNS=2] [OUT=DIR] [CEILINGS=...] bash recipes/deploy_de_en.sh [WORK]   (about 12 minutes a round
#   on one free core)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1 TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
WORK=${1:-work/recover}
OUT=${OUT:-results/deploy-de-en}
source recipes/recovered_label.sh
# 8/8 is the unpruned shape timed as a ceiling (its ratio is the measurement's own error); then heads per stack, the
# FFN's hidden units, and the output layer: 58% of the vocabulary is the share of the joint De-En dictionary's 6048
# words that ever occur in the English training references (3499; the rest are German-only words)
GRID="8/8 8/6 8/5 8/4 8/3 8/2 4/8 4/4 8/4:ffn=75% 8/4:ffn=50% 8/8:ffn=50% 8/8:vocab=58% 8/4:vocab=58% 8/3:vocab=58%"
[ "${CEILINGS:-}" = grid ] && CEILINGS=$GRID
compare=()
for item in shrink-50=shrink-50 rt50-w1000=runs/rt50-w1000-3e-4 rtps50-w1000=runs/rtps50-w1000-3e-4 \
            rtdps50-w1000=runs/rtdps50-w1000-3e-4 rtdps62-w1000-e4=runs/rtdps62-w1000-3e-4.recover/checkpoint4; do
  path="$WORK/${item#*=}.pt"
  if [ -f "$path" ]; then compare+=("${item%%=*}$(recovered_label "$path")=$path")
  else echo "deploy_de_en: skipping ${item%%=*}: no $path"; fi
done
fairseq-headprune deploy "$WORK/data-bin" --path checkpoints/de-en/model.pt --gen-subset test \
  --references "$WORK/data-bin/test.raw.en" --results-dir "$OUT" --shrink-percent 50 --calibration-subset valid \
  --compare "${compare[@]}" --candidate rtdps62-w1000-e4 --runs "${RUNS:-2}" --beam 5 --batch-size 64 \
  --bpe subword_nmt --bpe-codes checkpoints/de-en/code --tokenizer moses -s de -t en ${CEILINGS:+--ceilings $CEILINGS}
