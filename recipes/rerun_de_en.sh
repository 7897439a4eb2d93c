#!/usr/bin/env bash
# Every De-En study rerun on the bundled (converged) model, in two lanes of one core each, so
# that two lanes run side by side on this 2-core machine:
#   report   shrink's targets (results/shrink-de-en/targets.md), results/report-de-en (every part, shrink and
#            equal-work speed included; recipes/report_de_en.sh), results/de-en/pruned-50 (recipes/prune_de_en_50.sh),
#            the rest of results/de-en, the results/shrink-de-en sweep, candidates, export and speed
#            (recipes/shrink_de_en.sh)
#   voita    results/voita (the L0 sweep and its lambda = 0 control, all three types), results/voita/encoder-only
#            (encoder self-attention gated alone), results/voita/from-scratch (the configurations of the runs
#            nearest to 1/2 and 3/4 of the heads closed, trained from random initialisation with the base recipe)
#   both     then the shared jobs, each taken by whichever lane gets to it first: the two from-scratch runs, the
#            training dynamics of the run's every epoch (results/dynamics), and shrink's En-Fr stages
#            (recipes/shrink_en_fr.sh)
#   render   results/voita/analysis (recipes/voita_analysis.sh), the survivors' functions, the from-scratch table,
#            and the report rendered again with the finished dynamics and L0 sweeps (--render-only)
#   jobs     the named shared jobs only, on a core that would otherwise wait (rerun_de_en.sh jobs dynamics)
# A results folder made with another model is moved to work/superseded/ first (git keeps the old version; its
# README.md and NOTES.md stay, to be updated by hand). Every stage resumes where it stopped: rerun the same lane
# after a stop (in the background, e.g. `setsid nohup bash recipes/rerun_de_en.sh report >> work/rerun-de-en-report.log
# 2>&1 &`).
# usage: recipes/rerun_de_en.sh report|voita|render|jobs JOB...
# Budget (one core each, measured on the converged model beside another job): the report's parts 170 min, the
# dynamics 2.5 min an epoch (25 epochs), each L0 sweep ~1 h, from scratch ~7 min an epoch (up to 25 a configuration).
set -euo pipefail
main() {
  cd "$(dirname "$0")/.."
  export PATH=${VENV:-$PWD/.venv}/bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
  local lane=${1:?usage: rerun_de_en.sh report|voita|render|jobs JOB...}
  local model=checkpoints/de-en sha BIN=work/de-en/data-bin
  local ENCODER_LAMBDAS="0.05 0.02 0.01 0.008 0.006 0.004 0.003 0.002 0"
  sha=$(sha256sum "$model/model.pt" | cut -d' ' -f1)
  mkdir -p work/rerun-de-en work/superseded
  # supersede DIR: a folder of results of another model (or of none recorded) is moved aside
  supersede() {
    local dir=$1
    if [ -d "$dir" ] && [ "$(cat "$dir/.model-sha256" 2>/dev/null)" != "$sha" ]; then
      local old
      old=work/superseded/$(echo "$dir" | tr / -)-$(date +%Y%m%d%H%M%S)
      mv "$dir" "$old"
      mkdir -p "$dir"
      # the hand-written notes stay, to be brought up to date by hand: they say what was tried and why
      for f in README.md NOTES.md; do [ -f "$old/$f" ] && cp "$old/$f" "$dir/$f"; done
      echo "rerun_de_en: moved the old $dir to $old (its README.md and NOTES.md kept)"
    fi
    mkdir -p "$dir" && echo "$sha" > "$dir/.model-sha256"
  }
  # the jobs either lane takes once its own stages are done, each claimed with a lock that dies with its process
  # (the voita lane takes them in one order, the report lane in the other) and marked done with the model's sha
  run_job() {
    case $1 in
      scratch-half|scratch-three-quarters)  # Voita's last column: an L0 run's heads trained from random init
        local name=${1#scratch-} closed
        [ -f results/voita/compare.jsonl ] || return 75  # the voita lane's L0 sweep comes first
        closed=$(python - "$name" <<'EOF'
import json, sys
target = {"half": 0.5, "three-quarters": 0.75}[sys.argv[1]]
rows = [json.loads(line) for line in open("results/voita/compare.jsonl") if line.startswith("{")]
runs = [r for r in rows if r.get("method") == "l0" and r.get("l0_lambda")]
total = next(r["header"]["total_heads"] for r in rows if "header" in r)
best = min(runs, key=lambda r: abs(1 - r["heads_kept"] / total - target))
print(f"results/voita/lambda-{best['l0_lambda']:g}/closed-heads.json")
EOF
)
        echo "rerun_de_en: from scratch, $name: $closed"
        bash recipes/voita_from_scratch.sh "$closed" "$name"
        python recipes/voita_from_scratch_table.py  # results/voita/from-scratch/table.md, beside the pruned models
        ;;
      dynamics)  # the training dynamics of the converged run's every epoch
        supersede results/dynamics
        local last
        last=$(ls work/de-en/checkpoints | sed -nE 's/^checkpoint([0-9]+)\.pt$/\1/p' | sort -n | tail -1)
        bash recipes/iwslt_dynamics.sh multi30k ../shared/data work/de-en "$last" 400
        cp work/de-en/dynamics/dynamics.* results/dynamics/
        ;;
      shrink-en-fr)  # shrink on the En-Fr model: the recipe's stages not run yet (it resumes row by row)
        bash recipes/shrink_en_fr.sh
        ;;
      *) echo "rerun_de_en: error: no job '$1' (scratch-half, scratch-three-quarters, dynamics, shrink-en-fr)" >&2
         return 2 ;;
    esac
  }
  shared() {
    local job rc
    for job in "$@"; do
      [ "$(cat "work/rerun-de-en/$job.done" 2>/dev/null)" = "$sha" ] && continue
      set +e
      ( set -e; flock -n 9 || exit 75; run_job "$job" ) 9> "work/rerun-de-en/$job.lock"
      rc=$?
      set -e
      case $rc in
        0) echo "$sha" > "work/rerun-de-en/$job.done" ;;
        75) echo "rerun_de_en: $job: not now (another lane has it, or it waits for the L0 sweep)" ;;
        *) echo "rerun_de_en: $job failed ($rc)" >&2; return "$rc" ;;
      esac
    done
  }
  case $lane in
    report)
      supersede results/shrink-de-en  # shrink's targets first: a short run, and the verdict everyone asks for
      [ -f results/shrink-de-en/targets.md ] || bash recipes/shrink_de_en.sh targets  # this model's, once made
      supersede results/report-de-en
      bash recipes/report_de_en.sh --workers 1
      if [ "$(cat work/rerun-de-en/pruned-50.done 2>/dev/null)" != "$sha" ]; then  # once a model
        supersede results/de-en/pruned-50
        bash recipes/prune_de_en_50.sh && echo "$sha" > work/rerun-de-en/pruned-50.done
      fi
      # the rest of results/de-en: per-token vs per-sentence I_h (its script lives in the folder: not superseded),
      # and the pruned model's speed at forced equal lengths (as benchmarks/pruned_speed.sh)
      local ipp=results/de-en/importance-per-position
      if [ "$(cat "$ipp/.model-sha256" 2>/dev/null)" != "$sha" ]; then
        python benchmarks/importance_per_position.py > work/rerun-de-en/importance-per-position.log 2>&1 && echo "$sha" > "$ipp/.model-sha256"
      fi
      if [ "$(cat results/de-en/speed-same-work/.model-sha256 2>/dev/null)" != "$sha" ]; then
        supersede results/de-en/speed-same-work
        fairseq-headprune speed "$BIN" --path "$model/model.pt" --gen-subset test -s de -t en \
          --heads @results/de-en/pruned-50/removed-heads.json --results-dir results/de-en/speed-same-work --beam 5 \
          --runs 3 --num-sentences 128 --max-len-a 0 --max-len-b 20 --min-len 20 \
          | tee results/de-en/speed-same-work/speed.txt
      fi
      # the report's shrink part computed every row of the shrink sweep (same model, data and settings): seed the
      # folder with it; should the sweep refuse the copy (another identity), it runs from nothing
      local seeded=results/shrink-de-en/shrink-sweep.jsonl
      if [ ! -f "$seeded" ] && [ -f results/report-de-en/shrink-sweep.jsonl ]; then
        cp results/report-de-en/shrink-sweep.jsonl "$seeded"
        bash recipes/shrink_de_en.sh sweep || { echo "rerun_de_en: the report's rows refused, the sweep runs anew"; \
          rm "$seeded"; }
      fi
      bash recipes/shrink_de_en.sh sweep,candidates,export,speed
      shared dynamics shrink-en-fr scratch-three-quarters scratch-half
      ;;
    voita)
      supersede results/voita
      WORK=work/voita-converged bash recipes/voita_l0.sh
      mkdir -p results/voita/encoder-only
      # encoder-only: two more λ between 0.002 (no head closed) and 0.006 (30 of 48 closed on this model)
      GATED_TYPES=enc-self WORK=work/voita-encoder-converged RESULTS=results/voita/encoder-only \
        LAMBDAS="$ENCODER_LAMBDAS" bash recipes/voita_l0.sh
      shared scratch-half scratch-three-quarters shrink-en-fr dynamics
      ;;
    render)  # once both lanes are done: the survivors' functions need the report's analyze part
      if [ "$(cat results/voita/analysis/.model-sha256 2>/dev/null)" != "$sha" ]; then
        bash recipes/voita_analysis.sh results/voita/analysis && echo "$sha" > results/voita/analysis/.model-sha256
      fi
      WORK=work/voita-converged bash recipes/voita_l0.sh survivors
      GATED_TYPES=enc-self WORK=work/voita-encoder-converged RESULTS=results/voita/encoder-only \
        LAMBDAS="$ENCODER_LAMBDAS" bash recipes/voita_l0.sh survivors
      python recipes/voita_from_scratch_table.py
      # the cache-reorder copy ratio (beside the FLOP ratio) came after the report's speed part had run on this
      # model: the part's own command once more, so speed.json has it (about 7 minutes)
      if ! grep -q '"reorder_ratio"' results/report-de-en/speed.json; then
        eval "$(python -c "import json; print(json.load(open('results/report-de-en/report-state.json'))['parts']['speed']['commands'][0])")"
      fi
      bash recipes/report_de_en.sh --render-only
      ;;
    jobs)  # named shared jobs now, e.g. `jobs dynamics` on a core that would otherwise wait
      shift
      [ $# -gt 0 ] || { echo "rerun_de_en: error: jobs needs the names of shared jobs" >&2; exit 2; }
      shared "$@"
      ;;
    *) echo "rerun_de_en: error: the lane is report, voita, render or jobs, not '$lane'" >&2; exit 2 ;;
  esac
}
main "$@"
