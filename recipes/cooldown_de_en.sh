#!/usr/bin/env bash
# The De-En recipe's second phase: the run of recipes/train_de_en.sh continued at a constant low learning rate
# (DE_EN_COOLDOWN_ARGS in recipes/de_en_train_args.sh: lr 1e-4, no warm-up) until the valid loss stops improving.
#
# Why: inverse-sqrt never anneals. After 19 epochs (valid loss still falling by 0.005-0.015 an epoch) the model
# gained +0.61 test2016 BLEU from the lambda = 0 control, which is 300 updates at lr 1e-4: mostly the annealing the
# schedule never did (results/de-en/convergence/). Pruning studies fine-tune at that lr, so a model they can be
# judged on has to be converged at it. Every epoch checkpoint is kept in the same folder, numbered on from phase
# one, so the training-dynamics study sees one run.
#
# usage: recipes/cooldown_de_en.sh [WORK] [MAX_EPOCH] [PATIENCE]   (work/de-en, 25, 2)
# Resumable: rerun the same command. Budget: about 6 minutes an epoch on both cores, 9-13 on one core shared.
set -euo pipefail
main() {
  cd "$(dirname "$0")/.."
  local work=${1:-work/de-en} max_epoch=${2:-25} patience=${3:-2}
  export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=PASSIVE
  export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
  [ -f "$work/checkpoints/checkpoint_last.pt" ] || {
    echo "cooldown_de_en: error: no $work/checkpoints/checkpoint_last.pt: run recipes/train_de_en.sh first" >&2; exit 2; }
  source recipes/de_en_train_args.sh
  grep -q "== cool-down phase" "$work/train.log" ||
    echo "== cool-down phase (recipes/cooldown_de_en.sh): ${DE_EN_COOLDOWN_ARGS[*]} from checkpoint_last.pt ==" \
      >> "$work/train.log"
  fairseq-train "$work/data-bin" --user-dir fairseq_headprune --task translation_headprune --arch transformer \
    "${DE_EN_COOLDOWN_BASE[@]}" "${DE_EN_COOLDOWN_ARGS[@]}" --max-epoch "$max_epoch" --patience "$patience" \
    --save-dir "$work/checkpoints" --save-interval 1 --keep-last-epochs -1 \
    --tensorboard-logdir '' 2>&1 | tee -a "$work/train.log"
}
main "$@"
