"""Pruning curves of every epoch checkpoint, resumable, picking up epochs as they appear."""
import json
import os
import shutil
import time

from conftest import run

# on the first 48 sentences of valid and test (conftest.tiny_slice) in two batches, hypotheses capped as the demo
# caps them
DYN = ["--gen-subset", "test", "--importance-subset", "valid", "--beam", "1", "--max-tokens", "600",
       "--max-len-a", "1.2", "--max-len-b", "10", "--step", "0.5"]


def test_dynamics_over_epoch_checkpoints(tiny_slice, epoch_checkpoints, tmp_path):
    ckpts = epoch_checkpoints  # two epochs of stock training (conftest.train_epochs, cached)
    assert (ckpts / "checkpoint1.pt").exists() and (ckpts / "checkpoint2.pt").exists()
    past = time.time() - 3600  # settled files
    for name in ("checkpoint1.pt", "checkpoint2.pt"):
        os.utime(ckpts / name, (past, past))
    # epoch 1 only, as if training were still running
    watch = tmp_path / "watch"
    watch.mkdir()
    shutil.copy2(ckpts / "checkpoint1.pt", watch / "checkpoint1.pt")
    out = tmp_path / "out"
    run(["fairseq-headprune", "dynamics", tiny_slice, "--checkpoint-dir", watch, "--results-dir", out, *DYN])
    rows = [json.loads(line) for line in open(out / "dynamics.jsonl")][1:]
    assert [(r["epoch"], r["heads_masked"]) for r in rows] == [(1, 0), (1, 28), (1, 56)]
    assert rows[0]["bleu_retained"] == 100.0
    # the next epoch appears: a rerun analyses it and keeps epoch 1's rows
    shutil.copy2(ckpts / "checkpoint2.pt", watch / "checkpoint2.pt")
    printed = run(["fairseq-headprune", "dynamics", tiny_slice, "--checkpoint-dir", watch, "--results-dir", out,
                   *DYN]).stdout
    assert "epoch 1:" not in printed and "epoch 2: 28/56" in printed
    rows = [json.loads(line) for line in open(out / "dynamics.jsonl")][1:]
    assert [(r["epoch"], r["heads_masked"]) for r in rows] == [(1, 0), (1, 28), (1, 56), (2, 0), (2, 28), (2, 56)]
    for r in rows:
        base = next(x["bleu"] for x in rows if x["epoch"] == r["epoch"] and x["heads_masked"] == 0)
        assert abs(r["bleu_retained"] - (100 * r["bleu"] / base if base else 0)) < 1e-9
    table = (out / "dynamics.md").read_text()
    assert "| 1 |" in table and "| 2 |" in table and "50%" in table
    assert (out / "dynamics.png").stat().st_size > 1000
    # a different checkpoint under the same epoch number is refused
    shutil.copy2(ckpts / "checkpoint2.pt", watch / "checkpoint1.pt")
    os.utime(watch / "checkpoint1.pt", (past, past))
    bad = run(["fairseq-headprune", "dynamics", tiny_slice, "--checkpoint-dir", watch, "--results-dir", out, *DYN],
              check=False)
    assert bad.returncode == 2 and "holds epoch 1 of another checkpoint" in bad.stderr.strip().splitlines()[-1]
