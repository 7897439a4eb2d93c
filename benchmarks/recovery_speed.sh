#!/usr/bin/env bash
# The recovery's training speed on the machine at hand (results/gpu-recovery-de-en): compress's own recovery
# command (OUT/recovery-run.sh, written by `compress ... --stop-after shrink`) run whole where fairseq-train puts it
# (a visible GPU), then the same command for UPDATES updates on the CPU (--cpu), with one thread and with every core.
# Each run's target tokens per second is fairseq's own `wps` (its train lines: the mean over the run's epochs); the
# logs go to LOGS. The whole run's checkpoints are OUT/recovery-run's, for `compress ... --recovered`.
#
# usage: benchmarks/recovery_speed.sh OUT [UPDATES] [LOGS]   (UPDATES 30; LOGS OUT/speed)
set -euo pipefail
out=${1:?usage: benchmarks/recovery_speed.sh OUT [UPDATES] [LOGS]} updates=${2:-30} logs=${3:-$1/speed}
[ -f "$out/recovery-run.sh" ] || { echo "$0: no $out/recovery-run.sh (run compress with --stop-after shrink)" >&2; exit 2; }
mkdir -p "$logs"
scratch=$(mktemp -d) && trap 'rm -rf "$scratch"' EXIT

timed() {  # NAME THREADS FAIRSEQ-TRAIN-OPTIONS...: one run, its log in LOGS/NAME.log, its wall seconds printed
  local name=$1 threads=$2 start && shift 2 && start=$(date +%s.%N)
  if [ "$threads" = all ]; then env -u OMP_NUM_THREADS bash "$out/recovery-run.sh" "$@"
  else OMP_NUM_THREADS=$threads bash "$out/recovery-run.sh" "$@"; fi > "$logs/$name.log" 2>&1 ||
    { tail -n 20 "$logs/$name.log" >&2; echo "$0: the $name run failed (its log: $logs/$name.log)" >&2; exit 1; }
  awk -v end="$(date +%s.%N)" -v start="$start" 'BEGIN {printf "%.0f", end - start}'
}
wps() {  # LOG: the mean of fairseq's epoch-summary wps (its `train` lines, one per epoch)
  grep -E '\| train \|' "$1" | grep -oE 'wps [0-9.]+' | awk '{s += $2; n++} END {if (n) printf "%.0f", s / n; else print "none"}'
}
gpu_wall=$(timed whole all)
short=(--cpu --max-update "$updates" --no-save --disable-validation --save-dir "$scratch")
cpu1_wall=$(timed cpu-1-thread 1 "${short[@]}")
cpun_wall=$(timed cpu-all-cores all "${short[@]}")
gpu=$(wps "$logs/whole.log") cpu1=$(wps "$logs/cpu-1-thread.log") cpun=$(wps "$logs/cpu-all-cores.log")
[[ "$gpu $cpu1 $cpun" != *none* ]] || { echo "$0: a run printed no train line (its logs: $logs)" >&2; exit 1; }
{
  echo "device of the whole run: $(grep -oE 'training on [0-9]+ devices? \(GPUs/TPUs\)' "$logs/whole.log" | head -n 1)"
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /' || true
  echo "CPU: $(nproc) cores"
  echo "run | target tokens/s (fairseq wps) | wall s"
  echo "whole recovery, default device | $gpu | $gpu_wall"
  echo "$updates updates, --cpu, 1 thread | $cpu1 | $cpu1_wall"
  echo "$updates updates, --cpu, every core | $cpun | $cpun_wall"
  awk -v g="$gpu" -v a="$cpu1" -v b="$cpun" 'BEGIN {printf "ratio: %.1fx one thread, %.1fx every core\n", g / a, g / b}'
} | tee "$logs/summary.txt"
