#!/usr/bin/env bash
# The bundled En-Fr model's sweeps, committed as results/en-fr/:
#  1. in domain vs out of domain (Michel et al. Section 3.4, Figure 2): the single-head ablation on newstest2013
#     (the first N sentences) and on MTNT test (noisy Reddit text, 1020 sentences), and how the two agree head by
#     head (`correlate`: Spearman and Pearson, scatter plot). Scored by teacher-forced NLL (--metric loss): on a
#     model this weak, one masked head moves BLEU by less than its sampling noise, while the NLL change is measured
#     to a few thousandths of a nat; METRIC=bleu runs the same sweeps by BLEU (hours of CPU).
#  2. pruning curves (Section 4, Figures 3/4): I_h and the oracle (the ablation deltas) from newstest2013, BLEU on
#     the first N sentences of newstest2014 (beam 5), by importance, oracle and random over all heads, then each
#     attention type alone by importance.
# Data: the raw newstest2013/2014 references of data_prep/prepare-wmt14en2fr.sh (OUT_DIR/{valid,test}.raw.*) and
# MTNT test, encoded with the model's BPE codes and dictionaries (data_prep/encode-for-model.sh).
# Every command appends as it goes and resumes: rerun the recipe after an interruption.
#
# usage: recipes/study_en_fr.sh [WMT_DATA_BIN] [SHARED_DATA_DIR] [N]
#   WMT_DATA_BIN  the OUT_DIR of prepare-wmt14en2fr.sh (default work/en-fr/data-bin, made by train_en_fr.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
WMT=${1:-work/en-fr/data-bin}
DATA=${2:-../shared/data}
N=${3:-500}
METRIC=${METRIC:-loss}
export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
MODEL=checkpoints/en-fr
OUT=${OUT:-results/en-fr}
WORK=${WORK:-work/en-fr/study}
die() { echo "study_en_fr: error: $*" >&2; exit 2; }
for f in "$WMT/valid.raw.en" "$WMT/test.raw.en"; do
  [ -f "$f" ] || die "missing $f (run recipes/train_en_fr.sh or data_prep/prepare-wmt14en2fr.sh)"
done
[ -d "$DATA/mtnt" ] || die "missing $DATA/mtnt (MTNT v1.1 En-Fr)"
mkdir -p "$OUT" "$WORK/raw"
slice() {  # slice SPLIT NAME: the first N sentences of a prepared split, encoded for the model
  local split=$1 name=$2
  [ -f "$WORK/$name/$split.en-fr.en.bin" ] && return
  for l in en fr; do head -n "$N" "$WMT/$split.raw.$l" > "$WORK/raw/$name.$l"; done
  bash data_prep/encode-for-model.sh "$MODEL" en fr "$WORK/raw/$name" "$WORK/$name" "$split" > "$WORK/$name.log"
}
slice valid nt13
slice test nt14
[ -f "$WORK/mtnt/test.en-fr.en.bin" ] || bash data_prep/prepare-mtnt.sh "$MODEL" "$WORK/mtnt" "$DATA/mtnt" > "$WORK/mtnt.log"

GEN=(--path "$MODEL/model.pt" -s en -t fr --max-tokens 4000 --beam 5 --max-len-a 1.5 --max-len-b 10
     --bpe subword_nmt --bpe-codes "$MODEL/code" --tokenizer moses)
SUFFIX=$([ "$METRIC" = loss ] && echo -loss || true)
run() { echo "+ fairseq-headprune $*"; fairseq-headprune "$@"; }

# 1. in domain vs out of domain
run score "$WORK/nt13" "${GEN[@]}" --gen-subset valid --results-dir "$OUT"
run ablate "$WORK/nt13" "${GEN[@]}" --gen-subset valid --references "$WORK/nt13/valid.raw.fr" --mode single \
  --metric "$METRIC" --results-dir "$OUT/newstest2013"
run ablate "$WORK/mtnt" "${GEN[@]}" --gen-subset test --references "$WORK/mtnt/test.raw.fr" --mode single \
  --metric "$METRIC" --results-dir "$OUT/mtnt"
run correlate "$OUT/newstest2013/ablation-single$SUFFIX.jsonl" "$OUT/mtnt/ablation-single$SUFFIX.jsonl" \
  --results-dir "$OUT" --name "correlation-newstest2013-vs-mtnt$SUFFIX"

# 2. pruning curves on newstest2014
run prune "$WORK/nt14" "${GEN[@]}" --gen-subset test --references "$WORK/nt14/test.raw.fr" --results-dir "$OUT" \
  --order importance,oracle,random --importance "$OUT/importance.json" \
  --ablation "$OUT/newstest2013/ablation-single$SUFFIX.jsonl" --step 0.1
for t in enc-self enc-dec dec-self; do
  run prune "$WORK/nt14" "${GEN[@]}" --gen-subset test --references "$WORK/nt14/test.raw.fr" --results-dir "$OUT" \
    --order importance --types "$t" --importance "$OUT/importance.json" --step 0.1
done
echo "study_en_fr: results in $OUT"
