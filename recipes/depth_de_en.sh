#!/usr/bin/env bash
# The depth study on the bundled De-En model (results/depth-de-en/): whole decoder layers removed with
# `shrink --keep-layers`, alone or with a head budget, towards 2x in CTranslate2 int8 at equal work.
#
# Data: Multi30k train MINUS its last 1000 sentences (train: calibration and recovery), those 1000 as `heldout` (a
# second held-out De-En set that neither calibration nor recovery reads), val as `valid` (every choice), test2016
# as `test` (decoded once at the end).
#
# usage: recipes/depth_de_en.sh [WORK] [LANE]   (WORK: work/depth)
#   LANE sel   the layer selection rule: layers alone (dec:3 and dec:2), greedy calibration loss against Shleifer &
#              Rush's evenly spaced layers, scored on val (benchmarks/depth_study.py --subset valid)
#   LANE cand  the 2.0x candidates (decoder 3 layers x 3 heads, 2 layers x 4 heads) with the window fit, SEL=rule
#   LANE rec   recover the chosen candidate for 8 epochs (CAND=name), resumable
#   LANE ctl   the control: the unpruned model through the same recovery on the same reduced train, every epoch kept
#              (EPOCHS=6 as the chosen candidate; its epoch 4 is also the control of results/compress-de-en)
#   LANE ffn   FFN units against the other levers at about the same crude speed (1.1-1.2x), before recovery:
#              every FFN at 50% of its units, the decoder at 5 layers, the decoder at 6 of 8 heads (scored on val)
#   LANE levers  after ffn: its three models timed in CTranslate2 int8 at equal work in one deploy run on val, beside
#              crude slices of the encoder's depth and the FFN's width (results/depth-de-en/levers)
#   LANE eval  valid of everything, then test2016 and heldout decoded once (final models and the unpruned one)
#   LANE deploy  speed in CTranslate2 int8 at equal work, the recovered candidate against the unpruned model (and
#              the FLOP ratio), with crude slices of the candidate depths (deploy --ceilings)
# Resumable: rerun the same command (finished steps are skipped, a recover run resumes from checkpoint_last.pt).
# Budget (one core): a layers-only shrink 2-4 min; a candidate with the window fit 5-9 min; a recover epoch
# (28000 sentences) 6-10 min.
set -euo pipefail
main() {
  cd "$(dirname "$0")/.."
  local work=${1:-work/depth} lane=${2:-all}
  export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1 TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
  local data=../shared/data/multi30k model=checkpoints/de-en/model.pt
  local sel=${SEL:-importance} cand=${CAND:-d3h3}
  mkdir -p "$work/runs" "$work/raw"
  for l in de en; do  # train minus its last 1000 sentences; those 1000 are the held-out set
    [ -f "$work/raw/heldout.$l" ] || { head -n -1000 "$data/train.$l" > "$work/raw/train.$l"
                                        tail -n 1000 "$data/train.$l" > "$work/raw/heldout.$l"; }
  done
  for split in train:$work/raw/train heldout:$work/raw/heldout valid:$data/val test:$data/test_2016_flickr; do
    [ -f "$work/data-bin/${split%%:*}.de-en.en.idx" ] ||
      bash data_prep/encode-for-model.sh checkpoints/de-en de en "${split#*:}" "$work/data-bin" "${split%%:*}"
  done
  shrink() {  # NAME OPTIONS...: calibrated on the first 1000 train sentences (val stays unseen for the choices)
    local name=$1; shift
    [ -f "$work/shrink-$name.pt" ] || fairseq-headprune shrink "$work/data-bin" --path "$model" -s de -t en "$@" \
      --calibration-subset train --max-tokens 1000 --out "$work/shrink-$name.pt" > "$work/shrink-$name.log" 2>&1
  }
  recover() {  # NAME STUDENT EPOCHS OPTIONS...  (recover's defaults are the chosen recipe of results/recover-de-en)
    local name=$1 student=$2 epochs=$3; shift 3
    # (EPOCHS=N with N below 8 writes OUT.pt from the epochs run so far: the run is resumed and ends at once)
    [ -f "$work/runs/$name.recover/checkpoint$epochs.pt" ] && [ -f "$work/runs/$name.pt" ] ||
      /usr/bin/time -v fairseq-headprune recover \
      "$work/data-bin" --path "$student" --teacher "$model" --out "$work/runs/$name.pt" --force --epochs "$epochs" \
      --work-dir "$work/runs/$name.recover" -s de -t en "$@" >> "$work/runs/$name.log" 2>&1
  }
  local window="--window-steps 1000 --window-lr 3e-4"
  if [ "$lane" = sel ] || [ "$lane" = all ]; then
    for n in 3 2; do
      for rule in importance even; do
        shrink "d$n-$rule" --keep-layers "dec:$n" --layer-selection "$rule"
      done
    done
    python benchmarks/depth_study.py "$work" results/depth-de-en --subset valid
  fi
  if [ "$lane" = cand ] || [ "$lane" = all ]; then
    local heads="--types enc-dec,dec-self --shape per-stack"
    shrink "d3h3-$sel" --keep-layers dec:3 --layer-selection "$sel" --remove 62.5% $heads $window
    shrink "d2h4-$sel" --keep-layers dec:2 --layer-selection "$sel" --remove 50% $heads $window
    python benchmarks/depth_study.py "$work" results/depth-de-en --subset valid
  fi
  if [ "$lane" = ffn ] || [ "$lane" = all ]; then
    shrink ffn50 --ffn-keep 50%  # (no attention sublayer loses a head: nothing for the window fit)
    shrink d5 --keep-layers dec:5 $window
    shrink h6 --remove 25% --types enc-dec,dec-self --shape per-stack $window
    python benchmarks/depth_study.py "$work" results/depth-de-en --subset valid
  fi
  if [ "$lane" = rec ] || [ "$lane" = all ]; then
    recover "r-$cand-$sel" "$work/shrink-$cand-$sel.pt" "${EPOCHS:-8}"
  fi
  if [ "$lane" = ctl ] || [ "$lane" = all ]; then
    recover ctl-reduced "$model" "${EPOCHS:-8}"
  fi
  if [ "$lane" = deploy ] || [ "$lane" = all ]; then  # speed: CTranslate2 int8 at equal work against the unpruned
    # model, in one run (the recovered model, and crude slices of the unpruned one at the candidate depths)
    fairseq-headprune deploy "$work/data-bin" --path "$model" --gen-subset test --references "$work/data-bin/test.raw.en" \
      --results-dir results/depth-de-en/deploy --shrink-percent 0 --compare "$cand=$work/runs/r-$cand-$sel.pt" \
      --candidate "$cand" --runs "${RUNS:-2}" --beam 5 --batch-size 64 --bpe subword_nmt \
      --bpe-codes checkpoints/de-en/code --tokenizer moses -s de -t en --ceilings 6x8/6x8 6x8/3x3 6x8/2x4 6x8/4x8 \
      > "$work/deploy.log" 2>&1
  fi
  if [ "$lane" = levers ] || [ "$lane" = all ]; then
    fairseq-headprune deploy "$work/data-bin" --path "$model" --gen-subset valid --references "$work/data-bin/valid.raw.en" \
      --results-dir results/depth-de-en/levers --shrink-percent 0 --runs "${RUNS:-2}" --beam 5 --batch-size 64 \
      --compare "ffn50=$work/shrink-ffn50.pt" "d5=$work/shrink-d5.pt" "h6=$work/shrink-h6.pt" --candidate ffn50 \
      --bpe subword_nmt --bpe-codes checkpoints/de-en/code --tokenizer moses -s de -t en \
      --ceilings 6x8/6x8 5x8/6x8 4x8/6x8 3x8/6x8 2x8/6x8 8/8:ffn=75% 8/8:ffn=50% 8/8:ffn=25% 6x8/4x8 \
      > "$work/levers.log" 2>&1
  fi
  if [ "$lane" = eval ] || [ "$lane" = all ]; then
    python benchmarks/depth_study.py "$work" results/depth-de-en --subset valid
    python benchmarks/depth_study.py "$work" results/depth-de-en --subset test --final
    python benchmarks/depth_study.py "$work" results/depth-de-en --subset heldout --final
    [ -f "$work/data-bin/bible.de-en.en.idx" ] ||  # a De-En set the teacher never saw (out of domain), once
      bash data_prep/encode-for-model.sh checkpoints/de-en de en ../shared/data/bible_de_en/test "$work/data-bin" bible
    python benchmarks/depth_study.py "$work" results/depth-de-en --subset bible --final
  fi
}
main "$@"
