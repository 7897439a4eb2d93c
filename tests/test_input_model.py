"""A compressed model given to compress is "the input model" in its card and verdict, never "unpruned", and the
card names the model it was made from; and Ctrl-C ends a compress run in one line, exit code 130, resumable."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
from conftest import run
from helpers import load_stock
from test_compress import compress_argv

from fairseq_headprune.cli import INTERRUPTED
from fairseq_headprune.compress import input_model, model_card

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "results" / "compress-de-en" / "readme-line" / "compress.json"


def describe(checkpoint: Path, data: Path):
    model, _ = load_stock(checkpoint, data)
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)["cfg"]["model"]
    return input_model.describe(str(checkpoint), saved, model)


def test_a_pruned_checkpoint_is_described_with_its_shape_and_origin(tiny_data, stock_checkpoint, tmp_path):
    assert describe(stock_checkpoint, tiny_data) is None  # an unpruned model
    removed = tmp_path / "removed.pt"  # remove's record (OUT.json) names its source
    run(["fairseq-headprune", "remove", tiny_data, "--path", stock_checkpoint, "--heads",
         "enc-self:1:1-4,dec-self:1:1+2", "--out", removed, "--gen-subset", "test"])
    assert describe(removed, tiny_data) == {"shape": "encoder 4 layers x 4-8 heads, decoder 3 layers x 2-4 heads",
                                            "made_from": str(stock_checkpoint.resolve())}
    record = json.loads(removed.with_suffix(".json").read_text())
    assert record["heads_removed"] == "enc-self:1:1+2+3+4,dec-self:1:1+2" and record["removed"] == 6
    removed.with_suffix(".json").unlink()  # without a record the origin is unknown
    assert describe(removed, tiny_data)["made_from"] is None
    shrunk = tmp_path / "shrunk.pt"  # shrink's record names its source
    run(["fairseq-headprune", "shrink", tiny_data, "--path", stock_checkpoint, "--beam", "2", "--max-tokens", "500",
         "--calibration-sentences", "30", "--remove", "8", "--out", shrunk])
    described = describe(shrunk, tiny_data)
    assert described["made_from"] == str(stock_checkpoint.resolve()), described


def test_the_card_of_a_model_compressed_from_a_pruned_one_says_input_model():
    record = json.loads(RECORDED.read_text())
    plain = model_card.render(record)
    assert "unpruned" in plain and "The input model is itself pruned" not in plain
    record["input_model"] = {"shape": "encoder 6 layers x 8 heads, decoder 6 layers x 2-4 heads",
                             "made_from": "original.pt"}
    card = model_card.render(record)
    assert "unpruned" not in card
    assert ("The input model is itself pruned (encoder 6 layers x 8 heads, decoder 6 layers x 2-4 heads). It was "
            "made from `original.pt`") in card
    assert "fairseq-headprune deploy DATA --path original.pt --results-dir DIR --shrink-percent 0" in card
    assert card.startswith("# Model card") and "| | input | compressed |" in card


def ctrl_c_as_at_a_terminal() -> None:
    """Ctrl-C's default in the child: a command started in the background of a script inherits it ignored (and
    Python keeps it so), as this suite may be."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_ends_compress_in_one_line_and_the_same_command_resumes(tiny_data, stock_checkpoint, tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    argv = [str(a) for a in compress_argv(tiny_data, stock_checkpoint, out, cache, "--stop-after", "choice")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = Path(sys.executable).parent / "fairseq-headprune"
    proc = subprocess.Popen([str(command), *argv[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=tmp_path, preexec_fn=ctrl_c_as_at_a_terminal)
    for line in proc.stdout:  # interrupted once the cost table is done, inside a later stage
        if line.startswith("cost-table: done") or line.startswith("cost-table: cached"):
            break
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == INTERRUPTED, stderr[-2000:]
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith("fairseq-headprune compress: interrupted: "), stderr[-500:]
    assert (out / "stages" / "cost-table" / "stage.json").exists()
    again = run(argv, check=False)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "cost-table: cached" in again.stdout
