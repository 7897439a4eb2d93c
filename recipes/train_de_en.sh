#!/usr/bin/env bash
# Train the bundled German->English model (checkpoints/de-en) on Multi30k from ../shared/data.
# Shape: the papers' 6+6 layers with 8 heads in every attention (144 heads), scaled to this CPU:
# d_model 256, FFN 512 (the IWSLT model's 512/1024 halved), pre-norm as in Michel et al.'s IWSLT model.
# Every epoch checkpoint is kept: they are the training-dynamics study's input (recipes/iwslt_dynamics.sh).
# Trained to convergence: early stopping when the valid loss has not improved for PATIENCE epochs (fairseq's
# --patience), then recipes/bundle_checkpoint.py averages the last epochs. Resumable: rerun the same command
# (fairseq restarts from checkpoint_last.pt with its optimizer state).
#
# usage: recipes/train_de_en.sh [SHARED_DATA_DIR] [WORK_DIR] [MAX_EPOCH] [PATIENCE]
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-../shared/data}
WORK=${2:-work/de-en}
MAX_EPOCH=${3:-100}
PATIENCE=${4:-5}
export PATH=$PWD/.venv/bin:$PATH
BIN=$WORK/data-bin
[ -f "$BIN/train.de-en.de.bin" ] || bash data_prep/prepare-multi30k.sh "$DATA" "$BIN" 6000
# One process owns both cores; PASSIVE keeps OpenMP threads from spinning when another process shares the CPU.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=PASSIVE
fairseq-train "$BIN" --user-dir fairseq_headprune --task translation_headprune \
  --arch transformer --share-all-embeddings \
  --encoder-layers 6 --decoder-layers 6 --encoder-attention-heads 8 --decoder-attention-heads 8 \
  --encoder-embed-dim 256 --decoder-embed-dim 256 --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512 \
  --encoder-normalize-before --decoder-normalize-before \
  --dropout 0.3 --attention-dropout 0.1 --activation-dropout 0.1 --weight-decay 0.0001 \
  --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 0.0 \
  --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 800 --warmup-init-lr 1e-07 \
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
  --max-tokens 2048 --max-epoch "$MAX_EPOCH" --patience "$PATIENCE" --seed 1 \
  --save-dir "$WORK/checkpoints" --save-interval 1 --keep-last-epochs -1 \
  --log-format simple --log-interval 50 --num-workers 0 \
  --tensorboard-logdir '' 2>&1 | tee -a "$WORK/train.log"
