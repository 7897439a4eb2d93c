#!/usr/bin/env bash
# `compress` on the bundled En-Fr model (results/compress-en-fr): the data of results/recover-en-fr (a 30k-pair slice
# of the model's own training corpora to calibrate and recover on, the first 1000 sentences of newstest2013 as
# valid: early stopping and timing), newstest2014 (all 3003 sentences) reported, and MTNT's En-Fr test set (Reddit
# text, 1020 sentences) as a second set held out of every choice and every training run; both decoded once, at the
# end. Two recovery epochs (an epoch of this slice is 520 updates, ~22 CPU minutes; results/recover-en-fr found the
# first epoch best on valid).
#
# usage: [MONO=1] recipes/compress_en_fr.sh [WORK] [TARGET]   (work/compress-en-fr, "--speedup 1.5"). Resumable.
# TARGET "control": the control instead, the unpruned model through compress's recovery (its defaults, 2 epochs,
# every epoch kept) on the same data, scored as compress scores (benchmarks/engine_bleu.py) into
# results/compress-en-fr/control-bleu.json (about 50 CPU minutes).
# MONO=1: recover beside in-domain English the unpruned model translates (--distill-source WORK/raw/mono.en, 2852
# sentences no table scores: newstest2013 after its first 1000, detokenised, and MTNT's En-Fr valid set); the run's
# name ends in -mono, the control's file is control-mono-bleu.json.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-work/compress-en-fr} target=${2:---speedup 1.5}
export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1 TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
data=../shared/data model=checkpoints/en-fr bin=$work/data-bin
mkdir -p "$work/raw"
bash recipes/en_fr_raw.sh "$work"
if [ ! -f "$work/raw/mono.en" ]; then
  { tail -n +1001 "$data/wmt14_en_fr/newstest2013.tok.en" | sacremoses -l en -j 1 detokenize
    cat "$data/mtnt/valid.en-fr.en"; } > "$work/raw/mono.en.part"
  mv "$work/raw/mono.en.part" "$work/raw/mono.en"
fi
mono=() suffix=
[ -z "${MONO:-}" ] || mono=(--distill-source "$work/raw/mono.en") suffix=-mono
for split in train test mtnt valid; do
  [ -f "$bin/$split.en-fr.en.idx" ] || bash data_prep/encode-for-model.sh "$model" en fr "$work/raw/$split" "$bin" \
    "$split" $([ $split = valid ] && echo --tokenized) > "$work/encode-$split.log" 2>&1
done
dec=(--beam 5 --batch-size 64 --max-len-a 1.5 --max-len-b 10 --tokenizer moses --bpe subword_nmt --bpe-codes "$model/code")
if [ "$target" = control ]; then
  ctl=$work/control$suffix run=$work/control$suffix/run && mkdir -p "$ctl"
  [ -f "$run/checkpoint2.pt" ] || fairseq-headprune recover "$bin" --path "$model/model.pt" --teacher "$model/model.pt" \
    --out "$ctl/ctl.pt" --force --epochs 2 --work-dir "$run" -s en -t fr "${mono[@]}" \
    ${mono:+--tokenizer moses --bpe subword_nmt --bpe-codes "$model/code"} >> "$ctl.log" 2>&1
  note="ctl$suffix-e1, ctl$suffix-e2: the unpruned model through compress's recovery (its defaults, 2 epochs, every \
epoch kept) on the same 30k-pair slice${mono:+ beside the same 2852 teacher-translated in-domain English sentences \
(--distill-source mono.en)}, valid the first 1000 newstest2013 sentences (${MONO:+MONO=1 }recipes/compress_en_fr.sh \
WORK control): a control trained as long as the 2-epoch${mono:+ -mono} students"
  python benchmarks/engine_bleu.py "$bin" --path "$model/model.pt" --other "ctl$suffix-e1=$run/checkpoint1.pt" \
    --other "ctl$suffix-e2=$run/checkpoint2.pt" --subsets "test=$bin/test.raw.fr,mtnt=$bin/mtnt.raw.fr" --engine ct2-int8 \
    --out "results/compress-en-fr/control$suffix-bleu.json" --note "$note" -s en -t fr "${dec[@]}" 2>&1 |
    tee -a "$ctl.log"
  exit 0
fi
name=$(echo "$target" | tr -d ' %-' | tr ./ _- | tr := --)$suffix
# shellcheck disable=SC2086
fairseq-headprune compress "$bin" --path "$model/model.pt" -s en -t fr --out "$work/en-fr-$name" $target --engine ct2-int8 \
  --budget-epochs 2 --gen-subset test --references "$bin/test.raw.fr" --also-report mtnt \
  --also-references "$bin/mtnt.raw.fr" "${dec[@]}" "${mono[@]}" ${STOP:+--stop-after $STOP} \
  2>&1 | tee -a "$work/en-fr-$name.log"
