#!/usr/bin/env bash
# The bundled En-Fr model's vocabulary trimmed to the tokens of its own training data (results/vocab-trim-en-fr):
# the 30k-pair slice of its training corpora that recipes/compress_en_fr.sh builds (Europarl, Bible, LibreOffice),
# its English side kept for the encoder, its French side for the decoder and the output layer (the joint 8.3k
# dictionaries are not shared: each side trimmed on its own), no floor. Both models exported to CTranslate2 int8 and
# decoded on newstest2014 (3003 sentences) and MTNT En-Fr (1020), neither of which the choice of tokens read:
# BLEU and chrF with paired-bootstrap p, speed at equal work on newstest2013's first 1000, bytes and memory
# (benchmarks/vocab_trim.py). About 10 CPU minutes.
#
# usage: recipes/vocab_trim_en_fr.sh [WORK]   (work/vocab-trim-en-fr). Resumable.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-work/vocab-trim-en-fr}
export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1 TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
data=../shared/data model=checkpoints/en-fr bin=$work/data-bin trim=$work/trimmed tbin=$work/data-bin-trimmed
out=results/vocab-trim-en-fr
mkdir -p "$work/raw" "$trim" "$out"
bash recipes/en_fr_raw.sh "$work"
encode() {  # MODEL_DIR OUT SPLIT: the split binarised with that model's dictionaries
  [ -f "$2/$3.en-fr.en.idx" ] || bash data_prep/encode-for-model.sh "$1" en fr "$work/raw/$3" "$2" "$3" \
    $([ "$3" = valid ] && echo --tokenized) > "$work/encode-$(basename "$2")-$3.log" 2>&1
}
for split in train test mtnt valid; do encode "$model" "$bin" "$split"; done
dec=(--beam 5 --batch-size 64 --max-len-a 1.5 --max-len-b 10 --tokenizer moses --bpe subword_nmt --bpe-codes "$model/code")
[ -f "$trim/model.pt" ] || fairseq-headprune shrink "$bin" --path "$model/model.pt" -s en -t fr \
  --keep-vocab "$bin/prep/train.bpe.en" "$bin/prep/train.bpe.fr" --out "$trim/model.pt" 2>&1 | tee "$work/shrink.log"
cp "$model/code" "$trim/code"
for split in valid test; do encode "$trim" "$tbin" "$split"; done
[ -f "$work/ct2-untrimmed/model.bin" ] || fairseq-headprune export-ct2 "$bin" --path "$model/model.pt" -s en -t fr \
  --out "$work/ct2-untrimmed" --quantization int8 --gen-subset valid "${dec[@]}" 2>&1 | tee "$work/export-untrimmed.log"
[ -f "$work/ct2-trimmed/model.bin" ] || fairseq-headprune export-ct2 "$tbin" --path "$trim/model.pt" -s en -t fr \
  --out "$work/ct2-trimmed" --quantization int8 --gen-subset valid "${dec[@]}" 2>&1 | tee "$work/export-trimmed.log"
python - "$trim/model.json" "$out/trimmed.json" <<'PY'  # the trim's record without this machine's paths or the id map
import json, os, sys
record = json.load(open(sys.argv[1]))["vocabulary"]
record.pop("kept_ids")
for corpus in record["corpora"]:
    corpus["path"] = os.path.basename(corpus["path"])
json.dump(record, open(sys.argv[2], "w"), indent=1)
PY
python benchmarks/vocab_trim.py "$bin" --path "$model/model.pt" -s en -t fr --untrimmed "$work/ct2-untrimmed" \
  --trimmed "$work/ct2-trimmed" --subsets "test=$bin/test.raw.fr,mtnt=$bin/mtnt.raw.fr" --timing-subset valid \
  --out "$out/vocab-trim.json" --gen-subset test "${dec[@]}" 2>&1 | tee "$work/vocab-trim.log"
