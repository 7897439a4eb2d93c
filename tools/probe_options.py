"""Replay the probes of a hostile user against the released commands, on the tests' tiny models.

    .venv/bin/python tools/probe_options.py [--data DATA-BIN --path CKPT] [--only WORD] [--skip-generate]

Each case ends as *applied and tested* (the option reaches the same fairseq call as fairseq-generate and gives its
hypotheses; a resume is accepted with the same rows; a written pair is whole) or as a *one-line refusal* (exit code
2, `fairseq-headprune CMD: error: ...`, no traceback, nothing written). One line per case; the exit code is the
number of cases that regressed (0: all hold). Classes: options recorded but not applied, a report of another
model, a written model lost, a resume refused for batching, tracebacks and leftover processes, "stock" that is not.

Without --data/--path it uses the test suite's cached tiny model and data (tests/conftest.py builds them once per
machine) and the first 48 test sentences. Commands run in this process (the CLI's entry point), as the tests run
them, except the leftover-process case, which must kill a real one.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")

import conftest  # noqa: E402  the tests' cached tiny models and their in-process runners

CASES: List[Tuple[str, Callable[["Probe"], str]]] = []


def case(name: str):
    def register(fn):
        CASES.append((name, fn))
        return fn
    return register


class Regression(Exception):
    """A case that no longer ends as applied-and-tested or as a one-line refusal."""


def replay(cases, probe, wanted: Callable[[str], bool]) -> Tuple[int, int]:
    """Run the wanted cases on the probe, one line each; (cases run, cases regressed). A case's crash is a
    regression too."""
    ran = failures = 0
    for name, fn in cases:
        if not wanted(name):
            continue
        ran += 1
        t = time.time()
        try:
            result, ok = fn(probe), True
        except Regression as e:
            result, ok = str(e), False
        except Exception as e:  # noqa: BLE001 - a crash of the case is a regression too
            result, ok = f"{type(e).__name__}: {str(e).strip().splitlines()[-1:] or ''}", False
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {result} ({time.time() - t:.1f} s)", flush=True)
    return ran, failures


def expect(condition, what: str) -> None:
    if not condition:
        raise Regression(what)


class Probe:
    def __init__(self, data: Path, checkpoint: Path, work: Path):
        self.data, self.checkpoint, self.work = data, checkpoint, work
        self.n = 0

    def folder(self, name: str) -> Path:
        self.n += 1
        return self.work / f"{self.n:02d}-{name}"

    def cli(self, command: str, *argv, results=True):
        """fairseq-headprune COMMAND on the probe's model (in this process): (exit code, stdout, stderr, out dir)."""
        out = self.folder(command)
        extra = ["--results-dir", str(out)] if results else []
        proc = conftest._run_cli_in_process([command, str(self.data), "--path", str(self.checkpoint),
                                             "--gen-subset", "test", *extra, *map(str, argv)], check=False)
        return proc.returncode, proc.stdout, proc.stderr, out

    def refused(self, command: str, *argv, names: str, results=True, written: Path = None) -> str:
        """A one-line refusal naming `names`, exit 2, no traceback, nothing written."""
        code, _, err, out = self.cli(command, *argv, results=results)
        lines = err.strip().splitlines()
        expect(code == 2, f"exit {code}, not 2: {lines[-1] if lines else ''}")
        expect("Traceback" not in err, "a traceback: " + (lines[-1] if lines else ""))
        last = lines[-1] if lines else ""
        expect(last.startswith(f"fairseq-headprune {command}: error: "), f"not the one-line form: {last}")
        expect(names in last, f"does not name {names}: {last}")
        where = written or out  # the folder may exist with its lock file: no result in it
        expect(not where.exists() or not [f for f in os.listdir(where) if not f.startswith(".")],
               f"wrote into {where}")
        return "refused: " + last.split("error: ", 1)[1][:110]


# ---------------------------------------------------------------- 1. options recorded but not applied

def _option_cases():
    import test_fairseq_options as fo_tests

    for _name, argv in sorted(fo_tests.REFUSED_CASES.items()):
        case(f"option {' '.join(argv)}")(
            lambda p, argv=argv: p.refused("ablate", *fo_tests.BASE, *argv, names=argv[0]))
    case("option --sampling --seed 7 (issue: noise marked significant)")(
        lambda p: p.refused("ablate", "--sampling", "--seed", "7", names="--sampling"))
    for _name, (option, context) in sorted(fo_tests.DECODE_CASES.items()):
        case(f"option {' '.join(option)} applied as fairseq-generate applies it")(
            lambda p, option=option, context=context: _applied(p, fo_tests, option, context))


