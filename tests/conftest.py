"""Tiny real models for the tests: a 3000-pair Multi30k slice, 400 BPE merges, models trained for seconds.

`stock_checkpoint` is a stock fairseq `transformer` (trained without this package) with an asymmetric shape:
4 encoder layers x 8 heads, 3 decoder layers x 4 heads.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SLICE = ROOT / "tests" / "data" / "multi30k"
BIN = Path(sys.executable).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "PYTHONWARNINGS": "ignore"}

TINY_ARCH = [
    "--arch", "transformer", "--share-all-embeddings",
    "--encoder-layers", "4", "--encoder-attention-heads", "8",
    "--decoder-layers", "3", "--decoder-attention-heads", "4",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
]


def run(cmd, check=True, in_process=True, **kw) -> subprocess.CompletedProcess:
    """Run a command of the venv with the test environment; output captured as text.

    `fairseq-headprune` runs in this process (its entry point, cli.main) unless in_process=False: the same
    code path without paying Python's and fairseq's start-up for every call."""
    if cmd[0] == "fairseq-headprune" and in_process and not kw:
        return _run_cli_in_process([str(c) for c in cmd[1:]], check)
    cmd = [str(BIN / cmd[0]) if (BIN / cmd[0]).exists() else cmd[0]] + [str(c) for c in cmd[1:]]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**ENV, **kw.pop("env", {})}, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


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


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    return _prepare(tmp_path_factory.mktemp("data-bin"))


def train(data: Path, save_dir: Path, extra=(), updates: int = 120, arch=TINY_ARCH) -> Path:
    """A stock fairseq-train run (no user module); `arch` replaces the tiny asymmetric shape."""
    run(["fairseq-train", data, *arch, *extra,
         "--optimizer", "adam", "--lr", "3e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "20",
         "--criterion", "cross_entropy", "--max-tokens", "1500", "--max-update", updates, "--dropout", "0.1",
         "--save-dir", save_dir, "--no-epoch-checkpoints", "--no-save-optimizer-state", "--seed", "3",
         "--num-workers", "0", "--log-format", "simple", "--disable-validation"])
    return save_dir / "checkpoint_last.pt"


@pytest.fixture(scope="session")
def stock_checkpoint(tiny_data, tmp_path_factory) -> Path:
    """A stock fairseq transformer checkpoint, trained without this package."""
    return train(tiny_data, tmp_path_factory.mktemp("stock"))
