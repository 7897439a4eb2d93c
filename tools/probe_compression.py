"""Replay the hostile probes of the compression commands (recover, shrink --recover-epochs, export-ct2, deploy,
speed --engine ct2, compress) on the tests' tiny models, so that a regression of any class shows.

    .venv/bin/python tools/probe_compression.py [--only WORD] [--families] [--skip-covered]

Each case ends as *held* (a one-line refusal, exit code 2, nothing written or changed; or the command working)
or as a regression. One line per case; the exit code is the number of regressed cases. Classes: a folder deleted
by --force, a refused run that blocks its correction, two writers of one OUT, shared embeddings stored three
times, checkpoint bytes that depend on a temporary name, options accepted and ignored, misreports; compress
writing over a user's files, refusing after the work began, taking numbers no run can mean, misleading
--recover-args, usage errors of more than one line; with
--families, recover and export-ct2 under the multilingual and mBART tasks (trains the tiny family models once).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch
from pathlib import Path
from typing import Callable, Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")

import conftest  # noqa: E402  the tests' cached tiny models and their in-process runner

CASES: List[Tuple[str, Callable[["Probe"], str]]] = []
# cases a test of the suite runs as its own, stricter check (the case's name -> "tests/FILE.py::TEST"): the suite's
# replay (--skip-covered) leaves them to that test rather than running them twice
COVERED_BY: Dict[str, str] = {}
REMOVED = "enc-self:1:1-7,dec-self:1:1-3"  # a free-shape student


def case(name: str, families: bool = False, covered_by: str = None):
    def register(fn):
        CASES.append((name, fn) if not families else (f"[families] {name}", fn))
        if covered_by:
            COVERED_BY[name] = covered_by
        return fn
    return register


from probe_options import expect, replay  # noqa: E402  one failure type and one runner for both probes


def tree(folder: Path) -> dict:
    """Every file under `folder` by its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


class Probe:
    def __init__(self, data: Path, checkpoint: Path, work: Path):
        self.data, self.checkpoint, self.work = data, checkpoint, work
        self.n = 0
        self._student = None

    def folder(self, name: str) -> Path:
        self.n += 1
        out = self.work / f"{self.n:02d}-{name}"
        out.mkdir()
        return out

    def cli(self, *argv):
        return conftest._run_cli_in_process([str(a) for a in argv], check=False)

    def refused(self, command: str, *argv, names: str) -> str:
        proc = self.cli(command, *argv)
        lines = proc.stderr.strip().splitlines()
        last = lines[-1] if lines else ""
        expect(proc.returncode == 2, f"exit {proc.returncode}, not 2: {last}")
        expect("Traceback" not in proc.stderr, "a traceback: " + last)
        expect(len(lines) == 1 and last.startswith(f"fairseq-headprune {command}: error: "), f"not one line: {last}")
        expect(names in last, f"does not name {names!r}: {last}")
        return "refused: " + last.split("error: ", 1)[1][:110]

    def student(self) -> Path:
        if self._student is None:
            out = self.folder("student") / "pruned.pt"
            proc = self.cli("remove", self.data, "--path", self.checkpoint, "--heads", REMOVED, "--out", out,
                            "--gen-subset", "test")
            expect(proc.returncode == 0, f"remove failed: {proc.stderr[-300:]}")
            self._student = out
        return self._student


# ---------------------------------------------------------------- 1. a folder deleted by --force

EXPORT = ["--gen-subset", "test", "--beam", "2", "--max-tokens", "800", "--check-sentences", "4", "--force"]


def _export_force(p: Probe, folder: Path, names: str) -> str:
    before = tree(folder)
    line = p.refused("export-ct2", p.data, "--path", p.checkpoint, "--out", folder, *EXPORT, names=names)
    expect(tree(folder) == before, f"{folder} changed")
    return line


@case("export-ct2 --force over a folder of the user's files")
def _force_user_folder(p: Probe) -> str:
    folder = p.folder("notes")
    (folder / "notes.txt").write_text("mine")
    return _export_force(p, folder, "notes.txt")


@case("export-ct2 --force over a model folder with a user file beside it")
def _force_mixed(p: Probe) -> str:
    folder = p.folder("mixed")
    for name in ("config.json", "model.bin", "shared_vocabulary.json", "README"):
        (folder / name).write_text("x")
    return _export_force(p, folder, "README")


