#!/usr/bin/env bash
# WMT14 English->French as fairseq's examples/translation/prepare-wmt14en2fr.sh, with sacremoses instead of the
# Moses perl scripts (data_prep/moses_steps.py): punctuation normalisation + non-printing characters removed +
# tokenizer.perl -a on every set; joint BPE (default 40000 merges, subword-nmt) learned on train.en + train.fr;
# train cleaned after BPE (clean-corpus-n ratio 1.5, length 1..250); fairseq-preprocess --joined-dictionary.
# valid = newstest2013, test = newstest2014 (full, 3003 sentences). Their plain text is kept beside the binaries
# as valid.raw.{en,fr} and test.raw.{en,fr} (the references for sacreBLEU).
#
# usage: data_prep/prepare-wmt14en2fr.sh [--train DIR] [--data DIR] [--test-dir DIR] [--valid-dir DIR]
#                                        [--test-format auto|raw|sgm] [--merges N] [--code CODE] [--workers N] OUT_DIR
#   --train DIR  the WMT14 training corpora: every FILE.en / FILE.en.gz with a FILE.fr / FILE.fr.gz beside it,
#                searched recursively (fairseq's: europarl-v7, commoncrawl, un, news-commentary-v9, giga-fren);
#                dev/test sets (newstest*, news-test*, newssyscomb*, newsdev*) are never trained on; FILE.tok.*
#                is Moses-tokenised text, detokenised first. Without --train: the local corpora of the shared
#                data folder (Europarl samples A + B, Bible Fr-En train, LibreOffice help En-Fr train).
#   --data DIR   the shared data folder (default: ../shared/data beside the project).
#   --test-dir DIR  newstest2014 as newstest2014-fren.{en,fr} (raw) or newstest2014-fren-src.en.sgm +
#                newstest2014-fren-ref.fr.sgm; newstest2013 as newstest2013.{en,fr} (raw),
#                newstest2013-src.en.sgm + newstest2013-ref.fr.sgm, or newstest2013.tok.{en,fr} (Moses-tokenised:
#                detokenised and unescaped). Default: DATA/wmt14_en_fr. --test-format picks the newstest2014 form
#                (auto: raw when present, else sgm).
#   --valid-dir DIR  where newstest2013 is, if not in the test folder (WMT's dev.tgz: dev/).
set -euo pipefail
PROG=prepare-wmt14en2fr
die() { echo "$PROG: error: $*" >&2; exit 2; }
USAGE="usage: prepare-wmt14en2fr.sh [--train DIR] [--data DIR] [--test-dir DIR] [--valid-dir DIR] [--test-format auto|raw|sgm] [--merges N] [--code CODE] [--workers N] OUT_DIR"
HERE=$(dirname "$(readlink -f "$0")")
VENV_BIN=$HERE/../.venv/bin
[ -x "$VENV_BIN/subword-nmt" ] && export PATH=$VENV_BIN:$PATH
PY=$(command -v python || command -v python3)
export DATA_PREP_PROG=$PROG
HELPER=$HERE/moses_steps.py
SRC=en; TGT=fr

TRAIN_DIR=; DATA=$(readlink -m "$HERE/../../shared/data"); TEST_DIR=; VALID_DIR=; TEST_FORMAT=auto; MERGES=40000; CODE=
WORKERS=1; POS=()
while [ $# -gt 0 ]; do
  case $1 in
    --train|--data|--test-dir|--valid-dir|--test-format|--merges|--code|--workers)
      [ $# -ge 2 ] || die "$1 needs a value"
      case $1 in
        --train) TRAIN_DIR=$2 ;; --data) DATA=$2 ;; --test-dir) TEST_DIR=$2 ;; --valid-dir) VALID_DIR=$2 ;;
        --test-format) TEST_FORMAT=$2 ;;
        --merges) MERGES=$2 ;; --code) CODE=$2 ;; --workers) WORKERS=$2 ;;
      esac
      shift ;;
    -h|--help) echo "$USAGE"; exit 0 ;;
    -*) die "unknown option $1 ($USAGE)" ;;
    *) POS+=("$1") ;;
  esac
  shift
done
[ ${#POS[@]} -eq 1 ] || die "$USAGE"
OUT=${POS[0]}
TEST_DIR=${TEST_DIR:-$DATA/wmt14_en_fr}
VALID_DIR=${VALID_DIR:-$TEST_DIR}
[[ $MERGES =~ ^[1-9][0-9]*$ ]] || die "--merges must be a positive integer, not '$MERGES'"
[[ $WORKERS =~ ^[1-9][0-9]*$ ]] || die "--workers must be a positive integer, not '$WORKERS'"
case $TEST_FORMAT in auto|raw|sgm) ;; *) die "--test-format must be auto, raw or sgm, not '$TEST_FORMAT'" ;; esac
if [ -n "$CODE" ]; then [ -s "$CODE" ] || die "missing or empty BPE code file $CODE"; fi
[ -d "$TEST_DIR" ] || die "missing test folder $TEST_DIR (newstest2014, and newstest2013 unless --valid-dir)"
[ -d "$VALID_DIR" ] || die "missing valid folder $VALID_DIR (newstest2013)"

