#!/usr/bin/env bash
# The recover study on the bundled De-En model (results/recover-de-en/), as it was run: shrink at 25/50/75% (and
# 50% by Michel's I_h, and 50% in the per-stack shape); at 50% the first recipe (the student's dropout 0.3, T 1) and
# two variants for one epoch, the choice made on Multi30k val; then the chosen recipe at every budget, and for each
# recipe its control (the unpruned model put through the same recovery); the second round of runs extended the chosen
# recipe's 50% and 75% runs and its control to 4 epochs, added sequence-level distillation (and its control), and
# the window fit (shrink --window-steps, calibrated on train so that val can choose its settings) with and without
# recovery; the third extended the window-fitted 50% and 75% runs to 4 epochs, added 30%, `--distill both` (and its
# control) and the per-stack shapes the deployment table times; the fourth took the decoder-only 8/4 shape to 4
# epochs, added 8/3 (the decoder at 3 of 8 heads) and Voita's L0 heads recovered (`shrink --heads`); the fifth ran the
# 8/3 shape at lr 3e-4 (and its control) and with the layer distillation (lanes i, l, j; k after the choice). Then
# the table on test2016 (benchmarks/recover_study.py), decoded once per model.
#
# usage: recipes/recover_de_en.sh [WORK] [LANE]   (work/recover; LANE a-l runs one part, so that two cores run two:
#        `recipes/recover_de_en.sh work/recover a & recipes/recover_de_en.sh work/recover b`, then c and d, e, f, g, i, j, l; h and k after the deployment table)
# Resumable: rerun the same command (finished steps are skipped, a recover run resumes from its checkpoint_last.pt).
# Budget (one core each): shrink 2-4 min (7-9 with the window fit); a recover epoch 10-11 CPU minutes (10-13 min of
# wall time beside other work); the valid and test decodes of every model (beam 5) 20-45 s each.
set -euo pipefail
main() {
  cd "$(dirname "$0")/.."
  local work=${1:-work/recover} lane=${2:-all}
  export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1 TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
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
  recover() {  # NAME STUDENT EPOCHS OPTIONS...  (a run with fewer epochs is extended: --force rewrites OUT.pt)
    local name=$1 student=$2 epochs=$3; shift 3
    [ -f "$work/runs/$name.recover/checkpoint$epochs.pt" ] || /usr/bin/time -v fairseq-headprune recover \
      "$work/data-bin" --path "$student" --teacher "$model" --out "$work/runs/$name.pt" --force --epochs "$epochs" \
      --work-dir "$work/runs/$name.recover" -s de -t en "$@" >> "$work/runs/$name.log" 2>&1
  }
  window() {  # NAME OPTIONS...: shrink calibrated on 1000 train sentences (val stays unseen for the choices)
    local name=$1; shift
    [ -f "$work/shrink-$name.pt" ] || fairseq-headprune shrink "$work/data-bin" --path "$model" -s de -t en "$@" \
      --calibration-subset train --max-tokens 1000 --out "$work/shrink-$name.pt" > "$work/shrink-$name.log" 2>&1
  }
  local old="--distill logits --dropout 0.3 --distill-temperature 1"  # the student's own dropout, T 1: the first recipe
  local chosen="--distill logits --dropout 0.1 --distill-temperature 2"  # chosen on val (results/recover-de-en/README.md)
  if [ "$lane" = a ] || [ "$lane" = all ]; then
    shrink shrink-50 --remove 50%
    shrink shrink-75 --remove 75%
    recover r50-logits "$work/shrink-50.pt" 4 $old                    # stopped by --patience 2 after epoch 3
    shrink shrink-25 --remove 25%
    shrink shrink-ih50 --remove 50% --search importance
    recover r50-logits-d01-t2 "$work/shrink-50.pt" 4 $chosen
    recover r75-d01-t2 "$work/shrink-75.pt" 4 $chosen
    recover rih50-d01-t2 "$work/shrink-ih50.pt" 1 $chosen
    recover r25-d01-t2 "$work/shrink-25.pt" 1 $chosen
    recover r50-seq-d01 "$work/shrink-50.pt" 1 --distill sequences --dropout 0.1
    recover ctl-seq-d01 "$model" 1 --distill sequences --dropout 0.1    # its control
  fi
  if [ "$lane" = b ] || [ "$lane" = all ]; then
    recover ctl-logits "$model" 2 $old                                  # the control of the first recipe
    shrink shrink-ps50 --remove 50% --shape per-stack
    recover r50-logits-d01 "$work/shrink-50.pt" 1 --distill logits --dropout 0.1 --distill-temperature 1
    recover ctl-d01-t2 "$model" 4 $chosen                               # the control of the chosen recipe
    recover rps50-d01-t2 "$work/shrink-ps50.pt" 1 $chosen
    window t50-ridge --remove 50%
    for setting in "300 3e-5" "300 1e-4" "300 3e-4" "1000 1e-4" "300 1e-3" "1000 3e-4"; do
      set -- $setting
      window "t50-w$1-$2" --remove 50% --window-steps "$1" --window-lr "$2"
    done
    recover rt50-w1000-3e-4 "$work/shrink-t50-w1000-3e-4.pt" 1          # recover's defaults are the chosen recipe
    window t75-w1000-3e-4 --remove 75% --window-steps 1000 --window-lr 3e-4
    window t75-ridge --remove 75%
    recover rt50-ridge "$work/shrink-t50-ridge.pt" 1
    recover rt75-w1000-3e-4 "$work/shrink-t75-w1000-3e-4.pt" 2
  fi
  if [ "$lane" = c ] || [ "$lane" = all ]; then  # the third round: the window-fitted runs to 4 epochs, 30%, both
    recover rt50-w1000-3e-4 "$work/shrink-t50-w1000-3e-4.pt" 4
    recover rt75-w1000-3e-4 "$work/shrink-t75-w1000-3e-4.pt" 4
    window t30-w1000-3e-4 --remove 30% --window-steps 1000 --window-lr 3e-4
    recover rt30-w1000-3e-4 "$work/shrink-t30-w1000-3e-4.pt" 2
    recover rt50-both "$work/shrink-t50-w1000-3e-4.pt" 1 --distill both
    recover ctl-both "$model" 1 --distill both                         # its control
  fi
  if [ "$lane" = d ] || [ "$lane" = all ]; then  # per-stack shapes for the deployment table (recipes/deploy_de_en.sh)
    window tps50-w1000-3e-4 --remove 50% --shape per-stack --window-steps 1000 --window-lr 3e-4
    recover rtps50-w1000-3e-4 "$work/shrink-tps50-w1000-3e-4.pt" 2
    # the decoder alone at 4 of 8 heads (8/4 in CTranslate2: 1.51x int8, results/deploy-de-en/speed-dec-4of8-int8)
    window tdps50-w1000-3e-4 --remove 50% --types enc-dec,dec-self --shape per-stack --window-steps 1000 \
      --window-lr 3e-4
    recover rtdps50-w1000-3e-4 "$work/shrink-tdps50-w1000-3e-4.pt" 2
  fi
  if [ "$lane" = e ] || [ "$lane" = all ]; then  # the fourth round: the decoder-only shapes to 4 epochs, and 8/3
    recover rtdps50-w1000-3e-4 "$work/shrink-tdps50-w1000-3e-4.pt" 4
  fi
  if [ "$lane" = f ] || [ "$lane" = all ]; then
    window tdps62-w1000-3e-4 --remove 62.5% --types enc-dec,dec-self --shape per-stack --window-steps 1000 \
      --window-lr 3e-4
    recover rtdps62-w1000-3e-4 "$work/shrink-tdps62-w1000-3e-4.pt" 4
  fi
  if [ "$lane" = h ]; then  # after recipes/deploy_de_en.sh timed the 4-epoch 8/3 model: the same run to 6 epochs
    recover rtdps62-w1000-3e-4 "$work/shrink-tdps62-w1000-3e-4.pt" 6   # (OUT.pt becomes its lowest-valid-loss epoch)
  fi
  if [ "$lane" = i ] || [ "$lane" = all ]; then  # the fifth round: the 8/3 shape at 3x the lr (4 epochs; compared on val)
    recover rtdps62-lr3e-4 "$work/shrink-tdps62-w1000-3e-4.pt" 4 --lr 3e-4
  fi
  if [ "$lane" = k ]; then  # after the choice: the lr 3e-4 run on to 6 epochs (its valid loss was still falling)
    recover rtdps62-lr3e-4 "$work/shrink-tdps62-w1000-3e-4.pt" 6 --lr 3e-4
  fi
  if [ "$lane" = l ] || [ "$lane" = all ]; then  # the control of lane i's recipe: the unpruned model at lr 3e-4
    recover ctl-lr3e-4 "$model" 4 --lr 3e-4
  fi
  if [ "$lane" = j ] || [ "$lane" = all ]; then  # the same with the decoder layers pulled towards the teacher's (β 0.1:
    # the layer term starts at 0.56 a token against the KL's 0.83 on train batches; control: the 8/3 run, lane f)
    recover rtdps62-h01 "$work/shrink-tdps62-w1000-3e-4.pt" 4 --distill-hidden-weight 0.1
  fi
  if [ "$lane" = g ] || [ "$lane" = all ]; then  # Voita's L0 heads (λ 0.01: 69 closed), refit and recovered as I_h's
    shrink shrink-l0 --heads @results/voita/lambda-0.01/closed-heads.json
    recover rl0-d01-t2 "$work/shrink-l0.pt" 1
  fi
  if [ "$lane" = all ]; then
    python benchmarks/recover_study.py "$work" results/recover-de-en --subset valid
    python benchmarks/recover_study.py "$work" results/recover-de-en --subset test
  fi
}
main "$@"
