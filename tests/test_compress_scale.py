"""`compress` at the user's scale: timing batches of its own whatever the user's batching (every sign test sees at
least 10 paired batches), the recovery sized by the user's budget (updates, a random sample of train), the plan
printed before any work (--dry-run), the hardware the user has (threads, processes through fairseq-train's
torch.distributed) and a recovery run elsewhere (--stop-after shrink, then --recovered)."""
from __future__ import annotations

import hashlib
import json
import os
import re

import pytest

from conftest import BIN, ROOT, run
from test_compress import compress_argv

from fairseq_headprune.prune import levers
from fairseq_headprune.errors import UserError


def stage(out, name):
    return json.loads((out / "stages" / name / "stage.json").read_text())


# --------------------------------------------------------------------------------------------- timing


def test_every_sign_test_sees_ten_paired_batches_whatever_the_users_batching(tiny_data, stock_checkpoint, tmp_path):
    # no --batch-size: fairseq-generate's batching would put the 60 sentences in one batch (1 pair per round)
    out, cache = tmp_path / "out", tmp_path / "cache"
    run(compress_argv(tiny_data, stock_checkpoint, out, cache, "--stop-after", "cost-table"))
    table = stage(out, "cost-table")
    assert table["identity"]["batches"] == 60 // levers.TIMING_BATCH + 1  # batches of 16 sentences
    assert table["identity"]["runs"] == 3  # --runs 1: more rounds, so that every row sees 10 pairs
    assert all(r["sign_test"]["batches"] >= levers.MIN_PAIRED for r in table["result"]["rows"])
    assert list(cache.glob("cost-table-*.json"))  # a table that could decide is kept for the next run
    # the user's --batch-size: its batches, and as many rounds as 10 pairs need
    out = tmp_path / "given"
    run(compress_argv(tiny_data, stock_checkpoint, out, cache, "--stop-after", "cost-table", "--batch-size", "8",
                      "--timing-sentences", "16"))
    table = stage(out, "cost-table")
    assert (table["identity"]["batches"], table["identity"]["runs"]) == (2, 5)
    assert all(r["sign_test"]["batches"] >= levers.MIN_PAIRED for r in table["result"]["rows"])


def test_a_table_too_few_batches_decide_says_so_and_is_never_cached(tmp_path):
    rows = [{"field": "dec_heads", "value": 1, "time_saved": 0.3, "speedup": 1.4, "lever": "decoder heads",
             "removable": True, "sign_test": {"faster_batches": 3, "batches": 3, "p": 0.125}}]
    table = {"rows": rows, "whole": {"dec_heads": 4}}
    assert levers.fewest_paired(table) == 3 and not levers.decided(table)
    with pytest.raises(UserError, match="the cost table cannot tell: its rows saw as few as 3 paired batches"):
        levers.refuse_unreachable(9.0, ({"enc_heads": 1, "dec_heads": 1}, 1.4), table, "fairseq")
    identity = {"model_sha256": "x"}
    levers.store_table(str(tmp_path), {**table, "identity": identity})  # a file from before the rule
    assert levers.cached_table(str(tmp_path), identity) is None
    rows[0]["sign_test"] = {"faster_batches": 12, "batches": 12, "p": 0.00024}
    levers.store_table(str(tmp_path), {**table, "identity": identity})
    assert levers.cached_table(str(tmp_path), identity)["rows"] == rows
    assert levers.timing_rounds(1, 3) == 10 and levers.timing_rounds(19, 3) == 3 and levers.timing_rounds(4, 1) == 3


