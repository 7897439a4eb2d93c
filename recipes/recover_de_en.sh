#!/usr/bin/env bash
# The recover study on the bundled De-En model (results/recover-de-en/): shrink at 25/50/75% (and 50% by Michel's
# I_h, and 50% in the per-stack shape), each recovered for 4 epochs of Multi30k by distillation from the unpruned
# model, 50% also by plain fine-tuning and by sequence-level distillation, and the control (the unpruned model put
# through the same recovery). Then the choices on Multi30k val and the table on test2016 (benchmarks/recover_study.py).
#
# usage: recipes/recover_de_en.sh [WORK] [LANE]   (work/recover; LANE a or b runs one of the two halves, so that two
#        cores run both: `recipes/recover_de_en.sh work/recover a & recipes/recover_de_en.sh work/recover b`)
# Resumable: rerun the same command (finished steps are skipped, a recover run resumes from its checkpoint_last.pt).
# Budget (one free core each): shrink 2-4 min; a 4-epoch recover run 25-35 min; the valid and test decodes of
# every model (beam 5) about 1 min a model.
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
  if [ "$lane" = a ] || [ "$lane" = all ]; then
    shrink shrink-50 --remove 50%
    shrink shrink-75 --remove 75%
    recover r50-logits "$work/shrink-50.pt" --distill logits --epochs 4
    shrink shrink-25 --remove 25%
    shrink shrink-ih50 --remove 50% --search importance
    recover r75-logits "$work/shrink-75.pt" --distill logits --epochs 4
    recover r25-logits "$work/shrink-25.pt" --distill logits --epochs 4
    recover rih50-logits "$work/shrink-ih50.pt" --distill logits --epochs 4
  fi
  if [ "$lane" = b ] || [ "$lane" = all ]; then
    recover ctl-logits "$model" --distill logits --epochs 4
    shrink shrink-ps50 --remove 50% --shape per-stack
    recover rps50-logits "$work/shrink-ps50.pt" --distill logits --epochs 4
    shrink shrink-50 --remove 50%
    recover r50-none "$work/shrink-50.pt" --distill none --epochs 4
    recover r50-sequences "$work/shrink-50.pt" --distill sequences --epochs 4
  fi
  if [ "$lane" = all ]; then
    python benchmarks/recover_study.py "$work" results/recover-de-en --subset valid
    python benchmarks/recover_study.py "$work" results/recover-de-en --subset test
  fi
}
main "$@"
