#!/usr/bin/env python3
"""Mutation check: does the test suite fail when the science breaks?

Each mutant is one deliberate bug (a unique source snippet replaced by a wrong one) in a copy of the package. The
script copies the repository's code and tests to a temporary folder (results, data, checkpoints are linked, read
only), applies one mutant, and runs the tests that should catch it there (PYTHONPATH puts the copy first, so the
in-process commands, the console scripts and fairseq's --user-dir all run the mutated code). A mutant is killed when
those tests fail, survives when they pass. The unmutated copy is run first on the union of those tests: they must
pass, or no verdict means anything.

    .venv/bin/python tools/mutation.py                 # every mutant; writes results/mutation/mutation.txt
    .venv/bin/python tools/mutation.py --only stats-p,gates-stretch --no-write
    .venv/bin/python tools/mutation.py --list

Slow (the tests of a slow path build the tiny model's decodes again for each mutant): not part of CI. The trained
tiny model comes from the suite's cache (tests/.cache), shared with the copies, so no mutant trains it again.
A mutant whose snippet is no longer in the code (the code moved) is reported as "stale", never as killed.
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("fairseq_headprune", "tests", "pytest.ini", "setup.py")  # mutated or run from the copy
LINKED = ("results", "data", "checkpoints", "data_prep", "recipes", "benchmarks")  # read by tests, never written


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str
    path: str  # relative to the repository root
    old: str  # must occur exactly once in the file
    new: str
    tests: Tuple[str, ...]  # pytest node ids or files that should fail
    issue_19: bool = False  # one of the survivors named in issue 19


MUTANTS: Sequence[Mutant] = (
    # ---- the nine survivors of issue 19
    Mutant("stats-p", "bootstrap p = 1 - min(wins) instead of 1 - max(wins)", "fairseq_headprune/stats.py",
           "1.0 - max(baseline_wins, system_wins)", "1.0 - min(baseline_wins, system_wins)",
           ("tests/test_stats.py",), True),
    Mutant("gates-stretch", "gate stretch limits widened to (-0.2, 1.2)", "fairseq_headprune/core/gates.py",
           "STRETCH: Tuple[float, float] = (-0.1, 1.1)", "STRETCH: Tuple[float, float] = (-0.2, 1.2)",
           ("tests/test_gate_math.py",), True),
    Mutant("l0-per-token", "L0 penalty without its x sample_size (lambda no longer per target token)",
           "fairseq_headprune/criterions/label_smoothed_cross_entropy_l0.py",
           "loss = loss + self.l0_lambda * sample_size * l0", "loss = loss + self.l0_lambda * l0",
           ("tests/test_gate_math.py",), True),
    Mutant("header-checkpoint", "results header (run identity) without the checkpoint hash",
           "fairseq_headprune/records/identity.py",
           'identity["checkpoint_sha256"] = file_sha256(loaded.checkpoint)', "pass",
           ("tests/test_ablation.py::test_single_head_sweep_rows_and_table",), True),
    Mutant("evaluator-last-batch", "the evaluator drops its last batch when built",
           "fairseq_headprune/decoding/evaluate.py",
           "self.samples = [self._to_device(s) for s in itr]", "self.samples = [self._to_device(s) for s in itr][:-1]",
           ("tests/test_evaluate.py",), True),
    Mutant("c3-boundary", "C3: prunable share > 20% instead of >= 20%", "fairseq_headprune/report/claims.py",
           "SUPPORTED if percent >= C3_MIN_PERCENT else", "SUPPORTED if percent > C3_MIN_PERCENT else",
           ("tests/test_claims_rules.py",), True),
    Mutant("v-boundary", "V: share closed >= 50% instead of > 50%", "fairseq_headprune/report/claims.py",
           "SUPPORTED if share(best, by_encoder) > VOITA_MIN_SHARE else",
           "SUPPORTED if share(best, by_encoder) >= VOITA_MIN_SHARE else",
           ("tests/test_claims_rules.py",), True),
    Mutant("v-tolerance", "V: within 0.3 BLEU instead of 0.25", "fairseq_headprune/report/claims.py",
           'within = [p for p in candidates if p["bleu"] >= baseline(p)[0] - VOITA_TOLERANCE]',
           'within = [p for p in candidates if p["bleu"] >= baseline(p)[0] - 0.3]',
           ("tests/test_claims_rules.py",), True),
    Mutant("flops-length", "decode FLOPs without a length term (the encoder's s^2 scores and sums)",
           "fairseq_headprune/core/flops.py",
           "macs += 4 * s * d * a + 2 * s * s * a + 2 * s * d * ffn",
           "macs += 4 * s * d * a + 2 * s * d * ffn",
           ("tests/test_flops.py", "tests/test_science_fixes.py::test_flops_by_hand"), True),
    Mutant("png-body", "the HTML report embeds each figure truncated to 60% (a valid header, a damaged body)",
           "fairseq_headprune/report/document.py", "base64.b64encode(f.read())",
           "base64.b64encode((lambda b: b[: len(b) * 6 // 10])(f.read()))",
           ("tests/test_document.py", "tests/test_report.py::test_html_report_loads_in_chromium_with_every_image"),
           True),
    # ---- claims: the other boundaries and windows
    Mutant("c5-window-low", "C5: window includes 0% pruned", "fairseq_headprune/report/claims.py",
           'low < r["percent_pruned"] <= high', 'low <= r["percent_pruned"] <= high',
           ("tests/test_claims_rules.py",)),
    Mutant("c5-window-high", "C5: window excludes 50% pruned", "fairseq_headprune/report/claims.py",
           'low < r["percent_pruned"] <= high', 'low < r["percent_pruned"] < high',
           ("tests/test_claims_rules.py",)),
    Mutant("c5-margin", "C5: last > first + margin instead of >=", "fairseq_headprune/report/claims.py",
           "SUPPORTED if last >= first + C5_MARGIN else", "SUPPORTED if last > first + C5_MARGIN else",
           ("tests/test_claims_rules.py",)),
    Mutant("c1-boundary", "C1: >= 50% instead of > 50%", "fairseq_headprune/report/claims.py",
           'return _claim("C1", ours, SUPPORTED if share_enc > 50 else',
           'return _claim("C1", ours, SUPPORTED if share_enc >= 50 else', ("tests/test_claims_rules.py",)),
    Mutant("c3-tolerance", "C3: a step exactly 0.5 BLEU below counts as a loss", "fairseq_headprune/report/claims.py",
           "if bleu < base - tolerance:", "if bleu <= base - tolerance:", ("tests/test_claims_rules.py",)),
    Mutant("c6-batch-order", "C6: the largest batch size chosen as text", "fairseq_headprune/report/claims.py",
           'sizes = sorted(speed["batch_sizes"], key=int)', 'sizes = sorted(speed["batch_sizes"])',
           ("tests/test_claims_rules.py",)),
    Mutant("c6-noise", "C6: >= instead of > beyond the noise", "fairseq_headprune/report/claims.py",
           'faster = pr["sentences_per_s"] - pr["sentences_per_s_std"] > ma["sentences_per_s"]',
           'faster = pr["sentences_per_s"] - pr["sentences_per_s_std"] >= ma["sentences_per_s"]',
           ("tests/test_claims_rules.py",)),
    Mutant("c6-unpruned", "C6: pruned against the unpruned model (not equal work)",
           "fairseq_headprune/report/claims.py",
           'ma, pr = row.get("masked"), row.get("pruned") or {}',
           'ma, pr = row.get("unpruned"), row.get("pruned") or {}',
           ("tests/test_claims_rules.py",)),
    Mutant("v-control", "V: every model measured from the un-fine-tuned model, never its lambda = 0 control",
           "fairseq_headprune/report/claims.py", "return (control[\"bleu\"], control) if control else (untuned, None)",
           "return (untuned, None)", ("tests/test_claims_rules.py",)),
    Mutant("c1-pooled", "C1 judged on every head pooled, not encoder self-attention",
           "fairseq_headprune/report/claims.py",
           'return _claim("C1", ours, SUPPORTED if share_enc > 50 else',
           'return _claim("C1", ours, SUPPORTED if share_all > 50 else', ("tests/test_claims_rules.py",)),
    # ---- statistics and gates
    Mutant("stats-half-resamples", "bootstrap resamples of half the set by default", "fairseq_headprune/stats.py",
           "sample_ratio: float = 1.0):", "sample_ratio: float = 0.5):", ("tests/test_stats.py",)),
    Mutant("stats-ratio-ignored", "the sample ratio is ignored: resamples are always full-size",
           "fairseq_headprune/stats.py", "self.sample_size = int(len(self.refs) * sample_ratio)",
           "self.sample_size = int(len(self.refs))", ("tests/test_stats.py",)),
    Mutant("stats-seed", "bootstrap resamples not seeded", "fairseq_headprune/stats.py",
           "np.random.seed(self.seed)", "pass", ("tests/test_stats.py",)),
    Mutant("gates-p-open", "P(open) with log(r / -l) instead of log(-l / r)", "fairseq_headprune/core/gates.py",
           "torch.sigmoid(log_alpha - temperature * math.log(-low / high))",
           "torch.sigmoid(log_alpha - temperature * math.log(high / -low))", ("tests/test_gate_math.py",)),
    Mutant("gates-temperature-eval", "evaluation gate divided by the temperature", "fairseq_headprune/core/gates.py",
           "return stretch_and_clip(torch.sigmoid(log_alpha), stretch)",
           "return stretch_and_clip(torch.sigmoid(log_alpha / TEMPERATURE), stretch)", ("tests/test_gate_math.py",)),
    Mutant("l0-sum", "L0 of the first gated module only",
           "fairseq_headprune/criterions/label_smoothed_cross_entropy_l0.py",
           "l0 = sum(g.expected_l0() for g in gates.values())", "l0 = next(iter(gates.values())).expected_l0()",
           ("tests/test_gate_math.py",)),
    # ---- FLOPs
    Mutant("flops-steps", "decode FLOPs without the self-attention over the steps so far",
           "fairseq_headprune/core/flops.py",
           "+ 2 * steps_sum * sa)", ")", ("tests/test_flops.py", "tests/test_science_fixes.py::test_flops_by_hand")),
    Mutant("flops-cross-source", "decode FLOPs without the cross-attention over the source at each step",
           "fairseq_headprune/core/flops.py", "+ 2 * s * ca + 2 * d * ffn)", "+ 2 * d * ffn)",
           ("tests/test_flops.py", "tests/test_science_fixes.py::test_flops_by_hand")),
    Mutant("flops-beam-kv", "enc-dec keys/values projected once per sentence, not per beam row",
           "fairseq_headprune/core/flops.py", "macs += beam * 2 * s * d * ca", "macs += 2 * s * d * ca",
           ("tests/test_flops.py", "tests/test_science_fixes.py::test_flops_by_hand")),
    # ---- evaluation: references and the batching guard
    Mutant("batches-guard", "a subset batched incompletely is scored anyway", "fairseq_headprune/fairseq_io/loading.py",
           "if batched != len(dataset):", "if False:", ("tests/test_evaluate.py",)),
    Mutant("references-length", "a reference file of another length is accepted",
           "fairseq_headprune/decoding/evaluate.py",
           "if len(refs) != self.size:", "if False:", ("tests/test_evaluate.py",)),
    Mutant("references-bpe-kept", "references scored with their BPE", "fairseq_headprune/decoding/evaluate.py",
           "tgt_dict.string(tokens.int().cpu(), self.post_process, escape_unk=True)",
           "tgt_dict.string(tokens.int().cpu(), None, escape_unk=True)", ("tests/test_evaluate.py",)),
    # ---- run identity
    Mutant("compare-identity-importance", "compare.jsonl's header without the importance file's hash (a rerun with "
           "another importance file resumes and mixes rows)", "fairseq_headprune/studies/compare.py",
           'inputs={"importance_sha256": input_file(options.importance)}', "inputs={}",
           ("tests/test_run_identity.py::test_compare_rerun_with_another_setup_is_refused_and_mixes_no_rows",)),
    # ---- importance
    Mutant("importance-abs-after-sum", "|dL/dxi| taken after summing over sentences",
           "fairseq_headprune/core/importance.py",
           "grad.detach().double().abs().sum(0)", "grad.detach().double().sum(0).abs()",
           ("tests/test_importance.py",)),
)


def make_copy(dest: Path) -> None:
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", ".cache", "*.pyc"))
        else:
            shutil.copy2(src, dest / name)
    for name in LINKED:
        if (ROOT / name).exists():
            os.symlink(ROOT / name, dest / name)


def apply(copy: Path, mutant: Mutant) -> bool:
    path = copy / mutant.path
    if not path.exists():
        return False
    text = path.read_text(encoding="utf-8")
    if text.count(mutant.old) != 1:
        return False
    path.write_text(text.replace(mutant.old, mutant.new), encoding="utf-8")
    return True


def run_tests(copy: Path, tests: Sequence[str], timeout: float) -> Tuple[str, List[str], float]:
    """('pass' | 'fail' | 'timeout' | 'error', failing test ids, seconds) of pytest on the copy."""
    env = {**os.environ, "PYTHONPATH": str(copy), "OMP_NUM_THREADS": "1",
           "HEADPRUNE_TEST_CACHE": os.environ.get("HEADPRUNE_TEST_CACHE", str(ROOT / "tests" / ".cache"))}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", *tests]
    start = time.time()
    try:
        proc = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", [], time.time() - start
    seconds = time.time() - start
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, re.M)
    if proc.returncode == 0:
        return "pass", [], seconds
    if proc.returncode == 1:
        return "fail", failed, seconds
    return "error", failed or [proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "?"], seconds


def check_imports_the_copy(copy: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(copy)}
    out = subprocess.run([sys.executable, "-c", "import fairseq_headprune; print(fairseq_headprune.__file__)"],
                         cwd=copy, env=env, capture_output=True, text=True, check=True).stdout.strip()
    if not out.startswith(str(copy)):
        raise SystemExit(f"the copy does not shadow the installed package: fairseq_headprune imports from {out}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="comma-separated mutant names")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per test run (a timeout counts as killed)")
    parser.add_argument("--out", default=str(ROOT / "results" / "mutation" / "mutation.txt"))
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--skip-baseline", action="store_true", help="do not run the unmutated tests first")
    args = parser.parse_args(argv)
    mutants = list(MUTANTS)
    if args.only:
        names = args.only.split(",")
        unknown = set(names) - {m.name for m in mutants}
        if unknown:
            parser.error(f"unknown mutants: {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m.name in names]
    if args.list:
        for m in mutants:
            print(f"{m.name:24} {'[issue 19] ' if m.issue_19 else ''}{m.what}  ({m.path}; {', '.join(m.tests)})")
        return 0

    lines: List[str] = []

    def say(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *COPIED], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    say(f"mutation check, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit}"
        + (" (working tree with uncommitted changes)" if dirty else ""))
    say(f"{len(mutants)} mutants, each applied alone to a copy of fairseq_headprune/; OMP_NUM_THREADS=1")
    say()
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="headprune-mutation-") as tmp:
        if not args.skip_baseline:
            base = Path(tmp) / "baseline"
            base.mkdir()
            make_copy(base)
            check_imports_the_copy(base)
            tests = sorted({t for m in mutants for t in m.tests})
            status, failed, seconds = run_tests(base, tests, args.timeout * 2)
            say(f"baseline (no mutant): {status} in {seconds:.0f} s" + (f": {', '.join(failed)}" if failed else ""))
            if status != "pass":
                say("the tests fail without a mutant: no verdict is meaningful")
                return 1
            shutil.rmtree(base)
        counts = {"killed": 0, "survived": 0, "stale": 0}
        for m in mutants:
            copy = Path(tmp) / m.name
            copy.mkdir()
            make_copy(copy)
            if not apply(copy, m):
                counts["stale"] += 1
                say(f"STALE     {m.name}: its snippet is not (exactly once) in {m.path}: update the mutant")
                shutil.rmtree(copy)
                continue
            check_imports_the_copy(copy)
            status, failed, seconds = run_tests(copy, m.tests, args.timeout)
            killed = status != "pass"
            counts["killed" if killed else "survived"] += 1
            by = (f"by {len(failed)} test{'s' if len(failed) > 1 else ''}: {', '.join(failed[:4])}"
                  + (", ..." if len(failed) > 4 else "")) if failed else f"({status})"
            tag = "[issue 19] " if m.issue_19 else ""
            say(f"{'KILLED ' if killed else 'SURVIVED'}  {m.name}: {tag}{m.what}; {by if killed else 'tests pass'}"
                f" [{seconds:.0f} s]")
            shutil.rmtree(copy)
    say()
    say(f"killed {counts['killed']}, survived {counts['survived']}, stale {counts['stale']} "
        f"of {len(mutants)} mutants in {(time.time() - start) / 60:.1f} min")
    if not args.no_write:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"wrote {out}")
    return 0 if counts["survived"] == 0 and counts["stale"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
