#!/bin/bash
# The recover study's En-Fr half (results/recover-en-fr/): the bundled En-Fr model shrunk by 50% (calibrated on
# the first 1000 sentences of newstest2013, as the deployment table's), then one epoch of `recover` with its
# defaults on a 30k-pair slice of the model's own training corpora (Europarl sample A 20k, the first 5k of the
# Bible and of LibreOffice help: about an epoch of Multi30k's size), early stopping on those 1000 newstest2013
# sentences; the control is the unpruned model through the same recovery. BLEU (benchmarks/recover_study.py
# --pair en-fr) on the first 1000 sentences of newstest2014 and on MTNT's En-Fr test set.
#   bash recipes/recover_en_fr.sh [WORK] [LANE]   (LANE student, control, per-stack or per-stack-3 runs one of them;
#   resumable)
# Budget: encoding 2 min; each recovery about 12 CPU-minutes; decoding 4 models x 2 sets about 10 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1 TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
DATA=${DATA:-../shared/data}
WORK=${1:-work/recover-en-fr}
LANE=${2:-all}
MODEL=checkpoints/en-fr
BIN=$WORK/data-bin
mkdir -p "$WORK/raw" "$WORK/runs"
encode() {  # SPLIT: raw files made by the caller, encoded once
  [ -f "$BIN/$1.en-fr.en.bin" ] || bash data_prep/encode-for-model.sh "$MODEL" en fr "$WORK/raw/$1" "$BIN" "$1" \
    > "$WORK/encode-$1.log" 2>&1
}
if [ ! -f "$BIN/train.en-fr.en.bin" ]; then
  for l in en fr; do
    { cat "$DATA/europarl_en_fr/europarl-v7.sampleA.$l"; head -n 5000 "$DATA/bible_fr_en/train.$l"
      head -n 5000 "$DATA/libreoffice_help_en_fr/train.$l"; } > "$WORK/raw/train.$l"
    head -n 1000 "$DATA/wmt14_en_fr/newstest2013.tok.$l" > "$WORK/raw/valid.$l"  # Moses-tokenised in the data
    head -n 1000 "$DATA/wmt14_en_fr/newstest2014-fren.$l" > "$WORK/raw/test.$l"
    cp "$DATA/mtnt/test.en-fr.$l" "$WORK/raw/mtnt.$l"
  done
  encode train; encode test; encode mtnt
fi
[ -f "$BIN/valid.en-fr.en.bin" ] || bash data_prep/encode-for-model.sh "$MODEL" en fr "$WORK/raw/valid" "$BIN" valid \
  --tokenized > "$WORK/encode-valid.log" 2>&1
GEN=(-s en -t fr --max-len-a 1.5 --max-len-b 10)
[ -f "$WORK/shrink-50.pt" ] || fairseq-headprune shrink "$BIN" --path "$MODEL/model.pt" "${GEN[@]}" --max-tokens 4000 \
  --remove 50% --calibration-subset valid --calibration-sentences 1000 --out "$WORK/shrink-50.pt" \
  > "$WORK/shrink-50.log" 2>&1
recover() {  # NAME STUDENT [EPOCHS]  (a run with fewer epochs is extended: --force rewrites OUT.pt)
  local epochs=${3:-1}
  [ -f "$WORK/runs/$1.recover/checkpoint$epochs.pt" ] || /usr/bin/time -v fairseq-headprune recover "$BIN" --path "$2" \
    --teacher "$MODEL/model.pt" --out "$WORK/runs/$1.pt" --force --epochs "$epochs" \
    --work-dir "$WORK/runs/$1.recover" -s en -t fr >> "$WORK/runs/$1.log" 2>&1
}
case $LANE in student|all) recover r50 "$WORK/shrink-50.pt" ;; esac
case $LANE in control|all) recover ctl "$MODEL/model.pt" ;; esac
# the deployment table's per-stack candidate (recipes/deploy_en_fr.sh): the decoder at 4 of 8 heads in every self-
# and cross-attention (CTranslate2's shape), the window fit on the same calibration, then the same one epoch
if [ "$LANE" = per-stack ] || [ "$LANE" = all ]; then
  [ -f "$WORK/shrink-dps50-w1000.pt" ] || /usr/bin/time -v fairseq-headprune shrink "$BIN" --path "$MODEL/model.pt" "${GEN[@]}" \
    --max-tokens 4000 --remove 50% --types enc-dec,dec-self --shape per-stack --window-steps 1000 \
    --calibration-subset valid --calibration-sentences 1000 --out "$WORK/shrink-dps50-w1000.pt" \
    > "$WORK/shrink-dps50-w1000.log" 2>&1
  recover rdps50-w1000 "$WORK/shrink-dps50-w1000.pt"
fi
# later: the same per-stack run extended to 3 epochs (LANE per-stack-3, after per-stack)
[ "$LANE" != per-stack-3 ] || recover rdps50-w1000 "$WORK/shrink-dps50-w1000.pt" 3