@case("export-ct2 --force over DATA")
def _force_data(p: Probe) -> str:
    return _export_force(p, p.data, "an input")


@case("export-ct2 --force over the folder holding --path")
def _force_path_folder(p: Probe) -> str:
    return _export_force(p, p.checkpoint.parent, "an input")


# ---------------------------------------------------------------- 2. a refused run blocks its correction

RECOVER_REFUSALS = {
    "--distill-temperature 0": (["--distill-temperature", "0"], "--distill-temperature"),
    "--distill-weight 1.5": (["--distill-weight", "1.5"], "--distill-weight"),
    "--mask-heads naming a removed head": (["--task", "translation_headprune", "--mask-heads", "enc-self:1:2"],
                                           "was removed"),
    "--max-tokens 5": (["--max-tokens", "5"], "--max-tokens 5"),
    "--fp16 on CPU": (["--fp16"], "--fp16"),
    "--sequence-beam 0": (["--distill", "sequences", "--sequence-beam", "0"], "--sequence-beam"),
    "--sequence-beam with --distill logits": (["--sequence-beam", "3"], "does not use"),
}


def _recover_refused(p: Probe, argv, names: str) -> str:
    student, out = p.student(), p.folder("recover") / "r.pt"
    beside = sorted(os.listdir(p.data.parent))
    line = p.refused("recover", p.data, "--path", student, "--teacher", p.checkpoint, "--out", out,
                     "--updates", "2", "--max-tokens", "1500", *argv, names=names)
    expect(not out.exists() and not out.with_suffix(".recover").exists(), "left a model or a run folder")
    expect(sorted(os.listdir(p.data.parent)) == beside, "left a teacher cache beside DATA")
    return line


for _name, (_argv, _names) in RECOVER_REFUSALS.items():
    case(f"recover {_name}")(lambda p, argv=_argv, names=_names: _recover_refused(p, argv, names))


@case("recover with DATA whose dictionaries differ from the model's")
def _recover_dictionaries(p: Probe) -> str:
    other = p.folder("other-dicts")
    for path in p.data.iterdir():
        if path.is_file() and not path.name.startswith("dict."):
            (other / path.name).symlink_to(path)
    for lang in ("de", "en"):
        text = (p.data / f"dict.{lang}.txt").read_text(encoding="utf-8")
        (other / f"dict.{lang}.txt").write_text(text + "zzextra 1\n", encoding="utf-8")
    out = p.folder("recover") / "r.pt"
    line = p.refused("recover", other, "--path", p.student(), "--teacher", p.checkpoint, "--out", out,
                     "--updates", "2", names="dictionaries of")
    expect(not out.with_suffix(".recover").exists(), "left a run folder")
    return line


@case("two recover runs of one --out, different work folders")
def _recover_two_writers(p: Probe) -> str:
    folder = p.folder("two")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, time\n"
        f"fd = os.open({str(folder / '.same.pt.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        expect(holder.stdout.readline().strip() == "held", "the lock holder did not start")
        return p.refused("recover", p.data, "--path", p.student(), "--teacher", p.checkpoint, "--out",
                         folder / "same.pt", "--updates", "2", "--work-dir", folder / "mine",
                         names="being written by another")
    finally:
        holder.kill()
        holder.wait()


# ---------------------------------------------------------------- 3. checkpoint bytes

@case("shrink of an fp16 checkpoint stores the shared embeddings once (smaller than its parent)")
def _shared_once(p: Probe) -> str:
    import torch

    folder = p.folder("fp16")
    state = torch.load(p.checkpoint, map_location="cpu", weights_only=False)
    halves = {}
    state["model"] = {k: halves.setdefault(v.data_ptr(), v.half()) if v.is_floating_point() else v
                      for k, v in state["model"].items()}
    torch.save(state, folder / "half.pt")
    out = folder / "small.pt"
    proc = p.cli("shrink", p.data, "--path", folder / "half.pt", "--remove", "50%", "--out", out,
                 "--calibration-subset", "test", "--calibration-sentences", "16", "--max-tokens", "1500",
                 "--no-check")
    expect(proc.returncode == 0, f"shrink failed: {proc.stderr.strip().splitlines()[-1:]}")
    small, parent = out.stat().st_size, (folder / "half.pt").stat().st_size
    expect(small < parent, f"{small} bytes, its parent {parent}")
    return f"held: {small} bytes against its parent's {parent}"


