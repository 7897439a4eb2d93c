#!/usr/bin/env bash
# Train the bundled English->French model (checkpoints/en-fr) on the En-Fr corpora of ../shared/data:
# Europarl v7 samples A+B, Bible Fr-En train, LibreOffice help En-Fr train (~92k pairs after cleaning, ~2.8M French
# BPE tokens an epoch), newstest2013 as valid. Same shape as the De-En model: 6+6 layers, 8 heads in every
# attention (144 heads), d_model 256, FFN 512, pre-norm, shared embeddings; 8000 joint BPE merges (a 40k WMT
# vocabulary would put most of a small model's parameters in its embeddings).
#
# usage: recipes/train_en_fr.sh [SHARED_DATA_DIR] [WORK_DIR] [MAX_EPOCH] [extra fairseq-train options ...]
#   e.g. recipes/train_en_fr.sh ../shared/data work/en-fr 30 --stop-time-hours 1.5
# A rerun resumes from WORK/checkpoints/checkpoint_last.pt. fairseq's --stop-time-hours counts the training time
# of the resumed run too (it stops at once when that is already past): add the hours already spent.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-../shared/data}
WORK=${2:-work/en-fr}
MAX_EPOCH=${3:-30}
shift $(( $# < 3 ? $# : 3 ))
export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
BIN=$WORK/data-bin
mkdir -p "$WORK"
[ -f "$BIN/train.en-fr.en.bin" ] || bash data_prep/prepare-wmt14en2fr.sh --data "$DATA" --merges 8000 --workers 2 "$BIN"
# PASSIVE keeps OpenMP threads from spinning when another process shares the CPU.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=PASSIVE
fairseq-train "$BIN" --user-dir fairseq_headprune --task translation_headprune -s en -t fr \
  --arch transformer --share-all-embeddings \
  --encoder-layers 6 --decoder-layers 6 --encoder-attention-heads 8 --decoder-attention-heads 8 \
  --encoder-embed-dim 256 --decoder-embed-dim 256 --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512 \
  --encoder-normalize-before --decoder-normalize-before \
  --dropout 0.1 --attention-dropout 0.1 --activation-dropout 0.1 --weight-decay 0.0001 \
  --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 0.0 \
  --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 600 --warmup-init-lr 1e-07 \
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
  --max-tokens 4096 --max-epoch "$MAX_EPOCH" --seed 1 \
  --save-dir "$WORK/checkpoints" --save-interval 1 --keep-last-epochs -1 \
  --save-interval-updates 200 --keep-interval-updates 3 \
  --log-format simple --log-interval 50 --num-workers 0 \
  --tensorboard-logdir '' "$@" 2>&1 | tee -a "$WORK/train.log"
