#!/usr/bin/env bash
# The bundled De-En model with half of its heads physically removed (results/de-en/pruned-50/), and the proof that
# stock fairseq-generate runs it: the 72 heads the importance order prunes at 50% (`prune`, as in the report) are
# cut out by `remove` (checked against the masked model before saving), the result stored in fp16 like the
# bundled model (lossless: its weights were fp16 to begin with), then decoded by fairseq-generate with this package
# as user module, next to the unpruned model with the same heads masked (`--mask-heads`). The two hypothesis
# files must be identical; sacreBLEU scores both.
#
# usage: recipes/prune_de_en_50.sh [HEADS_JSON] [OUT_DIR]
#   HEADS_JSON  default results/report-de-en/heads-importance-50.json (written by recipes/report_de_en.sh's prune:
#               the first 72 heads of the whole-model importance order)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
HEADS=${1:-results/report-de-en/heads-importance-50.json}
OUT=${2:-results/de-en/pruned-50}
MODEL=checkpoints/de-en
BIN=${BIN:-work/de-en/data-bin}
REF=data/multi30k-test2016/test.en
TMP=${TMP_DIR:-work/de-en/pruned-50}
[ -f "$HEADS" ] || { echo "prune_de_en_50: error: no $HEADS (run recipes/report_de_en.sh --parts score,single,prune)" >&2; exit 2; }
[ -f "$BIN/test.de-en.de.bin" ] || bash data_prep/encode-for-model.sh "$MODEL" de en data/multi30k-test2016/test "$BIN" test
mkdir -p "$OUT" "$TMP"
fairseq-headprune remove "$BIN" --path "$MODEL/model.pt" --gen-subset test --max-tokens 4000 --heads "@$HEADS" \
  --out "$TMP/model-fp32.pt"
python recipes/bundle_checkpoint.py "$OUT/model.pt" "$TMP/model-fp32.pt"
cp "$HEADS" "$OUT/removed-heads.json"

GEN=(--gen-subset test -s de -t en --beam 5 --max-tokens 4000 --required-batch-size-multiple 1
     --tokenizer moses --bpe subword_nmt --bpe-codes "$MODEL/code" --user-dir fairseq_headprune
     --task translation_headprune)
hyps() { grep ^D- | sed 's/^D-//' | sort -n | cut -f3; }
fairseq-generate "$BIN" --path "$OUT/model.pt" "${GEN[@]}" 2> "$TMP/pruned.log" | hyps > "$OUT/test.pruned.en"
fairseq-generate "$BIN" --path "$MODEL/model.pt" --mask-heads "@$HEADS" "${GEN[@]}" 2> "$TMP/masked.log" \
  | hyps > "$OUT/test.masked.en"
{
  echo "pruned model (fairseq-generate --path $OUT/model.pt):"
  sacrebleu "$REF" -i "$OUT/test.pruned.en" -w 2
  echo "unpruned model, same heads masked (--mask-heads @$HEADS):"
  sacrebleu "$REF" -i "$OUT/test.masked.en" -w 2
  if cmp -s "$OUT/test.pruned.en" "$OUT/test.masked.en"; then
    echo "hypotheses identical: $(wc -l < "$OUT/test.pruned.en") sentences"
  else
    echo "hypotheses DIFFER: $(diff "$OUT/test.pruned.en" "$OUT/test.masked.en" | grep -c '^<') of $(wc -l < "$OUT/test.pruned.en")"
  fi
  python - "$MODEL/model.pt" "$OUT/model.pt" <<'PY'
import os, sys
import torch
for path in sys.argv[1:]:
    state = torch.load(path, map_location="cpu", weights_only=False)
    n = sum(t.numel() for t in {t.untyped_storage().data_ptr(): t for t in state["model"].values()}.values())
    print(f"{path}: {n:,} parameters, {os.path.getsize(path) / 2**20:.1f} MiB")
PY
} | tee "$OUT/check.txt"