def test_a_table_timed_with_the_map_serves_a_run_without_it_and_no_other(tmp_path):
    decided = {"faster_batches": 12, "batches": 12, "p": 0.00024}
    rows = [{"field": field, "value": 1, "time_saved": 0.3, "speedup": 1.4, "sign_test": decided}
            for field in ("dec_heads", levers.MAP)]
    identity = {"model_sha256": "x", "engine": "ct2-int8"}
    levers.store_table(str(tmp_path), {"rows": rows, "identity": {**identity, "vocab_map": {"train": "t"}}})
    reused = levers.cached_table(str(tmp_path), identity)
    assert reused["rows"] == rows[:1] and reused["identity"] == identity and reused["map_row_dropped"]
    assert levers.cached_table(str(tmp_path), {**identity, "engine": "fairseq"}) is None  # another table
    assert levers.cached_table(str(tmp_path), {**identity, "vocab_map": {"train": "u"}}) is None  # a map run
    assert levers.cached_table(None, identity) is None and levers.cached_table("", identity) is None
    rows[0]["sign_test"] = {"faster_batches": 3, "batches": 3, "p": 0.125}
    levers.store_table(str(tmp_path), {"rows": rows, "identity": {**identity, "vocab_map": {"train": "t"}}})
    assert levers.cached_table(str(tmp_path), identity) is None  # undecided: measured again


# --------------------------------------------------------------------------------------------- the user's budget


def test_dry_run_prints_the_plan_and_the_recoverys_command_and_writes_nothing(tiny_data, stock_checkpoint, tmp_path):
    out = tmp_path / "out"
    printed = run(compress_argv(tiny_data, stock_checkpoint, out, tmp_path / "cache", "--dry-run",
                                "--recover-sentences", "100", "--budget-updates", "20", "--patience", "3",
                                "--distributed-world-size", "2", "--seed", "7")).stdout
    assert not out.exists() and not (tmp_path / "cache").exists()  # nothing written, no model
    lines = printed.splitlines()
    assert lines[0].startswith("compress (--speedup 1.01, ct2-int8): this run will cost about ")
    for name in ("cost-table", "choice", "shrink", "recover", "export", "measure", "report"):
        assert any(line.startswith(f"  {name} ") and "CPU min" in line for line in lines), name
    assert "100 of the 3000 pairs of 'train' drawn at random (seed 1)" in printed
    assert "at most 1 epochs and 20 updates" in printed
    command = next(line.strip() for line in lines if line.strip().startswith("fairseq-train "))
    # the fairseq-train options given to compress itself reach the recovery
    for part in ("--patience 3", "--distributed-world-size 2", "--seed 7", "--max-update 20", "--max-epoch 1",
                 "--max-tokens 4000", f"--save-dir {out}/stages/recover/run", f"{out}/stages/recover-data"):
        assert part in command, (part, command)


def test_dry_run_names_the_distillation_set(tiny_data, stock_checkpoint, tmp_path):
    source = tmp_path / "more.de"
    source.write_text("ein Hund läuft .\nzwei Männer sitzen .\n", encoding="utf-8")
    out = tmp_path / "out"
    printed = run(compress_argv(tiny_data, stock_checkpoint, out, tmp_path / "cache", "--dry-run",
                                "--distill-source", source, "--distill-nbest", "2")).stdout
    assert not out.exists()
    assert "beside the unpruned model's translations (2 best each) of 1 --distill-source file(s)" in printed


def test_fairseq_train_options_given_to_compress_reach_the_recovery_or_are_refused(tiny_data, stock_checkpoint,
                                                                                  tmp_path):
    cases = [(("--save-dir", "x"), "--save-dir is set by recover itself"),
             (("--disable-validation",), "--disable-validation: the recovery early-stops on valid"),
             (("--budget-updates", "0"), "--budget-updates must be at least 1"),
             (("--recover-sentences", "0"), "--recover-sentences must be at least 1"),
             (("--budget-epochs", "0", "--patience", "3"), "--patience: a fairseq-train option, and --budget-epochs "
                                                             "0 runs no recovery"),
             (("--recovered", str(tmp_path / "none.pt")), "--recovered: no such file"),
             (("--recover-args", "--max-update 5"), "--max-update is set by compress itself: use --budget-updates "
                                                    "N")]
    for extra, message in cases:
        out = tmp_path / f"out{len(message)}"
        argv = compress_argv(tiny_data, stock_checkpoint, out, tmp_path / "cache", *extra)
        at = argv.index("--recover-args")  # (refused itself with --budget-epochs 0)
        proc = run(argv[:at] + argv[at + 2:], check=False)
        assert proc.returncode == 2 and message in proc.stderr, (extra, proc.stderr[-800:])
        assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


