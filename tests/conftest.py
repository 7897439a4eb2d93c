"""Tiny real models for the tests: a 3000-pair Multi30k slice, 400 BPE merges, models trained for seconds.

`stock_checkpoint` is a stock fairseq `transformer` (trained without this package) with an asymmetric shape:
4 encoder layers x 8 heads, 3 decoder layers x 4 heads.

The binarised data and the stock models are built once per machine and cached in tests/.cache/ (or
$HEADPRUNE_TEST_CACHE), keyed on what builds them: the source of the functions below that prepare and train, the
data slice, and the versions of fairseq, torch, sacremoses and subword-nmt. This package's own code trains
nothing here, so a change to it never reuses a stale model. Each test session gets its own copy of the files.
"""
from __future__ import annotations

import atexit
import fcntl
import functools
import hashlib
import inspect
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Callable, Dict

import pytest

from forked_cli import ForkedCli

ROOT = Path(__file__).resolve().parent.parent
SLICE = ROOT / "tests" / "data" / "multi30k"
BIN = Path(sys.executable).parent
CACHE = Path(os.environ.get("HEADPRUNE_TEST_CACHE", ROOT / "tests" / ".cache"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "PYTHONWARNINGS": "ignore"}

TINY_ARCH = [
    "--arch", "transformer", "--share-all-embeddings",
    "--encoder-layers", "4", "--encoder-attention-heads", "8",
    "--decoder-layers", "3", "--decoder-attention-heads", "4",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
]


# the seconds each test file takes (tools/suite_durations.py writes it from a run of the suite)
DURATIONS = json.loads((ROOT / "tests" / "durations.json").read_text(encoding="utf-8"))
UNLISTED = sorted(DURATIONS.values())[len(DURATIONS) // 2] if DURATIONS else 0.0  # the table's median


def expected_seconds(path: str) -> float:
    """A test file's seconds as tests/durations.json has them; a file it does not list yet: the table's median."""
    return DURATIONS.get(path, UNLISTED)


def pytest_configure(config):
    """pytest-xdist hands the test files to its workers in the order collected (not in its own order by their
    number of tests, which put the one-test documented-commands files last: one of them ran alone at the end)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(session, config, items):
    """The longest files first (tests/durations.json), each file's tests together and in their own order: with
    `--dist loadfile`, whichever worker is free takes the next file, so both stay busy to the end."""
    items.sort(key=lambda item: -expected_seconds(Path(item.path).relative_to(ROOT).as_posix()))


# console scripts a call of `run` hands to a forked server (tests/forked_cli.py), started at its first call
FORKED = ("fairseq-headprune", "fairseq-generate", "fairseq-preprocess", "fairseq-train", "fairseq-interactive")
_SERVERS: Dict[str, ForkedCli] = {}


def run(cmd, check=True, in_process=True, **kw) -> subprocess.CompletedProcess:
    """Run a command of the venv with the test environment; output captured as text.

    `fairseq-headprune` runs in this process (its entry point, cli.main) when run with no other argument (input,
    env, cwd); the console scripts of FORKED otherwise run in a child forked from a server of the script
    (forked_cli: the script's own code, its imports paid once per test process); in_process=False runs the
    installed console script, started fresh, and so does a call with its own env."""
    if cmd[0] == "fairseq-headprune" and in_process and not kw:
        return _run_cli_in_process([str(c) for c in cmd[1:]], check)
    args = [str(c) for c in cmd[1:]]
    if in_process and cmd[0] in FORKED and "env" not in kw:
        cli = _forked(cmd[0])
        proc = subprocess.run([str(cli.client), *args], capture_output=True, text=True, env=cli.env, **kw)
    else:
        exe = str(BIN / cmd[0]) if (BIN / cmd[0]).exists() else cmd[0]
        proc = subprocess.run([exe, *args], capture_output=True, text=True, env={**ENV, **kw.pop("env", {})}, **kw)
    cmd = [cmd[0], *args]
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def _forked(name: str) -> ForkedCli:
    """The server of the console script `name` for this test process, started at its first call."""
    if name not in _SERVERS:
        _SERVERS[name] = ForkedCli(_servers_folder(), ENV, name).wait_ready()
    return _SERVERS[name]


@functools.lru_cache(maxsize=None)
def _servers_folder() -> Path:
    """This test process's folder of clients and sockets, removed with its servers when the process exits."""
    folder = Path(tempfile.mkdtemp(prefix="forked-cli-"))
    atexit.register(_stop_servers, folder)
    return folder


def _stop_servers(folder: Path) -> None:
    for cli in _SERVERS.values():
        cli.stop()
    shutil.rmtree(folder, ignore_errors=True)


def _run_cli_in_process(argv, check: bool) -> subprocess.CompletedProcess:
    import contextlib

    from fairseq_headprune import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:  # argparse and fairseq's option errors
            code = e.code if isinstance(e.code, int) else 1
    proc = subprocess.CompletedProcess(["fairseq-headprune", *argv], code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"fairseq-headprune {argv} failed ({code}):\n{proc.stderr[-3000:]}")
    return proc


FAIRSEQ_CLI = {"fairseq-generate": "fairseq_cli.generate", "fairseq-train": "fairseq_cli.train",
               "fairseq-preprocess": "fairseq_cli.preprocess"}


def run_fairseq(cmd, check=True) -> subprocess.CompletedProcess:
    """fairseq-generate, -train or -preprocess run in this process (fairseq_cli's cli_main with sys.argv set), as
    `run` runs fairseq-headprune: the same code as the console script without paying Python's, torch's and
    fairseq's start-up (about 4 CPU s) for every call. stdout (generate's H-/D- lines, INFO logs) and stderr are
    captured; an uncaught UserError of this module gives what errors.report_user_errors gives the console script
    (one line `error: ...`, exit code 2), another exception a traceback and exit code 1. Tests of the console
    script itself (a fresh process importing --user-dir, the exit hook) keep `run`, and so do cached builds."""
    import contextlib
    import importlib
    import traceback

    from fairseq_headprune.errors import UserError

    args = [str(c) for c in cmd]
    module = importlib.import_module(FAIRSEQ_CLI[args[0]])  # imported before stdout is redirected
    out, err = io.StringIO(), io.StringIO()
    saved_argv, saved_env = sys.argv, {k: os.environ.get(k) for k in ("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD",)}
    sys.argv = args
    os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"  # as ENV gives the console scripts
    root = logging.getLogger()
    saved_level = root.level
    handler = logging.StreamHandler(out)  # the console scripts log at INFO to stdout
    handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)s | %(name)s | %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                module.cli_main()
                code = 0
            except SystemExit as e:  # argparse's usage errors (2), fairseq's own exits
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
            except UserError as e:
                print(f"error: {e}", file=sys.stderr)
                code = 2
            except Exception:  # noqa: BLE001 - what the interpreter prints before exiting with 1
                traceback.print_exc()
                code = 1
    finally:
        root.removeHandler(handler)
        root.setLevel(saved_level)
        sys.argv = saved_argv
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    proc = subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"{args} failed ({code}):\n{proc.stderr[-3000:]}")
    return proc


def _prepare(out: Path) -> Path:
    from sacremoses import MosesTokenizer
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    out.mkdir(parents=True, exist_ok=True)
    tok = {lang: MosesTokenizer(lang=lang) for lang in ("de", "en")}
    tokenized = {}
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            lines = (SLICE / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            tokenized[split, lang] = [tok[lang].tokenize(line, aggressive_dash_splits=True, escape=False,
                                                         return_str=True) for line in lines]
    codes = io.StringIO()
    learn_bpe(tokenized["train", "de"] + tokenized["train", "en"], codes, 400)
    (out / "code").write_text(codes.getvalue(), encoding="utf-8")
    codes.seek(0)
    bpe = BPE(codes)
    for (split, lang), lines in tokenized.items():
        (out / f"{split}.bpe.{lang}").write_text("\n".join(bpe.process_line(x) for x in lines) + "\n", encoding="utf-8")
    run(["fairseq-preprocess", "--source-lang", "de", "--target-lang", "en", "--joined-dictionary",
         "--trainpref", out / "train.bpe", "--validpref", out / "valid.bpe", "--testpref", out / "test.bpe",
         "--destdir", out, "--workers", "1"])
    return out


def train(data: Path, save_dir: Path, extra=(), updates: int = 120, arch=TINY_ARCH) -> Path:
    """A stock fairseq-train run (no user module); `arch` replaces the tiny asymmetric shape."""
    run(["fairseq-train", data, *arch, *extra,
         "--optimizer", "adam", "--lr", "3e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "20",
         "--criterion", "cross_entropy", "--max-tokens", "1500", "--max-update", updates, "--dropout", "0.1",
         "--save-dir", save_dir, "--no-epoch-checkpoints", "--no-save-optimizer-state", "--seed", "3",
         "--num-workers", "0", "--log-format", "simple", "--disable-validation"])
    return save_dir / "checkpoint_last.pt"


def train_epochs(data: Path, save_dir: Path) -> Path:
    """Two epochs of a stock fairseq-train run with a checkpoint per epoch (checkpoint1.pt, checkpoint2.pt)."""
    run(["fairseq-train", data, *TINY_ARCH, "--optimizer", "adam", "--lr", "3e-3", "--lr-scheduler",
         "inverse_sqrt", "--warmup-updates", "10", "--criterion", "cross_entropy", "--max-tokens", "3000",
         "--max-epoch", "2", "--save-dir", save_dir, "--no-save-optimizer-state", "--disable-validation",
         "--num-workers", "0"])
    return save_dir


def build_key(*functions: Callable) -> str:
    """What a cached build depends on: the functions' source (and what they call here), the arch, the data slice,
    and the versions of the tools that prepare and train."""
    h = hashlib.sha256()
    for fn in (*functions, run, _run_cli_in_process):
        h.update(inspect.getsource(fn).encode())
    h.update(repr(TINY_ARCH).encode())
    for path in sorted(SLICE.iterdir()):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    for dist in ("fairseq-fixed", "torch", "sacremoses", "subword-nmt", "numpy"):
        try:
            h.update(f"{dist}=={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist} missing".encode())
    return h.hexdigest()[:16]


def package_key() -> str:
    """The source of this package (the copy under test): builds that run its code are keyed on it too."""
    h = hashlib.sha256()
    package = ROOT / "fairseq_headprune"
    for path in sorted(package.rglob("*.py")):
        h.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def cached_build(name: str, key: str, build: Callable[[Path], object], keep_others: bool = False) -> Path:
    """The folder `build` fills, built once per key under CACHE (a lock keeps concurrent sessions from building it
    twice; a build is renamed into place only when complete, so a killed one is never reused). Builds of other
    keys are removed, or with keep_others (builds keyed on the package's code, which copies under test such as the
    mutation check's may build at the same time) only once they are a day old."""
    target = CACHE / f"{name}-{key}"
    if (target / "COMPLETE").exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "COMPLETE").exists():
            shutil.rmtree(target, ignore_errors=True)
            partial = Path(tempfile.mkdtemp(dir=CACHE, prefix=f".{name}-"))
            build(partial)
            (partial / "COMPLETE").write_text(key + "\n")
            os.rename(partial, target)
            for stale in CACHE.glob(f"{name}-*"):  # builds of older code
                if stale != target and (not keep_others or time.time() - stale.stat().st_mtime > 86400):
                    shutil.rmtree(stale, ignore_errors=True)
    return target


def _content_key(path: Path) -> bytes:
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).digest()
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return h.digest()