def _applied(p: Probe, fo_tests, option, context) -> str:
    if p.skip_generate:
        return "skipped (--skip-generate)"
    theirs = fo_tests._generate(p.data, p.checkpoint, [*context, *option])
    one, shared = fo_tests._ours(p.data, p.checkpoint, [*context, *option])
    expect(one == theirs and shared == theirs, "hypotheses differ from fairseq-generate's")
    expect(theirs != fo_tests._generate(p.data, p.checkpoint, list(context)), "the option changed nothing")
    return f"applied: {len(theirs)} hypotheses equal to fairseq-generate's, and changed by the option"


# ---------------------------------------------------------------- 2. a report of another model

REPORT = ["--beam", "1", "--max-tokens", "3000", "--parts", "score", "--workers", "1"]


def _score_report(p: Probe) -> Path:
    if getattr(p, "report_dir", None) is None:
        code, _, err, out = p.cli("report", *REPORT)
        expect(code == 0, f"report failed: {err.strip().splitlines()[-1:]}")
        p.report_dir = out
    return p.report_dir


@case("report without --dynamics: C5 not judged on the bundled model's training run")
def _report_own_dynamics(p: Probe) -> str:
    out = _score_report(p)
    claims = json.loads((out / "claims.json").read_text())
    c5 = next(c for c in claims["claims"] if c["id"] == "C5")
    expect(c5["verdict"] == "not run" and not claims["inputs"]["dynamics"], f"C5 {c5['verdict']} from "
           f"{claims['inputs']['dynamics']}")
    return "applied: C5 not run, no dynamics read"


@case("report --dynamics of another model: judged, and the report says whose")
def _report_named_dynamics(p: Probe) -> str:
    out = _score_report(p)
    bundled = ROOT / "results" / "dynamics" / "dynamics.jsonl"
    proc = conftest._run_cli_in_process(["report", str(p.data), "--path", str(p.checkpoint), "--gen-subset", "test",
                                         "--results-dir", str(out), *REPORT, "--render-only", "--dynamics",
                                         str(bundled)], check=False)
    expect(proc.returncode == 0, f"exit {proc.returncode}")
    c5 = next(c for c in json.loads((out / "claims.json").read_text())["claims"] if c["id"] == "C5")
    md = (out / "report.md").read_text()
    expect(c5["whose"] and "another model's training run" in c5["whose"], f"C5 row says nothing of whose: {c5}")
    expect("Not this model's" in md and c5["whose"] in md, "the report does not say whose the dynamics are")
    return "applied: C5 judged on the named file, marked another model's training run"


@case("report --render-only of a folder holding another checkpoint's results")
def _report_render_foreign(p: Probe) -> str:
    other = p.folder("foreign")
    shutil.copytree(_score_report(p), other)
    data = json.loads((other / "importance.json").read_text())
    data["meta"]["checkpoint_sha256"] = "0" * 64  # as another model's I_h
    (other / "importance.json").write_text(json.dumps(data))
    before = (other / "report.md").read_bytes()
    proc = conftest._run_cli_in_process(["report", str(p.data), "--path", str(p.checkpoint), "--gen-subset", "test",
                                         "--results-dir", str(other), *REPORT, "--render-only"], check=False)
    last = proc.stderr.strip().splitlines()[-1:] or [""]
    expect(proc.returncode == 2 and "holds results of checkpoint 000000000000" in last[0], f"{proc.returncode} {last}")
    expect((other / "report.md").read_bytes() == before, "the report was rewritten")
    return "refused: " + last[0].split("error: ", 1)[1][:110]


@case("make demo judges claim V on the encoder-only L0 sweep, as the study does")
def _demo_encoder_sweep(p: Probe) -> str:
    from fairseq_headprune.report import sections

    demo = (ROOT / "recipes" / "demo.sh").read_text()
    sweep = ROOT / "results" / "voita" / "encoder-only" / "compare.jsonl"
    expect("--l0-encoder-sweep" in demo and "results/voita/encoder-only/compare.jsonl" in demo,
           "demo.sh does not pass the encoder-only sweep")
    expect(sweep.exists(), f"{sweep} is missing")
    bundled = hashlib.sha256((ROOT / "checkpoints" / "de-en" / "model.pt").read_bytes()).hexdigest()
    expect(sections.whose(str(sweep), bundled) is None, "the encoder-only sweep is not the bundled model's")
    return "applied: demo.sh passes --l0-encoder-sweep (the bundled model's own sweep)"


