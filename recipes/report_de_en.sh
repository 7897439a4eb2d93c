#!/usr/bin/env bash
# The full-size study of the bundled De-En model, committed as results/report-de-en/: Multi30k test2016 (1000
# sentences), beam 5, I_h on Multi30k val (1014 sentences), detokenised cased sacreBLEU; C5 from the bundled
# model's training dynamics (results/dynamics/, when its .model-sha256 is this model's), Voita's claim from the L0
# sweeps (results/voita/compare.jsonl, and results/voita/encoder-only/compare.jsonl when it is there).
#
# usage: recipes/report_de_en.sh [report options]     e.g. --parts score,single   or   --render-only
# Result files of the same runs in results/de-en/ (the commands' own output, same options) are copied in first when
# newer, and resumed, not recomputed. Running every part from nothing takes hours of one CPU core: run it in the
# background (its progress goes to stdout; a rerun resumes where it stopped).
# Keep-one (C2) runs with --keep-one-select loss: each layer's head is chosen by teacher-forced NLL on val (144
# NLL passes) and only the 18 chosen heads are decoded on test (BLEU, paired bootstrap). Full BLEU keep-one decodes
# all 144 masks with beam 5 (~2 core-hours on this CPU); the NLL-selected variant takes ~20 min. Pass
# --keep-one-select bleu (it overrides) for the full search.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
MODEL=checkpoints/de-en
BIN=${BIN:-work/de-en/data-bin}
OUT=${OUT:-results/report-de-en}
SEED=${SEED:-results/de-en}
if [ ! -f "$BIN/valid.de-en.de.bin" ]; then
  [ -d ../shared/data/multi30k ] || { echo "report_de_en: error: ../shared/data/multi30k is needed for I_h on val" >&2; exit 2; }
  bash data_prep/encode-for-model.sh "$MODEL" de en ../shared/data/multi30k/val "$BIN" valid
fi
[ -f "$BIN/test.de-en.de.bin" ] || bash data_prep/encode-for-model.sh "$MODEL" de en data/multi30k-test2016/test "$BIN" test
mkdir -p "$OUT"
if [ -d "$SEED" ]; then
  for f in importance.json ablation-single.jsonl ablation-keep-one.jsonl ablation-keep-one-loss.jsonl \
           ablation-keep-one-loss-report-test-bleu.jsonl pruning.jsonl speed.json heads_analysis.json \
           heads_analysis.partial.jsonl; do
    if [ -f "$SEED/$f" ] && [ "$SEED/$f" -nt "$OUT/$f" ]; then cp "$SEED/$f" "$OUT/$f"; echo "report_de_en: $f from $SEED"; fi
  done
fi
# C5 reads the training dynamics of this model's own run (results/dynamics/.model-sha256 names the model the run
# ended in): dynamics of another run are left out of this model's report, never mixed in
DYNAMICS=results/dynamics/dynamics.jsonl
if [ "$(cat results/dynamics/.model-sha256 2>/dev/null)" != "$(sha256sum "$MODEL/model.pt" | cut -d' ' -f1)" ]; then
  echo "report_de_en: results/dynamics is not of this model's training run: C5 left out" >&2
  DYNAMICS="$DYNAMICS (not of this model's training run)"
fi
L0=results/voita/compare.jsonl
L0_ENCODER=results/voita/encoder-only/compare.jsonl  # Voita's main experiment: the V claim's verdict when there
fairseq-headprune report "$BIN" --path "$MODEL/model.pt" --gen-subset test --beam 5 --max-tokens 4000 \
  --bpe subword_nmt --bpe-codes "$MODEL/code" --tokenizer moses -s de -t en \
  --references data/multi30k-test2016/test.en --importance-subset valid --results-dir "$OUT" \
  --keep-one-select loss \
  --dynamics "$DYNAMICS" $([ -f "$L0" ] && echo --l0-sweep "$L0") \
  $([ -f "$L0_ENCODER" ] && echo --l0-encoder-sweep "$L0_ENCODER") \
  --note "Full size: Multi30k test2016 (1000 sentences), beam 5; I_h on Multi30k val. Made by recipes/report_de_en.sh." \
  "$@"
