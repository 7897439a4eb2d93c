#!/usr/bin/env bash
# The README's first command: the whole study of the bundled De-En model (`fairseq-headprune report`) on a slice of
# its bundled test set (Multi30k test2016), sized to finish in about 5 minutes on 2 CPU cores: the first
# DEMO_SENTENCES sentences (default 64), greedy decoding (DEMO_BEAM, default 1), hypotheses capped at 1.2 x source
# + 10 tokens (heavily pruned models rarely stop by themselves), pruning curves in 20% steps. Nothing is
# downloaded and ../shared is not needed. A rerun reuses what is done; an interrupted demo resumes.
#
# Every part of the full study runs and every claim is checked; the demo picks the fast way to each:
#  - keep-one: each layer's head chosen by teacher-forced NLL on the slice (one forward per head) and only the
#    chosen heads decoded, scored by BLEU with significance - as results/report-de-en/ does - instead of decoding
#    every head (the single-head ablation still decodes every head: its table is BLEU per head);
#  - sweeps: masks share beam searches as measured fastest on this machine (--masks-per-batch auto) and run on
#    the free cores (--workers auto; DEMO_WORKERS=N to set it, 1 for one process);
#  - speed: 32 sentences, 2 timed runs per batch size; head analysis on the first 32 sentences;
#  - shrink (pruning without retraining): fitted on the first DEMO_CALIBRATION (default 128) sentences of the
#    bundled Multi30k val, at 25/50/75% of the heads, Michel's I_h order against the shrink command's default;
#  - deploy: the unpruned model and its per-stack 50% shrink (same calibration) in fairseq, CTranslate2
#    float32 and int8, BLEU and speed in one round, 16 sentences at batch 1 (OUT/deploy.md).
# The committed results/report-de-en/ is the full-size study (1000 sentences, beam 5, 10% steps).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
MODEL=checkpoints/de-en
N=${DEMO_SENTENCES:-64}
BEAM=${DEMO_BEAM:-1}
WORKERS=${DEMO_WORKERS:-auto}
RAW=data/multi30k-test2016/test
CAL_RAW=data/multi30k-val/val
CAL=${DEMO_CALIBRATION:-128}
WORK=work/demo/slice-$N-cal$CAL
L0=results/voita/compare.jsonl
L0_ENCODER=results/voita/encoder-only/compare.jsonl  # claim V is judged on it, as the study judges it
[ -f "$MODEL/model.pt" ] || { echo "demo: error: $MODEL/model.pt is missing" >&2; exit 2; }
# one folder per bundled model: results of an earlier model are never resumed (the report would refuse them)
OUT=${DEMO_OUT:-work/demo/report-$N-beam$BEAM-$(sha256sum "$MODEL/model.pt" | cut -c1-12)}
start=$(date +%s)
if [ ! -f "$WORK/data-bin/test.de-en.de.bin" ] || [ ! -f "$WORK/data-bin/valid.de-en.de.bin" ]; then
  mkdir -p "$WORK"
  for l in de en; do head -n "$N" "$RAW.$l" > "$WORK/test.$l"; done
  bash data_prep/encode-for-model.sh "$MODEL" de en "$WORK/test" "$WORK/data-bin" test
  for l in de en; do head -n "$CAL" "$CAL_RAW.$l" > "$WORK/valid.$l"; done
  bash data_prep/encode-for-model.sh "$MODEL" de en "$WORK/valid" "$WORK/data-bin" valid
fi
fairseq-headprune report "$WORK/data-bin" --path "$MODEL/model.pt" --gen-subset test \
  --beam "$BEAM" --max-len-a 1.2 --max-len-b 10 --max-tokens 4000 \
  --bpe subword_nmt --bpe-codes "$MODEL/code" --tokenizer moses -s de -t en \
  --references "$WORK/test.en" --results-dir "$OUT" \
  --keep-one-select loss --workers "$WORKERS" \
  --prune-step 0.2 --speed-sentences 32 --speed-runs 2 --analyze-sentences 32 \
  --shrink-percents 25,50,75 --shrink-methods michel,full+out-proj+ffn+min1 --shrink-calibration-sentences "$CAL" \
  --deploy-runs 1 --deploy-batch1-sentences 16 \
  --dynamics results/dynamics/dynamics.jsonl $([ -f "$L0" ] && echo --l0-sweep "$L0") \
  $([ -f "$L0_ENCODER" ] && echo --l0-encoder-sweep "$L0_ENCODER") \
  --note "Demo (recipes/demo.sh): the first $N sentences of Multi30k test2016, beam $BEAM, hypotheses capped at \
1.2 x source + 10 tokens, pruning in 20% steps, I_h on the same sentences, keep-one heads chosen by NLL on the same \
sentences and reported by BLEU, head analysis on the first 32, pruning without retraining fitted on the first $CAL \
sentences of Multi30k val (the deployment table's per-stack shrink too). A quick look, not the study: \
results/report-de-en/ is the full-size one (1000 sentences, beam 5). C5 and V read committed results of other \
studies of this model (its training run; the L0 sweeps, every head gated and encoder self-attention gated alone, \
beam 5 on all 1000 sentences)."
sed -n '/^| model/,$p' "$OUT/deploy.md"  # the deployment table of the slice and its targets
end=$(date +%s)
# wall time per part, from the report's own record (parts finished before this run are marked as reused)
python - "$OUT/report-state.json" "$start" <<'PY'
import datetime, json, sys
state, start = json.load(open(sys.argv[1])), int(sys.argv[2])
for name, rec in state["parts"].items():
    when = datetime.datetime.fromisoformat(rec["finished"]).timestamp()
    print(f"demo: {name:<12} {rec['seconds']:7.1f} s" + ("" if when >= start else "  (reused: finished before this run)"))
PY
echo "demo: finished in $(( end - start )) s wall; the report is $OUT/report.html (and report.md beside it)"