# text of a file, gzipped or not, always ending with a newline (so that files concatenate line by line)
emit() { case $1 in *.gz) gzip -dc "$1" ;; *) cat "$1" ;; esac | sed -e '$a\'; }
nlines() { emit "$1" | wc -l; }
same_length() {   # FILE_SRC FILE_TGT [WHAT]: one-line error unless they have as many lines
  local a b
  for f in "$1" "$2"; do [ -f "$f" ] || die "missing $f"; done
  a=$(nlines "$1"); b=$(nlines "$2")
  [ "$a" = "$b" ] || die "$1 has $a lines but $2 has $b${3:+ ($3)}"
  [ "$a" -gt 0 ] || die "$1 is empty"
}

# ------------------------------------------------------------------------------------------- training corpora
CORPORA=()     # file prefixes P with P.en(.gz) and P.fr(.gz)
declare -A SEEN=()
if [ -n "$TRAIN_DIR" ]; then
  [ -d "$TRAIN_DIR" ] || die "missing training folder $TRAIN_DIR"
  while IFS= read -r f; do
    case $f in *.gz) p=${f%.en.gz} ;; *) p=${f%.en} ;; esac
    case $(basename "$p") in
      newstest*|news-test*|newsdev*|newssyscomb*) echo "not training on test set $f" >&2; continue ;;
    esac
    [ -z "${SEEN[$p]:-}" ] || continue   # FILE.en and FILE.en.gz: once
    SEEN[$p]=1
    if [ -f "$p.$TGT" ] || [ -f "$p.$TGT.gz" ]; then CORPORA+=("$p")
    else echo "skipping $f: no $p.$TGT beside it" >&2; fi
  done < <(find "$(readlink -m "$TRAIN_DIR")" -path "$(readlink -m "$OUT")" -prune -o -type f \
             \( -name "*.$SRC" -o -name "*.$SRC.gz" \) -print | LC_ALL=C sort)   # never OUT_DIR's own files
  [ ${#CORPORA[@]} -gt 0 ] || die "no parallel FILE.$SRC + FILE.$TGT pair in $TRAIN_DIR"
else
  for p in europarl_en_fr/europarl-v7.sampleA europarl_en_fr/europarl-v7.sampleB.tok bible_fr_en/train \
           libreoffice_help_en_fr/train; do
    if [ -f "$DATA/$p.$SRC" ]; then CORPORA+=("$DATA/$p")
    else echo "local corpus $DATA/$p.$SRC not found: skipped" >&2; fi
  done
  [ ${#CORPORA[@]} -gt 0 ] || die "no training corpus: pass --train DIR (the WMT14 corpora) or --data DIR (the shared data folder)"
fi
side() { if [ -f "$1.$2" ]; then echo "$1.$2"; elif [ -f "$1.$2.gz" ]; then echo "$1.$2.gz"; else echo "$1.$2"; fi; }
for p in "${CORPORA[@]}"; do
  s=$(side "$p" $SRC); t=$(side "$p" $TGT)
  [ -f "$s" ] || die "missing $s"; [ -f "$t" ] || die "missing $t"
  same_length "$s" "$t"
done

# ------------------------------------------------------------------------------------- valid and test sets
sgm_pair() {   # SRC_SGM TGT_SGM SPLIT: segments of both sides, entities unescaped
  for f in "$1" "$2"; do [ -f "$f" ] || die "missing $f"; done
  "$PY" "$HELPER" sgm "$1" > "$OUT/$3.raw.$SRC"
  "$PY" "$HELPER" sgm "$2" > "$OUT/$3.raw.$TGT"
}
PREP=$OUT/prep
mkdir -p "$PREP"
T=$VALID_DIR
# valid = newstest2013
if [ -f "$T/newstest2013.$SRC" ] || [ -f "$T/newstest2013.$TGT" ]; then
  same_length "$T/newstest2013.$SRC" "$T/newstest2013.$TGT" "newstest2013"
  for l in $SRC $TGT; do emit "$T/newstest2013.$l" > "$OUT/valid.raw.$l"; done
elif [ -f "$T/newstest2013-src.$SRC.sgm" ]; then
  sgm_pair "$T/newstest2013-src.$SRC.sgm" "$T/newstest2013-ref.$TGT.sgm" valid
elif [ -f "$T/newstest2013.tok.$SRC" ] || [ -f "$T/newstest2013.tok.$TGT" ]; then
  same_length "$T/newstest2013.tok.$SRC" "$T/newstest2013.tok.$TGT" "newstest2013"
  for l in $SRC $TGT; do "$PY" "$HELPER" detokenize -l $l "$T/newstest2013.tok.$l" "$OUT/valid.raw.$l"; done
else
  die "missing newstest2013 in $T (newstest2013.$SRC/.$TGT, newstest2013-src.$SRC.sgm or newstest2013.tok.$SRC)"
fi
# test = newstest2014 (full)
T=$TEST_DIR
RAW14=$T/newstest2014-fren; SGM14=$T/newstest2014-fren
if [ $TEST_FORMAT = auto ]; then
  if [ -f "$RAW14.$SRC" ] || [ -f "$RAW14.$TGT" ]; then TEST_FORMAT=raw; else TEST_FORMAT=sgm; fi
fi
if [ $TEST_FORMAT = raw ]; then
  same_length "$RAW14.$SRC" "$RAW14.$TGT" "newstest2014"
  for l in $SRC $TGT; do emit "$RAW14.$l" > "$OUT/test.raw.$l"; done
else
  sgm_pair "$SGM14-src.$SRC.sgm" "$SGM14-ref.$TGT.sgm" test
fi
for split in valid test; do same_length "$OUT/$split.raw.$SRC" "$OUT/$split.raw.$TGT" "$split segments"; done

# ---------------------------------------------------------------------------- training text (raw)
for l in $SRC $TGT; do : > "$PREP/train.raw.$l"; done
for p in "${CORPORA[@]}"; do
  n=$(nlines "$(side "$p" $SRC)")
  echo "training corpus $p: $n pairs$(case $p in *.tok) echo ', Moses-tokenised: detokenised first' ;; esac)" >&2
  for l in $SRC $TGT; do
    case $p in
      *.tok) emit "$(side "$p" $l)" | "$PY" "$HELPER" detokenize -l $l >> "$PREP/train.raw.$l" ;;
      *) emit "$(side "$p" $l)" >> "$PREP/train.raw.$l" ;;
    esac
  done
done

# ------------------------------------------------------------------------------------ tokenise, BPE, clean
echo "tokenising (normalise punctuation, remove non-printing characters, tokenizer -a)" >&2
for l in $SRC $TGT; do
  "$PY" "$HELPER" tokenize -l $l -a --normalize --workers "$WORKERS" \
    "$PREP/train.raw.$l" "$PREP/train.tok.$l" "$OUT/valid.raw.$l" "$PREP/valid.tok.$l" \
    "$OUT/test.raw.$l" "$PREP/test.tok.$l"
done
if [ -n "$CODE" ]; then
  [ "$(readlink -f "$CODE")" = "$(readlink -f "$OUT/code")" ] || cp "$CODE" "$OUT/code"
else
  echo "learning $MERGES joint BPE merges on train.$SRC + train.$TGT" >&2
  cat "$PREP/train.tok.$SRC" "$PREP/train.tok.$TGT" | subword-nmt learn-bpe -s "$MERGES" > "$OUT/code" \
    2> "$PREP/learn-bpe.log" || die "subword-nmt learn-bpe failed: see $PREP/learn-bpe.log"
fi
for split in train valid test; do
  for l in $SRC $TGT; do
    subword-nmt apply-bpe -c "$OUT/code" < "$PREP/$split.tok.$l" > "$PREP/$split.bpe.$l"
  done
done
"$PY" "$HELPER" clean --ratio 1.5 "$PREP/train.bpe" $SRC $TGT "$PREP/train.clean" 1 250

# ---------------------------------------------------------------------------------------------- binarise
rm -f "$OUT/dict.$SRC.txt" "$OUT/dict.$TGT.txt"   # fairseq-preprocess refuses to overwrite them
fairseq-preprocess --source-lang $SRC --target-lang $TGT --joined-dictionary --thresholdsrc 0 --thresholdtgt 0 \
  --trainpref "$PREP/train.clean" --validpref "$PREP/valid.bpe" --testpref "$PREP/test.bpe" \
  --destdir "$OUT" --workers "$WORKERS" > "$PREP/preprocess.log" 2>&1 \
  || die "fairseq-preprocess failed: see $PREP/preprocess.log"
echo "binarised WMT14 $SRC-$TGT into $OUT: train=$(nlines "$PREP/train.clean.$SRC") valid=$(nlines "$OUT/valid.raw.$SRC") test=$(nlines "$OUT/test.raw.$SRC") (raw references: $OUT/{valid,test}.raw.{$SRC,$TGT})" >&2