@case("equal checkpoint states written under two temporary names are equal bytes")
def _deterministic(p: Probe) -> str:
    import torch

    from fairseq_headprune.fairseq_io.checkpoint_io import save_state

    folder = p.folder("bytes")
    state = torch.load(p.checkpoint, map_location="cpu", weights_only=False)
    save_state(state, str(folder / ".a.pt.x1.tmp"))
    save_state(state, str(folder / ".b.pt.y2.tmp"))
    expect((folder / ".a.pt.x1.tmp").read_bytes() == (folder / ".b.pt.y2.tmp").read_bytes(), "bytes differ")
    return "held: equal bytes"


# ---------------------------------------------------------------- 4. options accepted and ignored, misreports

@case("deploy --candidate naming a free-shape model")
def _deploy_candidate(p: Probe) -> str:
    out = p.folder("deploy")
    return p.refused("deploy", p.data, "--path", p.checkpoint, "--results-dir", out, "--gen-subset", "test",
                     "--shrink-percent", "0", "--compare", f"free={p.student()}", "--candidate", "free",
                     names="free shape")


@case("export-ct2 with a binding --max-len-b at beam 3 says the cause")
def _export_length(p: Probe) -> str:
    out = p.folder("length") / "ct2"
    return p.refused("export-ct2", p.data, "--path", p.checkpoint, "--out", out, "--gen-subset", "test",
                     "--beam", "3", "--max-len-b", "3", "--max-tokens", "800", "--check-sentences", "48",
                     names="reach the length limit")


# ------------------------------------------------------- 5. compress: before any work, never over a user's file

COMPRESS = ["--beam", "2", "--max-tokens", "2000", "--max-len-b", "12", "--timing-sentences", "60", "--runs", "1",
            "--calibration-sentences", "48", "--window-steps", "10", "--check-sentences", "16", "--budget-epochs", "1",
            "--significance", "1"]


def _compress_refused(p: Probe, out: Path, *extra, names: str, path: Path = None,
                      target=("--speedup", "1.2")) -> str:
    """compress refused in one line, before any work: --out as it was (or not made), no cost table measured."""
    before = tree(out) if out.is_dir() else None
    cache = p.work / f"cost-cache-{p.n}"
    line = p.refused("compress", p.data, "--path", path or p.checkpoint, "--out", out, *target, *COMPRESS,
                     "--cost-cache", cache, *extra, names=names)
    expect((tree(out) if out.is_dir() else None) == before, f"{out} changed")
    expect(not cache.exists(), "a cost table was measured before the refusal")
    return line


@case("compress --out = the folder of --path (the user's model.pt and MODEL_CARD.md)")
def _compress_path_folder(p: Probe) -> str:
    folder = p.folder("users-model")
    shutil.copyfile(p.checkpoint, folder / "model.pt")
    (folder / "MODEL_CARD.md").write_text("my card")
    return _compress_refused(p, folder, path=folder / "model.pt", names="is or holds an input")


@case("compress --out holding a user's file under ct2/")
def _compress_ct2_file(p: Probe) -> str:
    folder = p.folder("users-ct2")
    (folder / "stages").mkdir()
    (folder / "ct2").mkdir()
    for name in ("config.json", "model.bin"):
        (folder / "ct2" / name).write_text("x")
    (folder / "ct2" / "notes.txt").write_text("mine")
    return _compress_refused(p, folder, names="ct2/notes.txt")


@case("compress --out = DATA")
def _compress_data(p: Probe) -> str:
    return _compress_refused(p, p.data, names="is or holds an input")


@case("compress --out that cannot be created")
def _compress_unwritable(p: Probe) -> str:
    return _compress_refused(p, p.checkpoint / "sub", names="is not a folder")