# ---------------------------------------------------------------- 3. a written model lost

SHRINK = ["--remove", "25%", "--calibration-subset", "test", "--calibration-sentences", "16", "--max-tokens", "3000"]


@case("shrink --out X.json (its record would overwrite the model)")
def _shrink_json(p: Probe) -> str:
    out = p.folder("shrink-json")
    out.mkdir()
    return p.refused("shrink", *SHRINK, "--out", out / "x.json", names="--out", results=False, written=out)


@case("two shrink processes writing the same --out")
def _shrink_locked(p: Probe) -> str:
    out = p.folder("shrink-lock")
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (  # the other writer, still running (another process: the
        # lock is re-entrant within one)
        "import time\nfrom fairseq_headprune.fairseq_io.checkpoint_io import output_lock\n"
        f"with output_lock({str(out / 'm.pt')!r}):\n    print('held', flush=True)\n    time.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
    try:
        expect(holder.stdout.readline().strip() == "held", "the other writer did not start")
        return p.refused("shrink", *SHRINK, "--out", out / "m.pt", names="another fairseq-headprune process",
                         results=False, written=out / "m.pt")
    finally:
        holder.kill()
        holder.wait()


@case("shrink writes the model and its record as one pair, and says it needs --user-dir")
def _shrink_pair(p: Probe) -> str:
    from fairseq_headprune.records.identity import file_sha256

    out = p.folder("shrink")
    out.mkdir()
    code, stdout, err, _ = p.cli("shrink", *SHRINK, "--out", out / "m.pt", results=False)
    expect(code == 0, f"exit {code}: {err.strip().splitlines()[-1:]}")
    record = json.loads((out / "m.json").read_text())
    expect(record.get("checkpoint_sha256") == file_sha256(str(out / "m.pt")), "the record names another file")
    expect(not [f for f in os.listdir(out) if f.startswith(".") and not f.endswith(".lock")], "temporaries left")
    expect("--user-dir fairseq_headprune" in stdout, "the output does not say it needs --user-dir")
    return "applied: m.pt and m.json (its sha256) written whole; says --user-dir fairseq_headprune"


# ---------------------------------------------------------------- 4. a resume refused for batching

@case("a finished sweep rerun with another --max-tokens and --batch-size")
def _resume_batching(p: Probe) -> str:
    out = p.folder("resume")
    base = ["ablate", str(p.data), "--path", str(p.checkpoint), "--results-dir", str(out), "--gen-subset", "test",
            "--metric", "loss", "--types", "dec-self", "--workers", "1"]
    first = conftest._run_cli_in_process(base + ["--max-tokens", "3000"], check=False)
    expect(first.returncode == 0, "first run failed")
    rows = (out / "ablation-single-loss.jsonl").read_text().splitlines()
    again = conftest._run_cli_in_process(base + ["--max-tokens", "150", "--batch-size", "3"], check=False)
    expect(again.returncode == 0, "resume refused: " + (again.stderr.strip().splitlines() or [""])[-1])
    expect((out / "ablation-single-loss.jsonl").read_text().splitlines()[1:] == rows[1:], "other rows")
    return f"applied: accepted, the same {len(rows) - 1} rows"


# ---------------------------------------------------------------- 5. tracebacks and leftovers

TOO_SMALL = ["--max-tokens", "5"]
COMMANDS = {  # every command that batches the data, with what it needs besides the data and model
    "score": [], "ablate": ["--types", "enc-dec"], "prune": ["--importance-subset", "test"], "analyze": [],
    "report": ["--parts", "score"], "deploy": ["--calibration-sentences", "16"],
}  # speed batches by its own --batch-sizes, and shrink's calibration one sentence at a time under a small budget


def _too_small_cases():
    for command, extra in COMMANDS.items():
        case(f"{command} --max-tokens smaller than a sentence")(
            lambda p, command=command, extra=extra: p.refused(command, *extra, *TOO_SMALL, names="--max-tokens 5"))
    case("remove --max-tokens smaller than a sentence")(_remove_too_small)


def _remove_too_small(p: Probe) -> str:
    out = p.folder("remove")
    out.mkdir()
    return p.refused("remove", "--heads", "enc-self:1:1", *TOO_SMALL, "--out", out / "m.pt", names="--max-tokens 5",
                     results=False, written=out)


@case("ablate --min-len beyond the longest hypothesis allowed")
def _min_len(p: Probe) -> str:
    return p.refused("ablate", "--types", "enc-dec", "--max-tokens", "3000", "--min-len", "500", "--max-len-b", "5",
                     names="--min-len")


@case("ablate --temperature 0")
def _temperature(p: Probe) -> str:
    return p.refused("ablate", "--types", "enc-dec", "--max-tokens", "3000", "--temperature", "0",
                     names="--temperature")


@case("score --max-source-positions shorter than a sentence (no --truncate-source)")
def _positions(p: Probe) -> str:
    return p.refused("score", "--max-tokens", "3000", "--max-source-positions", "4",
                     names="--skip-invalid-size-inputs-valid-test")


def _children(pid: int) -> List[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@case("a sweep on two workers killed with SIGKILL leaves no process behind")
def _leftovers(p: Probe) -> str:
    out = p.folder("killed")
    cmd = [str(conftest.BIN / "fairseq-headprune"), "ablate", str(p.data), "--path", str(p.checkpoint),
           "--results-dir", str(out), "--gen-subset", "test", "--beam", "2", "--max-tokens", "400", "--workers", "2",
           "--masks-per-batch", "1"]
    proc = subprocess.Popen(cmd, env=conftest.ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    spawned, deadline = set(), time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        spawned |= set(_children(proc.pid))
        log = out / "ablation-single.jsonl"
        if len(spawned) >= 2 and log.exists() and log.read_text().count("\n") >= 4:  # workers decoding
            break
        time.sleep(0.2)
    expect(proc.poll() is None, "the sweep ended before it could be killed")
    spawned |= set(_children(proc.pid))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 60  # a worker still starting up on a busy machine exits when it gets going
    while time.time() < deadline and any(map(_alive, spawned)):
        time.sleep(0.2)
    left = [pid for pid in spawned if _alive(pid)]
    expect(not left, f"{len(left)} of its {len(spawned)} processes alive 60 s after the kill: {left}")
    return f"applied: its {len(spawned)} processes (worker, resource tracker) gone after the kill"


# ---------------------------------------------------------------- main

def tiny_model(work: Path) -> Tuple[Path, Path]:
    """The tests' cached tiny data and stock model, the first 48 test sentences binarised (as tiny_slice)."""
    data = conftest._cached_data()
    checkpoint = conftest.cached_build("stock", conftest.stock_key(), lambda out: conftest.train(data, out))
    checkpoint = checkpoint / "checkpoint_last.pt"
    out = work / "slice"
    out.mkdir()
    for lang in ("de", "en"):
        lines = (data / f"test.bpe.{lang}").read_text(encoding="utf-8").splitlines()[:48]
        (out / f"test.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    conftest.run_fairseq(["fairseq-preprocess", "--source-lang", "de", "--target-lang", "en", "--srcdict",
                          data / "dict.de.txt", "--tgtdict", data / "dict.en.txt", "--testpref", out / "test",
                          "--destdir", out, "--workers", "1"])
    return out, checkpoint


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", help="a binarised data folder with a test subset (default: the tests' tiny data)")
    parser.add_argument("--path", help="its checkpoint (default: the tests' tiny stock model)")
    parser.add_argument("--only", help="run the cases whose name contains this word")
    parser.add_argument("--skip-generate", action="store_true",
                        help="skip the comparisons with fairseq-generate (the slowest cases)")
    args = parser.parse_args()
    from fairseq_headprune.fairseq_io.loading import trust_fairseq_checkpoints

    trust_fairseq_checkpoints()
    _option_cases()
    _too_small_cases()
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="probe-options-") as tmp:
        work = Path(tmp)
        data, checkpoint = (Path(args.data), Path(args.path)) if args.data else tiny_model(work)
        probe = Probe(data, checkpoint, work)
        probe.skip_generate = args.skip_generate
        ran, failures = replay(CASES, probe, lambda name: not args.only or args.only in name)
    print(f"probe_options: {ran} cases, {failures} regressed, {time.time() - start:.0f} s")
    return min(failures, 100)


if __name__ == "__main__":
    sys.exit(main())
