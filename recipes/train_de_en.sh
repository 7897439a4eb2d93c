#!/usr/bin/env bash
# Train the bundled German->English model (checkpoints/de-en) on Multi30k from ../shared/data, with the shape and
# hyper-parameters of recipes/de_en_train_args.sh.
# Every epoch checkpoint is kept: they are the training-dynamics study's input (recipes/iwslt_dynamics.sh).
# Trained to convergence: early stopping when the valid loss has not improved for PATIENCE epochs (fairseq's
# --patience), then recipes/bundle_checkpoint.py averages the last epochs. Resumable: rerun the same command
# (fairseq restarts from checkpoint_last.pt with its optimizer state).
#
# usage: recipes/train_de_en.sh [SHARED_DATA_DIR] [WORK_DIR] [MAX_EPOCH] [PATIENCE]
set -euo pipefail
# the whole script is one function: bash parses it before running anything, so editing this file while a
# training runs cannot change what the running training does
main() {
  cd "$(dirname "$0")/.."
  local data=${1:-../shared/data} work=${2:-work/de-en} max_epoch=${3:-100} patience=${4:-5}
  export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  local bin=$work/data-bin
  [ -f "$bin/train.de-en.de.bin" ] || bash data_prep/prepare-multi30k.sh "$data" "$bin" 6000
  # One process owns both cores; PASSIVE keeps OpenMP threads from spinning when another process shares the CPU.
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=PASSIVE
  source recipes/de_en_train_args.sh
  fairseq-train "$bin" --user-dir fairseq_headprune --task translation_headprune --arch transformer \
    "${DE_EN_TRAIN_ARGS[@]}" --max-epoch "$max_epoch" --patience "$patience" \
    --save-dir "$work/checkpoints" --save-interval 1 --keep-last-epochs -1 \
    --tensorboard-logdir '' 2>&1 | tee -a "$work/train.log"
}
main "$@"