COMPRESS_REFUSALS = {
    "--references of the wrong length": (lambda p: ["--references", _short_references(p)], "has 2 lines"),
    "--max-bleu-loss nan": (lambda p: [], "--max-bleu-loss: 'nan' is not a finite number"),
    "--window-lr nan": (lambda p: ["--window-lr", "nan"], "'nan' is not a finite number"),
    "--distill-hidden-weight nan": (lambda p: ["--distill-hidden-weight", "nan"], "'nan' is not a finite number"),
    "--recover-args='--max-tokens 5'": (lambda p: ["--recover-args", "--max-tokens 5"], "--max-tokens 5"),
    "--recover-args='--valid-subset test'": (lambda p: ["--recover-args", "--valid-subset test"],
                                             "--valid-subset is set by compress itself"),
    "--recover-args with an unbalanced quote": (lambda p: ["--recover-args", "--lr 'x"], "No closing quotation"),
    "--recover-args='--max-update 5'": (lambda p: ["--recover-args", "--max-update 5"], "use --budget-updates"),
    "--stop-after bogus": (lambda p: ["--stop-after", "bogus"], "invalid choice: 'bogus'"),
    "a misspelt option": (lambda p: ["--stop-afte", "report"], "did you mean --stop-after?"),
    "--recovered naming a file that is not a checkpoint": (lambda p: ["--recovered", _text_file(p, "notes.pt", "x")],
                                                           "is not a checkpoint torch can load"),
    "--distill-source naming an empty file": (lambda p: ["--distill-source", _text_file(p, "empty.de", "")],
                                              "is empty"),
    "--distill-source naming random bytes": (lambda p: ["--distill-source", _random_bytes(p)], "is not UTF-8 text"),
    "--recover-args='--lr 1e-4;' (a SyntaxError in fairseq)": (lambda p: ["--recover-args", "--lr 1e-4;"],
                                                               "'1e-4;' is not a number"),
    "--shape 8/0x2 (quoted as typed)": (lambda p: ["--shape", "8/0x2"], "--shape 8/0x2: the decoder keeps 1 to"),
    "--out a dangling link": (lambda p: ["--out", _dangling(p)], "which does not exist"),
}


def _text_file(p: Probe, name: str, text: str) -> Path:
    path = p.work / name
    path.write_text(text)
    return path


def _random_bytes(p: Probe) -> Path:
    path = p.work / "random.de"
    path.write_bytes(bytes(range(128, 256)) * 16)
    return path


def _dangling(p: Probe) -> Path:
    path = p.work / f"dangling-{p.n}"
    if not path.is_symlink():
        path.symlink_to(p.work / "nowhere")
    return path


def _short_references(p: Probe) -> Path:
    path = p.work / "two-lines.en"
    path.write_text("a\nb\n")
    return path


def _beyond_gpus() -> int:
    import torch

    return max(2, torch.cuda.device_count() + 1)


if torch.cuda.device_count():  # without a GPU a world size is CPU processes (gloo): refused beyond the cores
    COMPRESS_REFUSALS["--recover-args='--distributed-world-size N' beyond the GPUs"] = (
        lambda p: ["--recover-args", f"--distributed-world-size {_beyond_gpus()}"], "GPUs and this machine has")
else:
    COMPRESS_REFUSALS["--recover-args='--distributed-world-size N' beyond the cores (no GPU)"] = (
        lambda p: ["--recover-args", f"--distributed-world-size {(os.cpu_count() or 1) + 1}"],
        "CPU processes and this machine has")


for _name, (_extra, _names) in COMPRESS_REFUSALS.items():
    case(f"compress {_name}")(lambda p, name=_name, extra=_extra, names=_names: _compress_refused(
        p, p.work / f"compress-{p.n}-new", *extra(p), names=names,
        target=("--max-bleu-loss", "nan") if name == "--max-bleu-loss nan" else ("--speedup", "1.2")))


@case("compress interrupted by Ctrl-C in a later stage",
      covered_by="tests/test_input_model.py::test_ctrl_c_ends_compress_in_one_line_and_the_same_command_resumes")
