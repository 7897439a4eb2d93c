"""A `compress` run folder is self-contained: its stage records name the files inside it relative to it, so the
same command resumes from any directory, and a folder moved or copied elsewhere resumes with --out at its new
place; the recovery's folder (--stop-after shrink) holds its script and every file it reads, runs from anywhere
once copied, and --recovered adopts its result from a third directory. The first line's estimate counts exactly
the stages the command will run."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BIN, ENV, run
from test_compress import compress_argv, stage_names

from fairseq_headprune.compress.options import STAGES

ESTIMATE = re.compile(r"this run will cost about ([\d.]+) CPU minutes on this machine \((.*?); from rates")


def in_folder(folder: Path, argv) -> str:
    """A command run with `folder` as the working directory; its output."""
    before = os.getcwd()
    os.chdir(folder)
    try:
        return run(argv).stdout
    finally:
        os.chdir(before)


def estimate(printed: str):
    """The first line's total, and each stage's figure there ('cached' or its CPU minutes; after --stop-after, in
    `later`)."""
    total, parts = ESTIMATE.search(printed.splitlines()[0]).groups()
    counted, _, later = parts.partition("; not run (--stop-after ")
    figures = dict(part.rsplit(" ", 1) for part in counted.split(", "))
    later = dict(part.rsplit(" ", 1) for part in later.split("): ", 1)[1].split(", ")) if later else {}
    return float(total), figures, later


def stage_records(out: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(out.glob("stages/*/stage.json")))


@pytest.fixture(scope="module")
def finished(tiny_data, stock_checkpoint, tmp_path_factory):
    """A run started with a relative --out (stopped after its shrink) in one directory, its folder moved, then
    finished with --out at its new place from another directory: (folder, cost cache, the two outputs)."""
    root = tmp_path_factory.mktemp("run-folder")
    first, second, cache = root / "first", root / "second", root / "cache"
    first.mkdir()
    second.mkdir()
    started = in_folder(first, compress_argv(tiny_data, stock_checkpoint, "rel_out", cache, "--stop-after", "shrink"))
    moved = root / "moved"
    (first / "rel_out").rename(moved)
    finished = in_folder(second, compress_argv(tiny_data, stock_checkpoint, moved, cache))
    return moved, cache, started, finished


def test_a_moved_run_folder_resumes_from_another_directory(finished):
    out, _, started, printed = finished
    assert stage_names(started, "done") == ["cost-table", "choice", "shrink"]
    assert stage_names(printed, "cached") == ["cost-table", "choice", "shrink"]
    assert stage_names(printed, "done") == ["recover", "export", "measure", "report"]
    assert (out / "compress.json").exists() and (out / "ct2" / "model.bin").exists()
    records = stage_records(out)
    assert str(out) not in records and "rel_out" not in records  # paths inside the folder: relative to it
    shrink = json.loads((out / "stages" / "shrink" / "stage.json").read_text())
    assert shrink["result"]["checkpoint"] == "stages/shrink/model.pt" and ["checkpoint"] in shrink["run_folder_paths"]
    # the user's own files stay absolute; the record written for the reader names the folder as OUT
    record = json.loads((out / "compress.json").read_text())
    assert record["stages"]["recover"]["checkpoint"] == "OUT/stages/recover/model.pt"
    # the recovery's script names no folder of the run's first place (it finds its files beside itself)
    assert str(out.parent / "first") not in (out / "recovery-run" / "recovery-run.sh").read_text()


def test_the_first_line_counts_exactly_the_stages_the_command_runs(finished, tiny_data, stock_checkpoint, tmp_path):
    moved, cache, started, _ = finished
    # --stop-after shrink: the stages after it named apart, not counted
    total, counted, later = estimate(started)
    assert list(counted) == ["cost-table", "choice", "shrink"] and list(later) == list(STAGES[3:])
    assert abs(total - sum(float(v) for v in counted.values())) < 0.15
    out = tmp_path / "copy"  # a copy of the finished folder resumes where it lies, every stage cached
    shutil.copytree(moved, out, symlinks=True)
    total, counted, _ = estimate(run(compress_argv(tiny_data, stock_checkpoint, out, cache, "--dry-run")).stdout)
    assert total == 0.0 and set(counted.values()) == {"cached"} and list(counted) == list(STAGES)
    # another --shape: the choice and every stage after it run, each with its estimate
    printed = run(compress_argv(tiny_data, stock_checkpoint, out, cache, "--shape", "3/2x1", "--dry-run")).stdout
    total, counted, _ = estimate(printed)
    assert counted["cost-table"] == "cached" and all(counted[n] != "cached" for n in STAGES[1:])
    lines = {line.split()[0]: line.split()[1] for line in printed.splitlines() if line.startswith("  ")}
    assert [n for n in STAGES if lines[n] == "cached:"] == ["cost-table"]  # --dry-run's lines agree
    # --runs where the timing's rounds stay as they were (raised to the sign tests' least): the cost table and the
    # choice timed as before, the measure times its other batch over --runs: it and the report run
    printed = run(compress_argv(tiny_data, stock_checkpoint, out, cache, "--runs", "2", "--dry-run")).stdout
    assert [n for n in STAGES if estimate(printed)[1][n] != "cached"] == ["measure", "report"]
    # an option only the measure reads: the measure and the report run, and exactly those
    printed = run(compress_argv(tiny_data, stock_checkpoint, out, cache, "--latency-sentences", "5")).stdout
    total, counted, _ = estimate(printed)
    assert [n for n in STAGES if counted[n] != "cached"] == ["measure", "report"]
    assert abs(total - float(counted["measure"]) - float(counted["report"])) < 0.15
    assert stage_names(printed, "done") == ["measure", "report"]
    assert stage_names(printed, "cached") == list(STAGES[:5])


def test_the_recovery_folder_runs_elsewhere_and_is_adopted_from_a_third_directory(tiny_data, stock_checkpoint,
                                                                                  tmp_path):
    user = tmp_path / "user"  # the user's files, out of reach while the recovery runs elsewhere
    data = shutil.copytree(tiny_data, user / "data")
    checkpoint = shutil.copyfile(stock_checkpoint, user / "model.pt")
    here, gpu, third, hidden = (tmp_path / name for name in ("here", "gpu", "third", "hidden"))
    for folder in (here, gpu, third, hidden):
        folder.mkdir()
    cache = tmp_path / "cache"
    printed = in_folder(here, compress_argv(data, checkpoint, "out", cache, "--stop-after", "shrink"))
    out = here / "out"
    place = out / "recovery-run"
    assert f"{place}/ holds its script recovery-run.sh and every file it reads" in printed
    script = (place / "recovery-run.sh").read_text()
    assert str(tmp_path) not in script and "$here/student.pt" in script and "$here/teacher.pt" in script
    inputs = json.loads((place / "inputs.json").read_text())
    assert {"student.pt", "teacher.pt", "recovery-run.sh", "data/train.de-en.en.bin", "data/valid.de-en.de.idx",
            "data/dict.en.txt"} <= set(inputs["files"])
    assert not any(f.startswith("data/test.") or f.endswith(".bpe.de") for f in inputs["files"])  # not read
    shutil.copytree(place, gpu / "recovery-run")  # what the GPU machine needs, copied
    python = tmp_path / "python-without-it"  # $PYTHON a Python that lacks this package: one line, exit code 2
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -I -S "$@"\n')
    python.chmod(0o755)
    lacking = subprocess.run(["sh", str(gpu / "recovery-run" / "recovery-run.sh")], cwd=third, capture_output=True,
                             text=True, env={**ENV, "PYTHON": str(python)})
    assert (lacking.returncode, lacking.stderr) == (2, "fairseq_headprune is not installed for this Python\n")
    user.rename(hidden / "user")
    out.rename(hidden / "out")
    try:
        trained = subprocess.run(["sh", str(gpu / "recovery-run" / "recovery-run.sh"), "--max-update", "3"],
                                 cwd=third, capture_output=True, text=True,
                                 env={**ENV, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"})
    finally:
        (hidden / "user").rename(user)
        (hidden / "out").rename(out)
    assert trained.returncode == 0, trained.stderr[-3000:]
    best = gpu / "recovery-run" / "checkpoint_best.pt"
    assert best.exists() and not list(third.iterdir())  # written beside the script, nothing where it ran from
    printed = in_folder(third, compress_argv(data, checkpoint, os.path.relpath(out, third), cache,
                                             "--recovered", os.path.relpath(best, third)))
    assert stage_names(printed, "cached") == ["cost-table", "choice", "shrink"]
    assert stage_names(printed, "done") == ["recover", "export", "measure", "report"]
    record = json.loads((out / "compress.json").read_text())
    assert record["stages"]["recover"]["device"] == "elsewhere" and (out / "ct2" / "model.bin").exists()
