"""shrink's targets, measured side by side in one run (never in CI): `fairseq-headprune shrink` on the bundled
De-En model at 30/50/70/80% of the heads removed, calibration on Multi30k val, BLEU of each written checkpoint on
test2016 (beam 5, sacreBLEU on detokenised text against the raw references) beside the unpruned model's, and each
pipeline's wall time (calibration of 1000 sentences to saved checkpoint, the check included) and peak memory
(the child process's maximum resident set, from wait4).

usage: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/shrink_targets.py [--work DIR] [--percents 30,50,70,80]
       [extra shrink options, e.g. --refit-ffn]
Run on a machine where one core is free: the wall times are of one core, contention inflates them.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MODEL = "checkpoints/de-en/model.pt"
DATA = "work/de-en/data-bin"
REFS = "work/de-en/data-bin/prep/test.raw.en"
DECODING = ["--beam", "5", "--bpe", "subword_nmt", "--bpe-codes", "checkpoints/de-en/code", "--tokenizer", "moses",
            "-s", "de", "-t", "en", "--max-tokens", "4000"]
TARGETS = {30: 0.2, 50: 0.5}  # BLEU within this of the unpruned model; 70 and 80 are recorded, no target


def shrink(percent: int, out: str, extra) -> dict:
    """One pipeline run as a user runs it; wall time and the peak RSS of that process alone."""
    cmd = [os.path.join(ROOT, ".venv/bin/fairseq-headprune"), "shrink", DATA, "--path", MODEL, *DECODING,
           "--remove", f"{percent}%", "--calibration-subset", "valid", "--calibration-sentences", "1000",
           "--out", out, *extra]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"shrink {percent}% failed:\n{output[-3000:]}")
    return {"seconds": seconds, "peak_mib": usage.ru_maxrss / 1024, "log": output}


def bleu_of(checkpoint: str) -> float:
    """BLEU of a checkpoint on test2016, loaded and decoded as every command here does (fairseq's loader)."""
    from fairseq_headprune.cli import _quiet_dependencies, parse
    from fairseq_headprune.cli import shrink as command
    from fairseq_headprune.decoding.evaluate import SubsetEvaluator
    from fairseq_headprune.fairseq_io.loading import load, trust_fairseq_checkpoints

    trust_fairseq_checkpoints()
    _quiet_dependencies()
    cfg, _ = parse("shrink", command, [DATA, "--path", checkpoint, "--gen-subset", "test", *DECODING])
    evaluator = SubsetEvaluator(load(cfg), "test", REFS)
    return evaluator.bleu(evaluator.translate()).score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", default="work/bench-shrink")
    parser.add_argument("--percents", default="30,50,70,80")
    args, extra = parser.parse_known_args()
    os.chdir(ROOT)
    os.makedirs(args.work, exist_ok=True)
    percents = [int(p) for p in args.percents.split(",")]
    print(f"shrink targets: {MODEL}, calibration 1000 sentences of valid, BLEU on test2016 (beam 5); "
          f"extra options: {' '.join(extra) or 'none'}", flush=True)
    base = bleu_of(MODEL)
    print(f"unpruned: BLEU {base:.2f}", flush=True)
    rows = []
    for p in percents:
        out = os.path.join(args.work, f"shrink-{p}.pt")
        run = shrink(p, out, extra)
        bleu = bleu_of(out)
        rows.append((p, bleu, run))
        print(f"{p}% removed: BLEU {bleu:.2f} ({bleu - base:+.2f}), pipeline {run['seconds']:.0f}s, "
              f"peak {run['peak_mib']:.0f} MiB", flush=True)
    print("\n| removed | BLEU | change | target | met | pipeline wall (s) | peak memory (MiB) |")
    print("|---|---|---|---|---|---|---|")
    print(f"| 0% | {base:.2f} | | | | | |")
    for p, bleu, run in rows:
        target = TARGETS.get(p)
        missed = base - bleu - target if target is not None else 0.0
        met = "-" if target is None else ("yes" if missed <= 0 else f"no (missed by {missed:.2f})")
        print(f"| {p}% | {bleu:.2f} | {bleu - base:+.2f} | {f'within {target}' if target else 'recorded'} | {met} | "
              f"{run['seconds']:.0f} ({'<=' if run['seconds'] <= 600 else '>'} 600) | "
              f"{run['peak_mib']:.0f} ({'<=' if run['peak_mib'] <= 4096 else '>'} 4096) |")


if __name__ == "__main__":
    main()
