#!/usr/bin/env bash
# Voita et al. (2019) on the bundled De-En model: fine-tune it with a Hard Concrete gate on every head and an L0
# penalty, for several λ; then list the heads each λ keeps, and compare with Michel et al.'s I_h pruning at the
# same numbers of heads (test2016 BLEU).
#
# usage: recipes/voita_l0.sh [STAGE...]     stages: data train gates score compare survivors (default: all, in order)
# Every stage skips what is already done (a finished run, an existing importance.json; compare resumes), so the
# recipe can be rerun after a stop. Environment knobs (defaults are what results/voita/ was made with):
#   LAMBDAS="0.05 ..."  UPDATES=300  MAX_TOKENS=1024  LR=1e-4  GATE_LR_SCALE=500  TEMPERATURE=0.33
#   WORK=work/voita (checkpoints, data, logs; git-ignored)  RESULTS=results/voita
#   GATED_TYPES=enc-self,enc-dec,dec-self   Voita et al.'s main experiment gates the encoder only:
#     GATED_TYPES=enc-self WORK=work/voita-encoder RESULTS=results/voita/encoder-only recipes/voita_l0.sh
#     gives BLEU against the number of retained encoder heads (Michel's I_h masks then rank encoder heads only)
#   MODEL=checkpoints/de-en  the converged model to prune
#
# Budget: one CPU core; an update of ~1024 tokens took 1.2-1.5 s of CPU time, so 300 updates are 6-8 CPU
# minutes a λ (on the shared, oversubscribed 2-core machine each run took 25-70 minutes of wall time).
# Why these settings:
# - the weights are fine-tuned at a fixed lr 1e-4 (a tenth of the training peak, no warm-up: the model is
#   converged) with the training recipe's dropout and label smoothing;
# - log α moves at most ~lr x GATE_LR_SCALE = 0.05 per Adam step: from its initial 2.5 (gate exactly 1) a gate
#   needs ~100 steps to close (log α < -log 11), so a few hundred updates suffice. At the plain lr a gate would
#   move 0.03 in 300 updates and nothing would close (fairseq has one lr for all parameters: see gates.py);
# - λ is per target token (the criterion's docstring), Voita et al.'s scale; λ = 0 is the control: the same
#   fine-tuning with gates and no penalty, i.e. what the fine-tuning alone does to BLEU.
set -euo pipefail
# the whole script is one function: bash parses it completely before running anything, so editing this file
# while a sweep runs cannot change what the running sweep does
main() {
  cd "$(dirname "$0")/.."
  export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
  MODEL=${MODEL:-checkpoints/de-en}
  WORK=${WORK:-work/voita}
  GATED_TYPES=${GATED_TYPES:-enc-self,enc-dec,dec-self}
  RESULTS=${RESULTS:-results/voita}
  LAMBDAS=${LAMBDAS:-"0.05 0.02 0.01 0.008 0.006 0.002 0"}
  UPDATES=${UPDATES:-300}
  MAX_TOKENS=${MAX_TOKENS:-1024}
  LR=${LR:-1e-4}
  GATE_LR_SCALE=${GATE_LR_SCALE:-500}
  TEMPERATURE=${TEMPERATURE:-0.33}
  BIN=$WORK/data-bin
  STAGES=${*:-data train gates score compare survivors}
  # the head functions of the model the runs start from (`analyze`; the report's analyze part writes it)
  ANALYSIS=${ANALYSIS:-results/report-de-en/heads_analysis.json}
  EVAL=(--beam 5 --max-tokens 4000 --bpe subword_nmt --bpe-codes "$MODEL/code" --tokenizer moses -s de -t en)
  mkdir -p "$WORK" "$RESULTS"

  has() { [[ " $STAGES " == *" $1 "* ]]; }

  if has data && [ ! -f "$BIN/test.de-en.en.bin" ]; then
    bash data_prep/encode-for-model.sh "$MODEL" de en ../shared/data/multi30k/train "$BIN" train
    bash data_prep/encode-for-model.sh "$MODEL" de en ../shared/data/multi30k/val "$BIN" valid
    bash data_prep/encode-for-model.sh "$MODEL" de en data/multi30k-test2016/test "$BIN" test
  fi

  run_dir() { echo "$WORK/runs/lambda-$1"; }

  if has train; then
    for lambda in $LAMBDAS; do
      dir=$(run_dir "$lambda")
      if [ -f "$dir/checkpoint_last.pt" ] && grep -q "num_updates: $UPDATES >= max_update" "$dir/train.log" 2>/dev/null; then
        echo "lambda $lambda: done ($dir)"; continue
      fi
      mkdir -p "$dir"
      echo "lambda $lambda: fine-tuning $UPDATES updates, log in $dir/train.log"
      fairseq-train "$BIN" --user-dir fairseq_headprune --task translation_headprune -s de -t en \
        --arch transformer --share-all-embeddings \
        --encoder-layers 6 --decoder-layers 6 --encoder-attention-heads 8 --decoder-attention-heads 8 \
        --encoder-embed-dim 256 --decoder-embed-dim 256 --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512 \
        --encoder-normalize-before --decoder-normalize-before \
        --dropout 0.3 --attention-dropout 0.1 --activation-dropout 0.1 \
        --gated-types "$GATED_TYPES" --gate-temperature "$TEMPERATURE" --gate-lr-scale "$GATE_LR_SCALE" \
        --criterion label_smoothed_cross_entropy_l0 --label-smoothing 0.1 --l0-lambda "$lambda" \
        --optimizer adam --adam-betas '(0.9, 0.98)' --lr "$LR" --lr-scheduler fixed \
        --finetune-from-model "$MODEL/model.pt" --max-tokens "$MAX_TOKENS" --max-update "$UPDATES" --seed 1 \
        --save-dir "$dir" --no-epoch-checkpoints --no-save-optimizer-state --disable-validation \
        --log-format simple --log-interval 25 --num-workers 0 > "$dir/train.log" 2>&1
    done
  fi

  if has gates; then
    for lambda in $LAMBDAS; do
      dir=$(run_dir "$lambda")
      fairseq-headprune gates "$dir/checkpoint_last.pt" --results-dir "$RESULTS/lambda-$lambda"
      # the gates' trajectory (expected L0, open gates, NLL every 25 updates): a small text file beside them
      grep -E "train_inner|\| train \|" "$dir/train.log" | sed 's/^.*| INFO | //' > "$RESULTS/lambda-$lambda/train-progress.log"
    done
    for lambda in $LAMBDAS; do cat "$RESULTS/lambda-$lambda/kept-heads.md"; echo; done > "$RESULTS/kept-heads.md"
  fi

  if has score && [ ! -f "$RESULTS/michel/importance.json" ]; then
    fairseq-headprune score "$BIN" --path "$MODEL/model.pt" --gen-subset valid --max-tokens 4000 \
      --results-dir "$RESULTS/michel" -s de -t en
  fi

  if has compare; then
    gated=()
    for lambda in $LAMBDAS; do gated+=("$(run_dir "$lambda")/checkpoint_last.pt"); done
    fairseq-headprune compare "$BIN" --path "$MODEL/model.pt" --gen-subset test "${EVAL[@]}" \
      --references data/multi30k-test2016/test.en --importance "$RESULTS/michel/importance.json" \
      --gated "${gated[@]}" --results-dir "$RESULTS"
  fi

  if has survivors; then  # Voita's figures: heads kept per type and layer across λ, functions of the survivors
    analysis=()
    [ -f "$ANALYSIS" ] && analysis=(--analysis "$ANALYSIS")
    gates=()
    for lambda in $LAMBDAS; do gates+=("$RESULTS/lambda-$lambda/gates.json"); done
    fairseq-headprune survivors "${gates[@]}" "${analysis[@]}" --results-dir "$RESULTS"
  fi
}
main "$@"
