#!/usr/bin/env bash
# shrink on the bundled De-En model: retraining-free pruning to a budget (Kwon et al. 2022 and beyond), committed
# as results/shrink-de-en/. Calibration on Multi30k val (1000 sentences, references as targets), BLEU on test2016
# (1000 sentences, beam 5, sacreBLEU on detokenised text against the raw references).
#
#   1. the study over budgets (10..80% of the heads removed): Michel's I_h order, Fisher, + rearrangement,
#      + per-head scales, + out-projection refit, + FFN refit; L0 runs from results/voita/compare.jsonl beside them
#   2. the candidate improvements at 50% (NOTES.md): no rearrangement, refit of unpruned sublayers, milder-mask
#      teacher, search with reconstruction in the loop, self-translations as targets
#   3. the operating point written as a stock checkpoint (+ its JSON), and its speed at equal work
#   4. the targets, side by side in one run (benchmarks/shrink_targets.py)
# Each sweep row is appended as it is computed: a rerun resumes. Hours of one core on a shared machine.
#
# usage: recipes/shrink_de_en.sh [PARTS]     PARTS: comma-separated of sweep,candidates,export,speed,targets
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
PARTS=${1:-sweep,candidates,export,speed,targets}
MODEL=checkpoints/de-en
BIN=${BIN:-work/de-en/data-bin}
OUT=${OUT:-results/shrink-de-en}
WORK=${WORK:-work/shrink-de-en}
if [ ! -f "$BIN/valid.de-en.de.bin" ]; then
  bash data_prep/encode-for-model.sh "$MODEL" de en ../shared/data/multi30k/val "$BIN" valid
fi
[ -f "$BIN/test.de-en.de.bin" ] || bash data_prep/encode-for-model.sh "$MODEL" de en data/multi30k-test2016/test "$BIN" test
mkdir -p "$OUT" "$WORK"
REF=$BIN/test.raw.en  # encode-for-model.sh keeps it there, prepare-multi30k.sh in prep/
[ -f "$REF" ] || REF=$BIN/prep/test.raw.en
GEN=(--path "$MODEL/model.pt" --beam 5 --bpe subword_nmt --bpe-codes "$MODEL/code" --tokenizer moses -s de -t en
     --max-tokens 4000)
SWEEP=(shrink "$BIN" "${GEN[@]}" --gen-subset test --references "$REF" --results-dir "$OUT"
       --calibration-subset valid --calibration-sentences 1000)
# the L0 runs beside the sweep when there are any (shown only when scored like it: same model, data, beam)
[ -f results/voita/compare.jsonl ] && SWEEP+=(--l0-compare results/voita/compare.jsonl)
has() { [[ ",$PARTS," == *",$1,"* ]]; }
run() { echo "+ fairseq-headprune $*"; fairseq-headprune "$@"; }

LADDER=michel,fisher,fisher+rearrange,fisher+rearrange+scales,fisher+rearrange+out-proj
BEST=full+out-proj+ffn+min1  # the command's default (NOTES.md): greedy full-Fisher fill keeping a head in every
                            # attention sublayer, out_proj + fc2 refit
if has sweep; then  # the budgets the targets name first, so an interrupted run has them
  run "${SWEEP[@]}" --sweep 50,30,70,80 --sweep-methods "$LADDER,$BEST"
  run "${SWEEP[@]}" --sweep 10,20,40,60 --sweep-methods "michel,fisher,$BEST"
  run "${SWEEP[@]}" --sweep 10,20,40,60 --sweep-methods "$LADDER"
fi
if has candidates; then  # measured at 50% (NOTES.md)
  run "${SWEEP[@]}" --sweep 50 --sweep-methods \
fisher+rearrange+out-proj+ffn,fisher+rearrange+out-proj+all,fisher+out-proj,block+out-proj+ffn,full+out-proj+ffn+mild50,\
full+out-proj+ffn+steps2,michel+out-proj+ffn,full+out-proj+ffn+ridge0.01,full+out-proj+ffn,full+out-proj+ffn+min2
  run "${SWEEP[@]}" --sweep 50 --sweep-tag self-targets --calibration-targets self --sweep-methods "$BEST"
  run "${SWEEP[@]}" --sweep 50 --sweep-tag train-4000 --calibration-subset train --calibration-sentences 4000 \
    --sweep-methods "$BEST"
fi
if has export; then
  /usr/bin/time -v fairseq-headprune shrink "$BIN" "${GEN[@]}" --remove 50% --calibration-subset valid \
    --calibration-sentences 1000 --out "$WORK/shrink-50.pt" --results-dir "$OUT" 2> "$WORK/shrink-50.time" \
    | tee "$OUT/shrink-50.log"
  grep -E "Elapsed|Maximum resident" "$WORK/shrink-50.time" | tee -a "$OUT/shrink-50.log"
fi
if has speed; then  # the operating point's shape against the unpruned model, every hypothesis 20 tokens
  mkdir -p "$OUT/speed-same-work"
  SPEC=$(python -c "import json; print(json.load(open('$OUT/shrink-50.json'))['selection']['removed_spec'])")
  run speed "$BIN" "${GEN[@]}" --gen-subset test --heads "$SPEC" --results-dir "$OUT/speed-same-work" --runs 3 \
    --num-sentences 128 --max-len-a 0 --max-len-b 20 --min-len 20 | tee "$OUT/speed-same-work/speed.txt"
fi
if has targets; then
  python benchmarks/shrink_targets.py --work "$WORK/targets" | tee "$OUT/targets.md"
fi
