#!/usr/bin/env bash
# IWSLT14 German-English exactly as fairseq's examples/translation/prepare-iwslt14.sh, with sacremoses instead of
# the Moses perl scripts (data_prep/moses_steps.py): train.tags without the url/talkid/keywords lines and the
# title/description tags, tokenizer.perl -l de|en (XML escapes: &apos; &quot; ...), clean-corpus-n ratio 1.5
# length 1..175, lowercase; valid = every 23rd cleaned training pair, train = the rest; test = dev2010 +
# tedx.dev2012 + tst2010 + tst2011 + tst2012 (xml segments, tokenised, lowercased); joint BPE with 10000 merges
# (subword-nmt) learned on train.de + train.en; fairseq-preprocess --joined-dictionary.
#
# usage: data_prep/prepare-iwslt14.sh [--download] [--merges N] [--code CODE] [--workers N] SOURCE OUT_DIR
#        data_prep/prepare-iwslt14.sh --bpe-only --code CODE [--dict DICT] [--workers N] TOK_DIR OUT_DIR
#   SOURCE   de-en.tgz (IWSLT14 De-En from WIT3, as fairseq mirrors it) or its extracted de-en/ folder. Nothing is
#            downloaded unless --download is given: then SOURCE is where de-en.tgz is saved ($IWSLT14_URL).
#   --code   use these BPE codes instead of learning them.
#   --bpe-only  start from tokenised + lowercased TOK_DIR/{train,valid,test}.{de,en} (train optional; test may
#            also be the five IWSLT14.TED*.de-en.{de,en} files): apply the BPE codes and binarise. Without
#            train and --dict, the joined dictionary is built from the valid split.
# OUT_DIR gets the binaries, dict.{de,en}.txt and code; OUT_DIR/prep the text ({split}.tok.L, {split}.bpe.L).
set -euo pipefail
PROG=prepare-iwslt14
die() { echo "$PROG: error: $*" >&2; exit 2; }
USAGE="usage: prepare-iwslt14.sh [--download] [--merges N] [--code CODE] [--workers N] SOURCE OUT_DIR | prepare-iwslt14.sh --bpe-only --code CODE [--dict DICT] [--workers N] TOK_DIR OUT_DIR"
HERE=$(dirname "$(readlink -f "$0")")
VENV_BIN=$HERE/../.venv/bin
[ -x "$VENV_BIN/subword-nmt" ] && export PATH=$VENV_BIN:$PATH
PY=$(command -v python || command -v python3)
export DATA_PREP_PROG=$PROG
URL=${IWSLT14_URL:-http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz}
SRC=de; TGT=en
TEST_SETS=(IWSLT14.TED.dev2010 IWSLT14.TEDX.dev2012 IWSLT14.TED.tst2010 IWSLT14.TED.tst2011 IWSLT14.TED.tst2012)

DOWNLOAD=0; BPE_ONLY=0; MERGES=10000; CODE=; DICT=; WORKERS=1; POS=()
while [ $# -gt 0 ]; do
  case $1 in
    --download) DOWNLOAD=1 ;;
    --bpe-only) BPE_ONLY=1 ;;
    --merges|--code|--dict|--workers)
      [ $# -ge 2 ] || die "$1 needs a value"
      case $1 in --merges) MERGES=$2 ;; --code) CODE=$2 ;; --dict) DICT=$2 ;; --workers) WORKERS=$2 ;; esac
      shift ;;
    -h|--help) echo "$USAGE"; exit 0 ;;
    -*) die "unknown option $1 ($USAGE)" ;;
    *) POS+=("$1") ;;
  esac
  shift
