#!/usr/bin/env bash
# Is the De-En training run of recipes/train_de_en.sh converged, and which of its checkpoints becomes the
# bundled model?
#   1. the run's valid loss per epoch and its best epoch (from its train.log); a run still training is refused
#      (FORCE=1 to look at it anyway)
#   2. candidates, each a stock fp16 bundle without optimizer state (recipes/bundle_checkpoint.py): the best epoch,
#      the average of the N epochs ending at the best, the average of the last N epochs; BLEU on Multi30k val
#      (beam 5, recipes/eval_bleu.sh) chooses among them; test2016 is scored for the record, never to choose
#   3. the convergence test: the chosen model fine-tuned 300 more updates with no penalty (the lambda = 0 control
#      of recipes/voita_l0.sh, the fine-tuning every L0 run gets); converged when that gains at most 0.3 BLEU on
#      test2016
#   4. results/de-en/convergence/convergence.md with every figure, and the chosen bundle in WORK/bundle/ (model.pt,
#      code, dictionaries) to copy into checkpoints/de-en after reading it
#
# usage: recipes/converge_de_en.sh [WORK] [N]      WORK: the training's folder (work/de-en); N: epochs averaged (5)
# Budget: 3 candidates x 2 BLEU runs (~1 min each on one core), the control's 300 updates (~8 CPU minutes) and its
# BLEU: about 20 minutes of one core.
set -euo pipefail
main() {
  cd "$(dirname "$0")/.."
  export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
  local work=${1:-work/de-en} n=${2:-5}
  local out=${OUT:-results/de-en/convergence} bin=$work/data-bin log=$work/train.log
  [ -f "$log" ] || { echo "converge_de_en: error: no training log at $log" >&2; exit 2; }
  if ! grep -qE "early stop since valid performance|done training" "$log" && [ -z "${FORCE:-}" ]; then
    echo "converge_de_en: error: the run in $work has not stopped yet (FORCE=1 to look at it anyway)" >&2; exit 2
  fi
  mkdir -p "$out" "$work/candidates"
  # 1. valid loss per epoch (the last line of each epoch wins: a resumed epoch is logged again)
  grep -E "\| valid \| epoch [0-9]+ \| valid on 'valid' subset" "$log" \
    | sed -E 's/.*epoch ([0-9]+) .*\| loss ([0-9.]+) \| nll_loss ([0-9.]+) .*num_updates ([0-9]+).*/\1 \2 \3 \4/' \
    | awk '{$1 = $1 + 0; row[$1] = $0} END {for (e in row) print row[e]}' | sort -n > "$out/valid-loss.txt"
  local best last
  best=$(sort -k3,3g "$out/valid-loss.txt" | head -1 | cut -d' ' -f1)
  last=$(tail -1 "$out/valid-loss.txt" | cut -d' ' -f1)
  echo "epochs 1..$last, best valid NLL at epoch $best"
  # 2. candidates
  local ckpts=() e
  bundle() {  # bundle NAME EPOCH...
    local name=$1; shift
    local dir=$work/candidates/$name files=()
    for e in "$@"; do files+=("$work/checkpoints/checkpoint$e.pt"); done
    # a candidate of other epochs (an earlier look at a run still training) is stale: rebuilt, rescored
    [ "$(cat "$dir/epochs.txt" 2>/dev/null)" = "$*" ] || rm -rf "$dir"
    mkdir -p "$dir"
    [ -f "$dir/model.pt" ] || python recipes/bundle_checkpoint.py "$dir/model.pt" "${files[@]}" > /dev/null
    cp "$bin/code" "$bin/dict.de.txt" "$bin/dict.en.txt" "$dir/"
    echo "$*" > "$dir/epochs.txt"
  }
  bundle best "$best"
  bundle "average-to-best" $(seq $(( best - n + 1 > 1 ? best - n + 1 : 1 )) "$best")
  local names=(best average-to-best)
  if [ "$best" != "$last" ]; then  # else the same epochs as average-to-best
    bundle "average-last" $(seq $(( last - n + 1 > 1 ? last - n + 1 : 1 )) "$last")
    names+=(average-last)
  fi
  local refs_valid=$bin/prep/valid.raw.en refs_test=data/multi30k-test2016/test.en
  : > "$out/candidates.tsv"
  for name in "${names[@]}"; do
    [ -f "$work/candidates/$name/bleu.tsv" ] || bash recipes/eval_bleu.sh "$bin" "$work/candidates/$name/model.pt" \
      "$bin/code" de en "valid:$refs_valid" "test:$refs_test" > "$work/candidates/$name/bleu.tsv"
    printf '%s\t%s\t%s\t%s\n' "$name" "$(cat "$work/candidates/$name/epochs.txt")" \
      "$(awk -F'\t' '$1=="valid"{print $3}' "$work/candidates/$name/bleu.tsv")" \
      "$(awk -F'\t' '$1=="test"{print $3}' "$work/candidates/$name/bleu.tsv")" >> "$out/candidates.tsv"
  done
  local chosen
  chosen=$(sort -t$'\t' -k3,3gr "$out/candidates.tsv" | head -1 | cut -f1)
  rm -rf "$work/bundle" && cp -r "$work/candidates/$chosen" "$work/bundle"
  # 3. the lambda = 0 control on the chosen model (one folder per chosen model: a later look never reuses it)
  local control_dir
  control_dir=$work/control/$chosen-$(tr ' ' '-' < "$work/bundle/epochs.txt")
  LAMBDAS=0 MODEL=$work/bundle WORK=$control_dir RESULTS=$control_dir/results bash recipes/voita_l0.sh data train
  local control=$control_dir/runs/lambda-0/checkpoint_last.pt
  [ -f "$control_dir/bleu.tsv" ] || USER_DIR=fairseq_headprune bash recipes/eval_bleu.sh "$bin" "$control" \
    "$bin/code" de en "valid:$refs_valid" "test:$refs_test" > "$control_dir/bleu.tsv"
  # 4. the record
  python - "$out" "$chosen" "$control_dir" "$best" "$last" <<'EOF'
import csv, sys
out, chosen, control_dir, best, last = sys.argv[1:]
rows = list(csv.reader(open(f"{out}/candidates.tsv"), delimiter="\t"))
control = {r[0]: r for r in csv.reader(open(f"{control_dir}/bleu.tsv"), delimiter="\t")}
mine = next(r for r in rows if r[0] == chosen)
gain = float(control["test"][2]) - float(mine[3])
losses = [line.split() for line in open(f"{out}/valid-loss.txt")]
with open(f"{out}/convergence.md", "w") as f:
    f.write(f"# Is the De-En model converged? (recipes/converge_de_en.sh)\n\n"
            f"Training: `recipes/train_de_en.sh`, then `recipes/cooldown_de_en.sh` if its marker is in the log "
            f"(`== cool-down phase`), epochs 1..{last}, best valid loss at epoch {best}.\n\n| epoch | valid loss | valid NLL | updates |\n|---|---|---|---|\n")
    f.writelines(f"| {e} | {l} | {nll} | {u} |\n" for e, l, nll, u in losses)
    f.write("\nCandidates (sacreBLEU, beam 5; chosen by Multi30k val, test2016 for the record):\n\n"
            "| candidate | epochs | val BLEU | test2016 BLEU |\n|---|---|---|---|\n")
    f.writelines(f"| {r[0]}{' (chosen)' if r[0] == chosen else ''} | {r[1]} | {r[2]} | {r[3]} |\n" for r in rows)
    f.write(f"\nConvergence test: the chosen model fine-tuned 300 more updates with no penalty (recipes/voita_l0.sh, "
            f"λ = 0): test2016 {control['test'][2]} vs {mine[3]}, val {control['valid'][2]} vs {mine[2]}: gain "
            f"{gain:+.2f} BLEU on test2016; the bar is at most +0.3: "
            f"**{'converged' if gain <= 0.3 else 'NOT converged'}**.\n")
print(open(f"{out}/convergence.md").read())
EOF
}
main "$@"
