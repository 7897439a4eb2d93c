#!/usr/bin/env bash
# Voita et al. (2019), Table 2's last column: the head configuration an L0 run pruned to, trained from random
# initialisation with the base model's recipe and budget (recipes/de_en_train_args.sh: same data, hyper-parameters,
# DE_EN_PHASE1_EPOCHS of the inverse-sqrt schedule, then lr 1e-4 until the valid loss stops improving), then its test2016 BLEU beside the pruned model's. `headprune_transformer
# --kept-heads JSON` builds the uneven (even empty) layers before any weight exists.
#
# usage: recipes/voita_from_scratch.sh CLOSED_HEADS.json NAME [MAX_EPOCH] [PATIENCE]    (25, 2: as the base model)
#   CLOSED_HEADS.json: `fairseq-headprune gates CKPT --results-dir DIR` writes DIR/closed-heads.json (or any
#   {TYPE: {LAYER: [HEADS]}} file of heads to leave out); NAME: a folder name under $RESULTS.
# Knobs: WORK=work/voita-scratch RESULTS=results/voita/from-scratch; MAX_UPDATE=N SKIP_BLEU=1 check the recipe quickly
# Budget: the base recipe, about 6 minutes an epoch on both cores; fewer heads train slightly faster.
set -euo pipefail
main() {
  cd "$(dirname "$0")/.."
  export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=PASSIVE
  CLOSED=${1:?usage: voita_from_scratch.sh CLOSED_HEADS.json NAME [MAX_EPOCH] [PATIENCE]}
  NAME=${2:?usage: voita_from_scratch.sh CLOSED_HEADS.json NAME [MAX_EPOCH] [PATIENCE]}
  MAX_EPOCH=${3:-25}
  PATIENCE=${4:-2}
  PHASE1_EPOCHS=${PHASE1_EPOCHS:-}
  WORK=${WORK:-work/voita-scratch}/$NAME
  RESULTS=${RESULTS:-results/voita/from-scratch}/$NAME
  MODEL=checkpoints/de-en
  BIN=work/de-en/data-bin
  [ -f "$CLOSED" ] || { echo "voita_from_scratch: error: no such file: $CLOSED" >&2; exit 2; }
  [ -f "$BIN/train.de-en.de.bin" ] || bash data_prep/prepare-multi30k.sh ../shared/data "$BIN" 6000
  mkdir -p "$WORK" "$RESULTS"
  # the heads each layer keeps: all 8 minus the closed ones (layers that lose none are left out of the JSON)
  KEPT=$(python - "$CLOSED" <<'EOF'
import json, sys
closed = json.load(open(sys.argv[1]))
kept = {t: {layer: [h for h in range(1, 9) if h not in set(heads)] for layer, heads in layers.items() if heads}
        for t, layers in closed.items()}
print(json.dumps({t: v for t, v in kept.items() if v}, sort_keys=True))
EOF
)
  echo "$KEPT" > "$RESULTS/kept-heads.json"
  extra=()
  [ -n "${MAX_UPDATE:-}" ] && extra=(--max-update "$MAX_UPDATE")
  source recipes/de_en_train_args.sh  # the base model's shape, hyper-parameters and two phases
  PHASE1_EPOCHS=${PHASE1_EPOCHS:-$DE_EN_PHASE1_EPOCHS}
  local common=(--user-dir fairseq_headprune --task translation_headprune --arch headprune_transformer
                --kept-heads "$KEPT" --save-dir "$WORK/checkpoints" --no-epoch-checkpoints)
  # phase one: the base run's epochs of the inverse-sqrt schedule; phase two: lr 1e-4 until the valid loss stops
  # improving (recipes/cooldown_de_en.sh), up to MAX_EPOCH
  if ! grep -q "== cool-down phase" "$WORK/train.log" 2>/dev/null; then
    fairseq-train "$BIN" "${common[@]}" "${DE_EN_TRAIN_ARGS[@]}" --max-epoch "$PHASE1_EPOCHS" "${extra[@]}" \
      2>&1 | tee -a "$WORK/train.log" | grep -E "valid on|done training" || true
    tail -3 "$WORK/train.log" | grep -q "done training" ||
      { echo "voita_from_scratch: error: phase one did not finish (see $WORK/train.log); rerun to resume" >&2; exit 1; }
    [ -n "${MAX_UPDATE:-}" ] || echo "== cool-down phase: ${DE_EN_COOLDOWN_ARGS[*]} ==" >> "$WORK/train.log"
  fi
  if [ -z "${MAX_UPDATE:-}" ]; then
    fairseq-train "$BIN" "${common[@]}" "${DE_EN_COOLDOWN_BASE[@]}" "${DE_EN_COOLDOWN_ARGS[@]}" \
      --max-epoch "$MAX_EPOCH" --patience "$PATIENCE" 2>&1 | tee -a "$WORK/train.log" | grep -E "valid on|done training" || true
  fi
  grep -E "valid on|done training" "$WORK/train.log" > "$RESULTS/train-progress.log"
  [ -n "${SKIP_BLEU:-}" ] && return 0  # a quick check of the training part
  # BLEU of the best checkpoint on test2016, as recipes/eval_bleu.sh scores the bundled models
  USER_DIR=fairseq_headprune bash recipes/eval_bleu.sh "$BIN" "$WORK/checkpoints/checkpoint_best.pt" \
    "$MODEL/code" de en test:data/multi30k-test2016/test.en | tee "$RESULTS/bleu.txt"
}
main "$@"
