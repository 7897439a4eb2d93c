#!/usr/bin/env bash
# Training dynamics of head importance (Michel et al. Section 6, Figure 5): a training run that keeps every
# epoch's checkpoint, and for each epoch I_h on a valid slice, heads pruned by importance in 10% steps, BLEU on a
# test slice; one figure (dynamics.png), one table (dynamics.md). The analysis follows the training while it
# runs (`dynamics --watch`) and resumes where it stopped.
#
#   recipes/iwslt_dynamics.sh iwslt    DATA_BIN WORK [MAX_EPOCH] [N]   IWSLT14 (data_prep/prepare-iwslt14.sh), the
#                                                                     paper's model: 6+6 layers, d=512, FFN 1024,
#                                                                     8 heads, pre-norm
#   recipes/iwslt_dynamics.sh multi30k SHARED_DATA WORK [MAX_EPOCH] [N]  here: no IWSLT14 training set, so the same
#                                                                     8-head shape scaled to this CPU (d=256, FFN
#                                                                     512) trains on Multi30k: recipes/train_de_en.sh
# N: sentences of the valid and test slices (default 400; BLEU of a 1000-sentence test set takes ~40 s a step here).
# Hypotheses are capped at 1.2 x source + 10 tokens: early epochs rarely stop by themselves.
# results/dynamics/ holds the dynamics step of this recipe (N=400) on the 25 epochs of the bundled model's run
# (recipes/train_de_en.sh, then recipes/cooldown_de_en.sh; run by recipes/rerun_de_en.sh jobs dynamics).
set -euo pipefail
cd "$(dirname "$0")/.."
SETUP=${1:?usage: iwslt_dynamics.sh iwslt|multi30k DATA WORK [MAX_EPOCH] [N]}
DATA=${2:?}; WORK=${3:?}; MAX_EPOCH=${4:-20}; N=${5:-400}
export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_WAIT_POLICY=PASSIVE
mkdir -p "$WORK"
case $SETUP in
  iwslt)
    BIN=$DATA; SRC_VAL=$BIN/prep/valid.tok; SRC_TEST=$BIN/prep/test.tok; TOK=--tokenized
    if [ ! -f "$WORK/checkpoints/checkpoint$MAX_EPOCH.pt" ]; then
      fairseq-train "$BIN" --user-dir fairseq_headprune --task translation_headprune \
        --arch headprune_transformer_iwslt_de_en_8head --share-decoder-input-output-embed \
        --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 0.0 --lr 5e-4 --lr-scheduler inverse_sqrt \
        --warmup-updates 4000 --dropout 0.3 --weight-decay 0.0001 --criterion label_smoothed_cross_entropy \
        --label-smoothing 0.1 --max-tokens 4096 --max-epoch "$MAX_EPOCH" --save-dir "$WORK/checkpoints" \
        --save-interval 1 --keep-last-epochs -1 --log-format simple --num-workers 0 >> "$WORK/train.log" 2>&1 &
      TRAIN_PID=$!
    fi ;;
  multi30k)
    BIN=$WORK/data-bin; SRC_VAL=$DATA/multi30k/val; SRC_TEST=$DATA/multi30k/test_2016_flickr; TOK=
    if [ ! -f "$WORK/checkpoints/checkpoint$MAX_EPOCH.pt" ]; then
      bash recipes/train_de_en.sh "$DATA" "$WORK" "$MAX_EPOCH" > /dev/null 2>&1 &
      TRAIN_PID=$!
      while [ ! -f "$BIN/dict.en.txt" ]; do sleep 10; done
    fi ;;
  *) echo "iwslt_dynamics: error: the setup is iwslt or multi30k, not '$SETUP'" >&2; exit 2 ;;
esac
# valid and test slices of N sentences, encoded with the run's BPE codes and dictionaries
SLICE=$WORK/dynamics-slices
if [ ! -f "$SLICE/bin/test.de-en.de.bin" ]; then
  mkdir -p "$SLICE"
  for l in de en; do head -n "$N" "$SRC_VAL.$l" > "$SLICE/valid.$l"; head -n "$N" "$SRC_TEST.$l" > "$SLICE/test.$l"; done
  bash data_prep/encode-for-model.sh "$BIN" de en "$SLICE/valid" "$SLICE/bin" valid $TOK
  bash data_prep/encode-for-model.sh "$BIN" de en "$SLICE/test" "$SLICE/bin-test" test $TOK
  cp "$SLICE"/bin-test/test.* "$SLICE/bin/"
fi
if [ "$SETUP" = multi30k ]; then   # detokenised, cased sacreBLEU
  SCORING=(--bpe subword_nmt --bpe-codes "$BIN/code" --tokenizer moses -s de -t en --references "$SLICE/bin/test.raw.en")
else                              # IWSLT references are tokenised and lowercased: BLEU on that form
  SCORING=(--remove-bpe -s de -t en --references "$SLICE/bin/test.raw.en")
fi
fairseq-headprune dynamics "$SLICE/bin" --checkpoint-dir "$WORK/checkpoints" --results-dir "$WORK/dynamics" \
  --gen-subset test --importance-subset valid --beam 5 --max-len-a 1.2 --max-len-b 10 --max-tokens 4000 "${SCORING[@]}" \
  --step 0.1 --watch --watch-until-epoch "$MAX_EPOCH" --poll-seconds 30
[ -z "${TRAIN_PID:-}" ] || wait "$TRAIN_PID"
