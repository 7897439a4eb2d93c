#!/usr/bin/env bash
# The raw text of the En-Fr recipes (recipes/compress_en_fr.sh, recipes/vocab_trim_en_fr.sh) in WORK/raw: train, a
# 30k-pair slice of the bundled model's own training corpora (Europarl sample A, the first 5000 Bible and 5000
# LibreOffice pairs); valid, newstest2013's first 1000 (Moses-tokenised in the data); test, newstest2014 (3003);
# mtnt, MTNT's En-Fr test set (1020).
# usage: recipes/en_fr_raw.sh WORK   (a file already written is kept)
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:?usage: recipes/en_fr_raw.sh WORK}
data=../shared/data
mkdir -p "$work/raw"
for l in en fr; do
  [ -f "$work/raw/train.$l" ] || { cat "$data/europarl_en_fr/europarl-v7.sampleA.$l"
    head -n 5000 "$data/bible_fr_en/train.$l"; head -n 5000 "$data/libreoffice_help_en_fr/train.$l"; } > "$work/raw/train.$l"
  head -n 1000 "$data/wmt14_en_fr/newstest2013.tok.$l" > "$work/raw/valid.$l"
  cp "$data/wmt14_en_fr/newstest2014-fren.$l" "$work/raw/test.$l"
  cp "$data/mtnt/test.en-fr.$l" "$work/raw/mtnt.$l"
done