def test_the_recovery_runs_the_users_budget_on_a_sample_in_two_processes(tiny_data, stock_checkpoint, tmp_path):
    from fairseq.data import data_utils

    import torch

    out = tmp_path / "out"
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the threads the command is given: the recovery's (the timings run on one)
    try:
        run(compress_argv(tiny_data, stock_checkpoint, out, tmp_path / "cache", "--budget-epochs", "40",
                          "--budget-updates", "20", "--recover-sentences", "100", "--recover-args=--max-tokens 400",
                          "--patience", "-1", "--distributed-world-size", "2", "--stop-after", "recover"))
    finally:
        torch.set_num_threads(threads)
    recovered = stage(out, "recover")["result"]
    assert recovered["threads"] == 2
    # the calibration sentences drawn at random over train (seeded), not its first 48
    calibration = stage(out, "choice")["result"]["calibration"]
    first = hashlib.sha256(",".join(map(str, range(48))).encode()).hexdigest()[:16]
    assert calibration["seed"] == 1 and calibration["sentences"] == 48 and calibration["ids_sha256"] != first
    assert recovered["updates"] == 20  # the budget, not the 40 epochs
    assert (recovered["sentences"], recovered["processes"], recovered["device"]) == (100, 2, "CPU")
    sample = out / "stages" / "recover-data"
    assert len(data_utils.load_indexed_dataset(str(sample / "train.de-en.de"), None)) == 100
    assert len(data_utils.load_indexed_dataset(str(sample / "train.de-en.en"), None)) == 100
    drawn = json.loads((sample / "sample.json").read_text())["drawn"]["pairs"]["de-en"]
    assert drawn["sentences"] == 100 and drawn["of"] == 3000
    run_dir = out / "stages" / "recover" / "run"
    assert (run_dir / "checkpoint_best.pt").exists() and not list(run_dir.glob("*rank*"))  # one writer
    run(compress_argv(tiny_data, stock_checkpoint, out, tmp_path / "cache", "--budget-epochs", "40",
                      "--budget-updates", "20", "--recover-sentences", "100", "--recover-args=--max-tokens 400",
                      "--patience", "-1", "--distributed-world-size", "2"))
    card = (out / "MODEL_CARD.md").read_text()
    assert "recovery: 20 updates on 100 sentences (drawn at random from 3000, seed 1), 2 processes on CPU" in card


def test_a_recovery_run_elsewhere_continues_to_the_card(tiny_data, stock_checkpoint, tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    printed = run(compress_argv(tiny_data, stock_checkpoint, out, cache, "--stop-after", "shrink")).stdout
    command = next(line.strip() for line in printed.splitlines() if line.strip().startswith("fairseq-train "))
    assert f"--save-dir {out}/recovery-run" in command
    assert str(tmp_path) not in (out / "recovery-run" / "recovery-run.sh").read_text()  # its paths: its own folder's
    # elsewhere: here, as written, with fairseq-train on the PATH as a user's shell has it, through the script that
    # timed it on a GPU (results/gpu-recovery-de-en): the whole run, then 2 updates on the CPU with 1 thread and all
    logs = tmp_path / "speed"
    run(["bash", ROOT / "benchmarks" / "recovery_speed.sh", out, "2", logs],
        env={"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"})
    summary = (logs / "summary.txt").read_text()
    for line in ("whole recovery, default device", "2 updates, --cpu, 1 thread", "2 updates, --cpu, every core"):
        assert re.search(rf"^{line} \| [1-9]\d* \| \d+$", summary, re.M), summary
    best = out / "recovery-run" / "checkpoint_best.pt"
    foreign = run(compress_argv(tiny_data, stock_checkpoint, out, cache, "--recovered", stock_checkpoint),
                  check=False)
    assert foreign.returncode == 2 and "is not a student of this run's shrink" in foreign.stderr
    run(compress_argv(tiny_data, stock_checkpoint, out, cache, "--recovered", best))
    record = json.loads((out / "compress.json").read_text())
    assert record["stages"]["recover"]["elsewhere"] == "OUT/recovery-run/checkpoint_best.pt"  # portable
    assert (out / "ct2" / "model.bin").exists()
    assert "run elsewhere" in (out / "MODEL_CARD.md").read_text()
