#!/usr/bin/env bash
# The recover study on the bundled De-En model (results/recover-de-en/), as it was run: shrink at 25/50/75% (and
# 50% by Michel's I_h, and 50% in the per-stack shape); at 50% the first recipe (the student's dropout 0.3, T 1) and
# two variants for one epoch, the choice made on Multi30k val; then the chosen recipe at every budget, and for each
# recipe its control (the unpruned model put through the same recovery). Then the table on test2016
# (benchmarks/recover_study.py), decoded once per model. Epochs per run were cut to what one session's two cores
# allowed (see results/recover-de-en/README.md).
#
# usage: recipes/recover_de_en.sh [WORK] [LANE]   (work/recover; LANE a or b runs one of the two halves, so that two
#        cores run both: `recipes/recover_de_en.sh work/recover a & recipes/recover_de_en.sh work/recover b`)
# Resumable: rerun the same command (finished steps are skipped, a recover run resumes from its checkpoint_last.pt).
# Budget (one core each): shrink 2-4 min; a recover epoch about 8.5 CPU minutes (10-13 min of wall time beside
# other work); the valid and test decodes of every model (beam 5) 20-45 s each.
set -euo pipefail
main() {
  cd "$(dirname "$0")/.."
  local work=${1:-work/recover} lane=${2:-all}
  export PATH=$PWD/.venv/bin:$PATH OMP_NUM_THREADS=1 TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
  local data=../shared/data/multi30k model=checkpoints/de-en/model.pt
  mkdir -p "$work/runs"
  for split in train:train valid:val test:test_2016_flickr; do
    [ -f "$work/data-bin/${split%%:*}.de-en.en.idx" ] ||
      bash data_prep/encode-for-model.sh checkpoints/de-en de en "$data/${split#*:}" "$work/data-bin" "${split%%:*}"
  done
  shrink() {  # NAME OPTIONS...
    local name=$1; shift
    [ -f "$work/$name.pt" ] || fairseq-headprune shrink "$work/data-bin" --path "$model" -s de -t en "$@" \
      --out "$work/$name.pt" --max-tokens 4000 > "$work/$name.log" 2>&1
  }
  recover() {  # NAME STUDENT OPTIONS...
    local name=$1 student=$2; shift 2
    [ -f "$work/runs/$name.pt" ] || /usr/bin/time -v fairseq-headprune recover "$work/data-bin" --path "$student" \
      --teacher "$model" --out "$work/runs/$name.pt" --work-dir "$work/runs/$name.recover" -s de -t en "$@" \
      > "$work/runs/$name.log" 2>&1
  }
  local old="--distill logits --dropout 0.3 --distill-temperature 1"  # the student's own dropout, T 1: the first recipe
  local chosen="--distill logits --dropout 0.1 --distill-temperature 2"  # chosen on val (results/recover-de-en/README.md)
  if [ "$lane" = a ] || [ "$lane" = all ]; then
    shrink shrink-50 --remove 50%
    shrink shrink-75 --remove 75%
    recover r50-logits "$work/shrink-50.pt" $old --epochs 4          # stopped by --patience 2 after epoch 3
    shrink shrink-25 --remove 25%
    shrink shrink-ih50 --remove 50% --search importance
    recover r50-logits-d01-t2 "$work/shrink-50.pt" $chosen --epochs 2
    recover r75-d01-t2 "$work/shrink-75.pt" $chosen --epochs 2
    recover rih50-d01-t2 "$work/shrink-ih50.pt" $chosen --epochs 1
  fi
  if [ "$lane" = b ] || [ "$lane" = all ]; then
    recover ctl-logits "$model" $old --epochs 2                         # the control of the first recipe
    shrink shrink-ps50 --remove 50% --shape per-stack
    recover r50-logits-d01 "$work/shrink-50.pt" --distill logits --dropout 0.1 --distill-temperature 1 --epochs 1
    recover ctl-d01-t2 "$model" $chosen --epochs 2                      # the control of the chosen recipe
    recover rps50-d01-t2 "$work/shrink-ps50.pt" $chosen --epochs 1
    recover r25-d01-t2 "$work/shrink-25.pt" $chosen --epochs 1
  fi
  if [ "$lane" = all ]; then
    python benchmarks/recover_study.py "$work" results/recover-de-en --subset valid
    python benchmarks/recover_study.py "$work" results/recover-de-en --subset test
  fi
}
main "$@"
