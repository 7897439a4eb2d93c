#!/usr/bin/env bash
# shrink on the bundled En-Fr model (pre-norm): retraining-free pruning to a budget, committed as
# results/shrink-en-fr/. Calibration on the first 1000 sentences of newstest2013 (references as targets); BLEU on
# the first N sentences of newstest2014 and on MTNT test (beam 5, --max-len-a 1.5 --max-len-b 10 as
# recipes/study_en_fr.sh), sacreBLEU on detokenised text against the raw references. Each test set's folder holds
# its own copy of the calibration subset (fairseq reads both from one data folder).
#
# usage: recipes/shrink_en_fr.sh [PERCENTS] [METHODS] [N]
# Without PERCENTS/METHODS it runs in stages, most telling first, so that an interrupted run has them: 30/50/70%
# for Michel's I_h order, Fisher and the full-Fisher pipeline (full+out-proj+ffn) on both test sets, the same
# budgets with the shrink command's default since (+min1: a head kept in every sublayer), then the other budgets,
# then Kwon's ladder (rearrangement, scales, out-projection). Each row is appended as it is
# computed: a rerun resumes. Budget: a 500-sentence newstest2014 decode at beam 5 is ~1-2 min of one core, MTNT
# (1020 sentences) twice that, a reconstruction with 1000 calibration sentences ~5 min.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
LADDER=fisher+rearrange,fisher+rearrange+scales,fisher+rearrange+out-proj
DEFAULT=full+out-proj+ffn+min1  # the shrink command's default since stage 1 ran (a head kept in every sublayer)
STAGES=("30,50,70 michel,fisher,full+out-proj+ffn" "30,50,70 $DEFAULT" "10,20,40,60,80 michel,fisher,$DEFAULT"
        "30,50,70 $LADDER" "10,20,40,60,80 $LADDER")
[ $# -ge 2 ] && STAGES=("$1 $2")
N=${3:-500}
DATA=${DATA:-../shared/data}
MODEL=checkpoints/en-fr
OUT=${OUT:-results/shrink-en-fr}
WORK=${WORK:-work/shrink-en-fr}
mkdir -p "$OUT" "$WORK/raw"
encode() {  # encode NAME SPLIT RAW_PREFIX [--tokenized]
  [ -f "$WORK/$1/$2.en-fr.en.bin" ] || bash data_prep/encode-for-model.sh "$MODEL" en fr "$3" "$WORK/$1" "$2" ${4:-} \
    > "$WORK/$1-$2.log"
}
head -n 1000 "$DATA/wmt14_en_fr/newstest2013.tok.en" > "$WORK/raw/nt13.en"
head -n 1000 "$DATA/wmt14_en_fr/newstest2013.tok.fr" > "$WORK/raw/nt13.fr"
head -n "$N" "$DATA/wmt14_en_fr/newstest2014-fren.en" > "$WORK/raw/nt14.en"
head -n "$N" "$DATA/wmt14_en_fr/newstest2014-fren.fr" > "$WORK/raw/nt14.fr"
cp "$DATA/mtnt/test.en-fr.en" "$WORK/raw/mtnt.en"
cp "$DATA/mtnt/test.en-fr.fr" "$WORK/raw/mtnt.fr"
for name in nt14 mtnt; do
  encode "$name" valid "$WORK/raw/nt13" --tokenized
  encode "$name" test "$WORK/raw/$name"
done
GEN=(--path "$MODEL/model.pt" -s en -t fr --max-tokens 4000 --beam 5 --max-len-a 1.5 --max-len-b 10
     --bpe subword_nmt --bpe-codes "$MODEL/code" --tokenizer moses)
for stage in "${STAGES[@]}"; do
  read -r PERCENTS METHODS <<< "$stage"
  for name in nt14 mtnt; do
    echo "+ fairseq-headprune shrink $WORK/$name --sweep $PERCENTS --sweep-methods $METHODS"
    fairseq-headprune shrink "$WORK/$name" "${GEN[@]}" --gen-subset test --references "$WORK/$name/test.raw.fr" \
      --calibration-subset valid --calibration-sentences 1000 --sweep "$PERCENTS" --sweep-methods "$METHODS" \
      --results-dir "$OUT/$name"
  done
done