def _compress_interrupted(p: Probe) -> str:
    import signal

    out = p.folder("interrupted") / "out"
    argv = ["compress", p.data, "--path", p.checkpoint, "--out", out, "--speedup", "1.2", *COMPRESS,
            "--cost-cache", p.work / "cost-cache-interrupted", "--stop-after", "choice"]
    command = Path(sys.executable).parent / "fairseq-headprune"
    proc = subprocess.Popen([str(command), *map(str, argv)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # (as at a terminal:
    # a command started in the background of a script inherits Ctrl-C ignored, and Python keeps it so)
    for line in proc.stdout:
        if line.startswith(("cost-table: done", "cost-table: cached")):
            break
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=300)
    last = (stderr.strip().splitlines() or [""])[-1]
    expect(proc.returncode == 130 and "Traceback" not in stderr, f"exit {proc.returncode}: {last}")
    expect("interrupted" in last, f"not one line: {last}")
    again = p.cli(*argv)
    expect(again.returncode == 0 and "cost-table: cached" in again.stdout,
           f"the same command did not resume: exit {again.returncode}, {again.stderr.strip().splitlines()[-1:]}")
    return "held: one line, exit 130, the same command resumed"


@case("compress of a model compressed before is 'the input model' in its card, never unpruned")
def _compress_compressed(p: Probe) -> str:
    folder = p.folder("compressed-input")
    first = p.cli("compress", p.data, "--path", p.checkpoint, "--out", folder / "first", "--speedup", "1.2",
                  *COMPRESS, "--cost-cache", p.work / "cost-cache-input")
    expect(first.returncode == 0, f"exit {first.returncode}: {first.stderr.strip().splitlines()[-1:]}")
    second = p.cli("compress", p.data, "--path", folder / "first" / "model.pt", "--out", folder / "second",
                   "--speedup", "1.2", *COMPRESS, "--cost-cache", p.work / "cost-cache-input",
                   "--max-len-b", "60")  # (a tiny model with fewer heads loops to a short limit: no export check)
    expect(second.returncode == 0, f"exit {second.returncode}: {second.stderr.strip().splitlines()[-1:]}")
    card = (folder / "second" / "MODEL_CARD.md").read_text()
    expect("unpruned" not in card, "the card calls the input model unpruned")
    expect("The input model is itself pruned" in card and "It was made from" in card, "the card does not say so")
    return "held: the input model named with its shape and the model it was made from"


@case("a second compress of one --out")
def _compress_two_writers(p: Probe) -> str:
    folder = p.folder("compress-two")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, time\n"
        f"fd = os.open({str(folder / '.fairseq-headprune.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(120)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        expect(holder.stdout.readline().strip() == "held", "the lock holder did not start")
        return _compress_refused(p, folder, names="use another --out")
    finally:
        holder.kill()
        holder.wait()


# ---------------------------------------------------------------- 6. translate and the vocabulary map

TIGHT_MAP = ["--vocab-map", "--vocab-map-per-source", "1", "--vocab-map-frequent", "0"]


def _deployable(p: Probe, name: str) -> Path:
    """The tiny model exported with its Moses and subword-nmt settings, greedy, 4 tokens a hypothesis at most."""
    out = p.folder(name) / "model"
    proc = p.cli("export-ct2", p.data, "--path", p.checkpoint, "--out", out, "--gen-subset", "test",
                 "--check-sentences", "8", "--tokenizer", "moses", "--moses-no-escape", "-s", "de", "-t", "en",
                 "--bpe", "subword_nmt", "--bpe-codes", p.data / "code", "--beam", "1", "--max-len-b", "4",
                 "--max-tokens", "800")
    expect(proc.returncode == 0, f"export failed: {proc.stderr.strip().splitlines()[-1:]}")
    return out


@case("vocab-map: export-ct2 --vocab-map-per-source without --vocab-map (accepted and ignored)")
def _map_option_alone(p: Probe) -> str:
    out = p.folder("map-alone") / "ct2"
    line = p.refused("export-ct2", p.data, "--path", p.checkpoint, "--out", out, "--gen-subset", "test",
                     "--vocab-map-per-source", "5", names="needs --vocab-map")
    expect(not out.exists(), "wrote a model")
    return line


@case("vocab-map: compress --vocab-map-frequent with --no-vocab-map (accepted and ignored)")
def _compress_map_option_alone(p: Probe) -> str:
    return _compress_refused(p, p.work / f"compress-{p.n}-map", "--no-vocab-map", "--vocab-map-frequent", "3",
                             names="needs --vocab-map")


@case("vocab-map: export-ct2 with a map that costs more BLEU than --vocab-map-max-loss")
def _map_too_costly(p: Probe) -> str:
    out = p.folder("map-costly") / "ct2"
    line = p.refused("export-ct2", p.data, "--path", p.checkpoint, "--out", out, "--gen-subset", "test", "--beam",
                     "1", "--max-len-b", "20", "--max-tokens", "800", "--check-sentences", "24", *TIGHT_MAP,
                     "--vocab-map-max-loss", "0", names="--vocab-map-max-loss 0")
    expect(not out.exists() and not list(out.parent.glob(".ct2-export-*")), "wrote a model or left its staging")
    return line


@case("translate: a folder whose vmap.txt is random bytes (CTranslate2 reads it silently)")
def _translate_random_map(p: Probe) -> str:
    folder = _deployable(p, "random-map")
    (folder / "vmap.txt").write_bytes(bytes(range(256)) * 4)
    return p.refused("translate", folder, names="vmap.txt does not fit this model")


@case("translate: a 2,000-word line, bytes that are not UTF-8 and empty lines among 300")
def _translate_bad_lines(p: Probe) -> str:
    folder = _deployable(p, "bad-lines")
    lines = [b"ein Hund l\xc3\xa4uft ."] * 300
    lines[9], lines[99], lines[199], lines[298] = b"", " ".join(["Hund"] * 2000).encode(), b"ein \xff Hund", b" "
    proc = subprocess.run([str(conftest.BIN / "fairseq-headprune"), "translate", str(folder)],
                          input=b"\n".join(lines) + b"\n", capture_output=True, env=conftest.ENV)
    out = proc.stdout.split(b"\n")
    warned = [w.split(":")[2].strip() for w in proc.stderr.decode().splitlines() if ": warning: line " in w]
    expect(proc.returncode == 3, f"exit {proc.returncode}, not 3: {proc.stderr.decode()[-200:]}")
    expect(len(out) == 301 and out[-1] == b"", f"{len(out) - 1} lines out of 300")
    expect(warned == ["line 100", "line 200"], f"warnings {warned}")
    expect(out[9] == out[298] == b"" and all(out[i] for i in (99, 199)), "an empty line not answered empty")
    return "held: 300 lines in, 300 out, lines 100 and 200 named, exit code 3"


# ---------------------------------------------------------------- run folder: moved, its recovery folder

def _in_folder(folder: Path, call: Callable):
    """`call()` with `folder` as the working directory."""
    before = os.getcwd()
    os.chdir(folder)
    try:
        return call()
    finally:
        os.chdir(before)


def _compress_stopped(p: Probe, out, cwd: Path, *extra):
    return _in_folder(cwd, lambda: p.cli("compress", p.data, "--path", p.checkpoint, "--out", out, "--speedup", "1.2",
                                         *COMPRESS, "--cost-cache", p.work / "cost-cache-run-folder", *extra))


@case("compress run folder moved, resumed with --out at its new place from another directory",
      covered_by="tests/test_run_folder.py::test_a_moved_run_folder_resumes_from_another_directory")
def _compress_moved(p: Probe) -> str:
    folder = p.folder("run-folder-moved")
    for name in ("first", "second"):
        (folder / name).mkdir()
    first = _compress_stopped(p, "out", folder / "first", "--stop-after", "shrink")
    expect(first.returncode == 0, f"exit {first.returncode}: {first.stderr.strip().splitlines()[-1:]}")
    (folder / "first" / "out").rename(folder / "moved")
    again = _compress_stopped(p, folder / "moved", folder / "second", "--stop-after", "shrink")
    expect(again.returncode == 0, f"exit {again.returncode}: {again.stderr.strip().splitlines()[-1:]}")
    cached = [n for n in ("cost-table", "choice", "shrink") if f"{n}: cached" in again.stdout]
    expect(len(cached) == 3, f"only {cached} cached at the new place")
    expect(str(folder / "first") not in (folder / "moved" / "recovery-run" / "recovery-run.sh").read_text(),
           "the recovery script names the folder where the run started")
    return "held: cost-table, choice and shrink cached at the new place, its recovery script rewritten there"


@case("compress --recovered from a recovery folder of an earlier shrink (run folder)")
def _compress_stale_recovery(p: Probe) -> str:
    folder = p.folder("run-folder-stale")
    first = _compress_stopped(p, folder / "out", folder, "--stop-after", "shrink")
    expect(first.returncode == 0, f"exit {first.returncode}: {first.stderr.strip().splitlines()[-1:]}")
    place = folder / "out" / "recovery-run"
    shutil.copyfile(place / "student.pt", place / "checkpoint_best.pt")  # a student of this shrink's shape
    inputs = json.loads((place / "inputs.json").read_text())
    (place / "inputs.json").write_text(json.dumps({**inputs, "student_sha256": "0" * 64}))
    proc = _compress_stopped(p, folder / "out", folder, "--recovered", place / "checkpoint_best.pt")
    last = (proc.stderr.strip().splitlines() or [""])[-1]  # after the stages' progress bars: the refusal
    expect(proc.returncode == 2 and "Traceback" not in proc.stderr, f"exit {proc.returncode}: {last}")
    expect("inputs.json names another student" in last, f"does not name inputs.json: {last}")
    expect(not (folder / "out" / "compress.json").exists(), "the outputs were written")
    return "refused: " + last.split("error: ", 1)[1][:110]


# ---------------------------------------------------------------- 7. every family (--families)

def _family(name: str):
    import families as fam

    if name == "multilingual":
        return fam.multilingual(), fam.spm_data(), fam.spm_data() / "slice", [*fam.MULTI_TASK, "-s", "de", "-t", "en"]
    return fam.mbart(), fam.spm_data() / "mbart", fam.spm_data() / "mbart-slice", fam.MBART_TASK


def _family_recover(p: Probe, name: str) -> str:
    checkpoint, data, _, _ = _family(name)
    out = p.folder(f"{name}-recover") / "r.pt"
    proc = p.cli("recover", data, "--path", checkpoint, "--teacher", checkpoint, "--out", out, "--updates", "2",
                 "--max-tokens", "1500")
    expect(proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    record = json.loads(out.with_suffix(".json").read_text())
    expect(record["last_valid_loss"] is not None, "no last valid loss")
    return f"held: recovered, last valid loss {record['last_valid_loss']:.3f}"


for _fam in ("multilingual", "mbart"):
    case(f"recover under {_fam}", families=True)(lambda p, name=_fam: _family_recover(p, name))


@case("recover --distill sequences under multilingual (would drop its language tokens)", families=True)
def _multi_sequences(p: Probe) -> str:
    checkpoint, data, _, _ = _family("multilingual")
    out = p.folder("multi-seq") / "s.pt"
    return p.refused("recover", data, "--path", checkpoint, "--teacher", checkpoint, "--out", out, "--distill",
                     "sequences", "--updates", "2", names="language tokens")


@case("export-ct2 under multilingual (language tokens as target prefix)", families=True)
def _multi_export(p: Probe) -> str:
    checkpoint, _, slice_, task = _family("multilingual")
    out = p.folder("multi-export") / "ct2"
    proc = p.cli("export-ct2", slice_, "--path", checkpoint, "--out", out, *task, "--gen-subset", "test", "--beam",
                 "4", "--max-tokens", "800", "--check-sentences", "16")
    expect(proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    expect("0 hypotheses differ" in proc.stdout, proc.stdout.strip().splitlines()[-2:])
    return "held: 0 of 16 hypotheses differ from fairseq's"


@case("export-ct2 under mBART", families=True)
def _mbart_export(p: Probe) -> str:
    checkpoint, _, slice_, task = _family("mbart")
    out = p.folder("mbart-export") / "ct2"
    return p.refused("export-ct2", slice_, "--path", checkpoint, "--out", out, *task, "--gen-subset", "test",
                     "--beam", "4", "--max-tokens", "800", names="translation_from_pretrained_bart")


for _fam in ("multilingual", "mbart"):
    case(f"speed --engine ct2 under {_fam}", families=True)(lambda p, name=_fam: p.refused(
        "speed", _family(name)[2], "--path", _family(name)[0], *_family(name)[3], "--heads", "enc-self:1:1",
        "--engine", "ct2", "--results-dir", p.folder("speed"), "--gen-subset", "test", names="language token"))


# ---------------------------------------------------------------- main

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="run the cases whose name contains this word")
    parser.add_argument("--families", action="store_true", help="also the multilingual and mBART cases")
    parser.add_argument("--skip-covered", action="store_true",
                        help="leave out the cases a named test of the suite runs itself (the suite's replay)")
    args = parser.parse_args(argv)
    from fairseq_headprune.fairseq_io.loading import trust_fairseq_checkpoints

    trust_fairseq_checkpoints()
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="probe-compression-") as tmp:
        work = Path(tmp)
        data = conftest.copy_cached(conftest._cached_data(), work / "data")
        stock = conftest.cached_build("stock", conftest.stock_key(), lambda out: conftest.train(data, out))
        checkpoint = conftest.copy_cached(stock, work / "stock") / "checkpoint_last.pt"
        probe = Probe(data, checkpoint, work)
        ran, failures = replay(CASES, probe, lambda name: (not args.only or args.only in name)
                               and (args.families or not name.startswith("[families]"))
                               and not (args.skip_covered and name in COVERED_BY))
    print(f"probe_compression: {ran} cases, {failures} regressed, {time.time() - start:.0f} s")
    return min(failures, 100)


if __name__ == "__main__":
    sys.exit(main())
