#!/usr/bin/env bash
# sacreBLEU of a model on binarised subsets: fairseq-generate detokenises (Moses) and removes BPE, sacrebleu
# scores against the raw references kept beside the binaries (prep/SUBSET.raw.TGT or SUBSET.raw.TGT).
#
# usage: recipes/eval_bleu.sh DATA_BIN CHECKPOINT BPE_CODES SRC TGT SUBSET:REF_FILE[:lc] ... 
#   ':lc' is for references that are Moses-tokenised (with XML escapes, no dash splitting) and lowercased, as
#   IWSLT14's: hypotheses get the same treatment and sacreBLEU scores with --tokenize none
# USER_DIR=fairseq_headprune: for checkpoints of this package's architectures (headprune_transformer, pruned)
set -euo pipefail
DATA=$1; CKPT=$2; CODES=$3; SRC=$4; TGT=$5; shift 5
user=()
[ -n "${USER_DIR:-}" ] && user=(--user-dir "$USER_DIR" --task translation_headprune)
export PATH=$(dirname "$(readlink -f "$0")")/../.venv/bin:$PATH
export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1  # fairseq checkpoints are trusted pickles (see README)
# --required-batch-size-multiple 1: with fairseq 0.12's default of 8, batch_by_size drops a final remainder of
# sentences (e.g. 4 of 100) without a word
for item in "$@"; do
  IFS=: read -r subset ref mode <<< "$item"
  out=$(mktemp)
  fairseq-generate "$DATA" --path "$CKPT" "${user[@]}" --gen-subset "$subset" --source-lang "$SRC" --target-lang "$TGT" \
    --beam 5 --lenpen 1.0 --max-tokens 4000 --required-batch-size-multiple 1 --tokenizer moses --bpe subword_nmt --bpe-codes "$CODES" \
    2>/dev/null | grep ^D- | sed 's/^D-//' | sort -n | cut -f3 > "$out"
  if [ "${mode:-}" = lc ]; then
    # references are Moses-tokenised and lowercased: tokenise and lowercase the hypotheses the same way
    sacremoses -q -l "$TGT" tokenize -x < "$out" | python -c 'import sys; sys.stdout.writelines(l.lower() for l in sys.stdin)' > "$out.tok"
    score=$(sacrebleu "$ref" -i "$out.tok" --tokenize none -lc -b -w 2); sig=$(sacrebleu "$ref" -i "$out.tok" --tokenize none -lc -w 2 2>/dev/null | python -c "import json,sys; print(json.load(sys.stdin)['signature'])" || true)
  else
    score=$(sacrebleu "$ref" -i "$out" -b -w 2); sig=$(sacrebleu "$ref" -i "$out" -w 2 2>/dev/null | python -c "import json,sys; print(json.load(sys.stdin)['signature'])" || true)
  fi
  printf '%s\t%s\t%s\t%s\n' "$subset" "$(wc -l < "$out")" "$score" "$sig"
  rm -f "$out" "$out.tok"
done
