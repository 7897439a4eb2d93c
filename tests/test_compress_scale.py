"""`compress` at the user's scale: timing batches of its own whatever the user's batching (every sign test sees at
least 10 paired batches), the recovery sized by the user's budget (updates, a random sample of train), the plan
printed before any work (--dry-run), the hardware the user has (threads, processes through fairseq-train's
torch.distributed) and a recovery run elsewhere (--stop-after shrink, then --recovered)."""
from __future__ import annotations

import json

import pytest

from conftest import run
from test_compress import compress_argv

from fairseq_headprune.compress import levers
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