def stock_run(cmd, check=True) -> subprocess.CompletedProcess:
    """A stock fairseq command (no user module): what it prints depends only on its arguments, the content of the
    files and folders they name, and the versions of fairseq and torch. Run once per machine; later calls return
    the recorded exit code, stdout and stderr (cached under CACHE/runs)."""
    import json

    args = [str(c) for c in cmd]
    if not args[0].startswith("fairseq-") or any(a.startswith("--user-dir") for a in args):
        raise ValueError(f"not a stock fairseq command: {args}")
    h = hashlib.sha256()
    for dist in ("fairseq-fixed", "torch", "numpy", "sacrebleu"):
        h.update(f"{dist}=={metadata.version(dist)}".encode())
    for arg in args:
        path = Path(arg)
        h.update(b"\0" + (_content_key(path) if os.path.isabs(arg) and path.exists() else arg.encode()))
    record = CACHE / "runs" / f"{args[0]}-{h.hexdigest()[:24]}.json"
    if record.exists():
        saved = json.loads(record.read_text(encoding="utf-8"))
        proc = subprocess.CompletedProcess(args, saved["returncode"], saved["stdout"], saved["stderr"])
        if check and proc.returncode != 0:
            raise AssertionError(f"{args} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return proc
    proc = run(args, check=check)
    record.parent.mkdir(parents=True, exist_ok=True)
    partial = record.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps({"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}),
                       encoding="utf-8")
    os.replace(partial, record)
    return proc


def copy_cached(cached: Path, dest: Path) -> Path:
    shutil.copytree(cached, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("COMPLETE"))
    return dest


def stock_key() -> str:
    """What the stock checkpoint's content depends on."""
    return _data_key() + build_key(train)


def _data_key() -> str:
    return build_key(_prepare)


def _cached_data() -> Path:
    return cached_build("data-bin", _data_key(), _prepare)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    return copy_cached(_cached_data(), tmp_path_factory.mktemp("data-bin"))


@pytest.fixture(scope="session")
def tiny_slice(tiny_data, tmp_path_factory) -> Path:
    """The first 48 sentences of the tiny data's valid and test subsets, binarised with its dictionaries: for
    sweeps whose checks do not depend on the set's size (a quarter of the decoding; several batches still need
    a small --max-tokens)."""
    out = tmp_path_factory.mktemp("slice")
    for split in ("valid", "test"):
        for lang in ("de", "en"):
            lines = (tiny_data / f"{split}.bpe.{lang}").read_text(encoding="utf-8").splitlines()[:48]
            (out / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run_fairseq(["fairseq-preprocess", "--source-lang", "de", "--target-lang", "en",
                 "--srcdict", tiny_data / "dict.de.txt", "--tgtdict", tiny_data / "dict.en.txt",
                 "--validpref", out / "valid", "--testpref", out / "test", "--destdir", out, "--workers", "1"])
    return out


@pytest.fixture(scope="session")
def stock_checkpoint(tmp_path_factory) -> Path:
    """A stock fairseq transformer checkpoint, trained without this package."""
    cached = cached_build("stock", stock_key(), lambda out: train(_cached_data(), out))
    return copy_cached(cached, tmp_path_factory.mktemp("stock")) / "checkpoint_last.pt"


@pytest.fixture(scope="session")
def epoch_checkpoints(tmp_path_factory) -> Path:
    """A folder with checkpoint1.pt and checkpoint2.pt: two epochs of stock training (for the dynamics)."""
    cached = cached_build("epochs", _data_key() + build_key(train_epochs),
                          lambda out: train_epochs(_cached_data(), out))
    return copy_cached(cached, tmp_path_factory.mktemp("epochs"))


@pytest.fixture(scope="session", autouse=True)
def no_worker_left_behind():
    """Worker pools a test left open (a module's shared pool, a sweep interrupted in this process) are stopped when
    the run ends; and each worker dies with this process however it ends (workers._die_with_parent)."""
    yield
    from fairseq_headprune.decoding import workers

    workers.close_all()