done
[ ${#POS[@]} -eq 2 ] || die "$USAGE"
IN=${POS[0]}; OUT=${POS[1]}
[[ $MERGES =~ ^[1-9][0-9]*$ ]] || die "--merges must be a positive integer, not '$MERGES'"
[[ $WORKERS =~ ^[1-9][0-9]*$ ]] || die "--workers must be a positive integer, not '$WORKERS'"
if [ -n "$CODE" ]; then
  [ -f "$CODE" ] || die "missing BPE code file $CODE"
  [ -s "$CODE" ] || die "BPE code file $CODE is empty"
fi
[ -z "$DICT" ] || [ -f "$DICT" ] || die "missing dictionary $DICT"
nlines() { "$PY" "$HERE/moses_steps.py" count "$1"; }

# ------------------------------------------------------------------------------------------------- text stage
PREP=$OUT/prep
declare -A TOK=()      # split -> tokenised+lowercased prefix (files PREFIX.de, PREFIX.en)
if [ $BPE_ONLY = 1 ]; then
  [ -n "$CODE" ] || die "--bpe-only needs --code CODE (the BPE codes the text is to be encoded with)"
  [ $DOWNLOAD = 0 ] || die "--download makes no sense with --bpe-only"
  [ -d "$IN" ] || die "missing folder $IN (tokenised, lowercased {train,valid,test}.{de,en})"
  mkdir -p "$PREP"
  for split in train valid test; do
    if [ -f "$IN/$split.$SRC" ] || [ -f "$IN/$split.$TGT" ]; then
      for l in $SRC $TGT; do [ -f "$IN/$split.$l" ] || die "missing $IN/$split.$l (the other side is there)"; done
      TOK[$split]=$IN/$split
    fi
  done
  if [ -z "${TOK[test]:-}" ] && [ -f "$IN/${TEST_SETS[0]}.de-en.$SRC" ]; then   # the five test sets, concatenated
    for l in $SRC $TGT; do
      for t in "${TEST_SETS[@]}"; do [ -f "$IN/$t.de-en.$l" ] || die "missing $IN/$t.de-en.$l"; done
      for t in "${TEST_SETS[@]}"; do cat "$IN/$t.de-en.$l"; done > "$PREP/test.tok.$l"
    done
    TOK[test]=$PREP/test.tok
  fi
  [ ${#TOK[@]} -gt 0 ] || die "no {train,valid,test}.{de,en} in $IN"
  for split in "${!TOK[@]}"; do
    n_src=$(nlines "${TOK[$split]}.$SRC"); n_tgt=$(nlines "${TOK[$split]}.$TGT")
    [ "$n_src" = "$n_tgt" ] || die "${TOK[$split]}.$SRC has $n_src lines but ${TOK[$split]}.$TGT has $n_tgt"
    [ "$n_src" -gt 0 ] || die "${TOK[$split]}.$SRC is empty"
  done
else
  if [ ! -e "$IN" ]; then
    [ $DOWNLOAD = 1 ] || die "$IN not found: give de-en.tgz or its extracted de-en/ folder, or pass --download to fetch $URL"
    mkdir -p "$(dirname "$IN")"
    if command -v curl > /dev/null; then
      err=$(curl -fsSL --connect-timeout 20 --retry 2 -o "$IN.part" "$URL" 2>&1) || true
    elif command -v wget > /dev/null; then
      err=$(wget -q -T 20 -t 2 -O "$IN.part" "$URL" 2>&1) || true
    else
      die "--download needs curl or wget"
    fi
    if [ ! -s "$IN.part" ]; then
      rm -f "$IN.part"
      die "download of $URL failed (offline? $(echo "${err:-no data}" | tr '\n' ' ' | sed 's/ *$//'))"
    fi
    mv "$IN.part" "$IN"
    echo "downloaded $URL to $IN" >&2
  fi
  if [ -d "$IN" ]; then
    ORIG=$IN
  else
    mkdir -p "$PREP/orig"
    tar -xzf "$IN" -C "$PREP/orig" 2> /dev/null || die "cannot extract $IN (not a .tgz archive?)"
    ORIG=$PREP/orig
  fi
  # the de-en folder itself, or a folder holding it
  found=$(find "$ORIG" -maxdepth 2 -name "train.tags.de-en.$SRC" -print -quit)
  [ -n "$found" ] || die "no train.tags.de-en.$SRC in $IN: not IWSLT14 de-en data"
  ORIG=$(dirname "$found")
  "$PY" "$HERE/moses_steps.py" prepare --workers "$WORKERS" "$ORIG" "$PREP"
  for split in train valid test; do TOK[$split]=$PREP/$split.tok; done
fi

# ------------------------------------------------------------------------------------------------------- BPE
mkdir -p "$OUT"
if [ -n "$CODE" ]; then
  [ "$(readlink -f "$CODE")" = "$(readlink -f "$OUT/code")" ] || cp "$CODE" "$OUT/code"
else
  echo "learning $MERGES joint BPE merges on train.$SRC + train.$TGT" >&2
  cat "${TOK[train]}.$SRC" "${TOK[train]}.$TGT" | subword-nmt learn-bpe -s "$MERGES" > "$OUT/code" \
    2> "$PREP/learn-bpe.log" || die "subword-nmt learn-bpe failed: see $PREP/learn-bpe.log"
fi
for split in "${!TOK[@]}"; do
  for l in $SRC $TGT; do
    subword-nmt apply-bpe -c "$OUT/code" < "${TOK[$split]}.$l" > "$PREP/$split.bpe.$l"
  done
done

# -------------------------------------------------------------------------------------------------- binarise
: > "$PREP/preprocess.log"
args=(--source-lang $SRC --target-lang $TGT --joined-dictionary --destdir "$OUT" --workers "$WORKERS")
for split in train valid test; do
  [ -z "${TOK[$split]:-}" ] || args+=("--${split}pref" "$PREP/$split.bpe")
done
rm -f "$PREP/dict.joined.txt"
if [ -n "$DICT" ]; then
  cp "$DICT" "$PREP/dict.joined.txt"
elif [ -z "${TOK[train]:-}" ]; then
  dsplit=valid; [ -n "${TOK[valid]:-}" ] || dsplit=test
  echo "no train split: joined dictionary built from the $dsplit split (pass --dict to use a model's)" >&2
  rm -rf "$PREP/dict-build"
  fairseq-preprocess --source-lang $SRC --target-lang $TGT --joined-dictionary --dict-only \
    --trainpref "$PREP/$dsplit.bpe" --destdir "$PREP/dict-build" >> "$PREP/preprocess.log" 2>&1 \
    || die "fairseq-preprocess failed: see $PREP/preprocess.log"
  mv "$PREP/dict-build/dict.$SRC.txt" "$PREP/dict.joined.txt"
  rm -rf "$PREP/dict-build"
fi
if [ -f "$PREP/dict.joined.txt" ]; then args+=(--srcdict "$PREP/dict.joined.txt"); fi
rm -f "$OUT/dict.$SRC.txt" "$OUT/dict.$TGT.txt"   # fairseq-preprocess refuses to overwrite them
fairseq-preprocess "${args[@]}" >> "$PREP/preprocess.log" 2>&1 || die "fairseq-preprocess failed: see $PREP/preprocess.log"
counts=""
for split in train valid test; do
  [ -z "${TOK[$split]:-}" ] || counts="$counts $split=$(nlines "$PREP/$split.bpe.$SRC")"
done
echo "binarised IWSLT14 $SRC-$TGT into $OUT:$counts" >&2
