#!/usr/bin/env bash
# Removal's speed bar: generation speed of the bundled De-En model with 50% of its heads removed (chosen by
# importance on Multi30k val), at batch sizes 1/4/16/64, against the unpruned and the masked model, with the
# FLOP bound; then the same on the papers' IWSLT 8-head shape (d=512, FFN 1024) with random weights and 50% of
# heads removed at random, where attention weighs more. Run on an otherwise idle machine: the numbers are
# ratios measured side by side, but contention adds noise.
#
# usage: benchmarks/pruned_speed.sh [SHARED_DATA_DIR] [WORK_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-../shared/data}
WORK=${2:-work/bench-speed}
export PATH=$PWD/.venv/bin:$PATH OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
MODEL=checkpoints/de-en
mkdir -p "$WORK"
[ -f "$WORK/val/valid.de-en.de.bin" ] || \
  bash data_prep/encode-for-model.sh "$MODEL" de en "$DATA/multi30k/val" "$WORK/val" valid
[ -f "$WORK/test/test.de-en.de.bin" ] || \
  bash data_prep/encode-for-model.sh "$MODEL" de en data/multi30k-test2016/test "$WORK/test" test
mkdir -p "$WORK/de-en-same-work"
fairseq-headprune score "$WORK/val" --path "$MODEL/model.pt" --gen-subset valid --results-dir "$WORK/de-en"
python - "$WORK/de-en" <<'PY'
import json, sys
from fairseq_headprune.studies.ranking import heads_to_json, importance_scores, rank_by_scores
scores = importance_scores(f"{sys.argv[1]}/importance.json")
ranked = rank_by_scores(scores, sorted(scores))
json.dump(heads_to_json(ranked[: len(ranked) // 2]), open(f"{sys.argv[1]}/heads-50.json", "w"))
PY
fairseq-headprune speed "$WORK/test" --path "$MODEL/model.pt" --gen-subset test --heads "@$WORK/de-en/heads-50.json" \
  --results-dir "$WORK/de-en" --beam 5 --runs 3 --num-sentences 128 | tee "$WORK/de-en/speed.txt"
# The same with the same work for all three models: every hypothesis exactly 20 tokens (a pruned model that
# writes shorter or longer translations than the unpruned one otherwise mixes output length into the speed-up)
fairseq-headprune speed "$WORK/test" --path "$MODEL/model.pt" --gen-subset test --heads "@$WORK/de-en/heads-50.json" \
  --results-dir "$WORK/de-en-same-work" --beam 5 --runs 3 --num-sentences 128 --max-len-a 0 --max-len-b 20 \
  --min-len 20 | tee "$WORK/de-en-same-work/speed.txt"

# The IWSLT 8-head shape, random weights (one update of fairseq-train creates a loadable checkpoint)
if [ ! -f "$WORK/iwslt8/checkpoint_last.pt" ]; then
  fairseq-train "$WORK/test" --user-dir fairseq_headprune --task translation_headprune \
    --arch headprune_transformer_iwslt_de_en_8head --share-all-embeddings --train-subset test --valid-subset test \
    --optimizer adam --lr 1e-9 --max-tokens 2000 --max-update 1 --disable-validation --no-epoch-checkpoints \
    --no-save-optimizer-state --save-dir "$WORK/iwslt8" > "$WORK/iwslt8.log" 2>&1
fi
python - "$WORK/iwslt8" <<'PY'
import json, random, sys
from fairseq_headprune.studies.ranking import heads_to_json
from fairseq_headprune.core.heads import Head
heads = [Head(t, l, h) for t in ("enc-self", "enc-dec", "dec-self") for l in range(1, 7) for h in range(1, 9)]
json.dump(heads_to_json(random.Random(1).sample(heads, len(heads) // 2)), open(f"{sys.argv[1]}/heads-50.json", "w"))
PY
# random weights never choose EOS: every model writes exactly 30 tokens, so the work compared is the same
fairseq-headprune speed "$WORK/test" --path "$WORK/iwslt8/checkpoint_last.pt" --gen-subset test \
  --heads "@$WORK/iwslt8/heads-50.json" --results-dir "$WORK/iwslt8" --beam 5 --runs 3 --num-sentences 128 \
  --max-len-a 0 --max-len-b 30 --min-len 30 | tee "$WORK/iwslt8/speed.txt"
