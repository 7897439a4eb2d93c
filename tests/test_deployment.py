"""compress where the model is deployed: --deploy-batch and --deploy-threads time the cost table, the choice and
the target there; the card gives the other batch, the machine, CTranslate2's version and the served memory."""
from __future__ import annotations

import json
import os

from conftest import run
from test_compress import compress_argv


def test_a_model_served_one_sentence_at_a_time_is_timed_so(tiny_data, stock_checkpoint, tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    threads = min(2, os.cpu_count() or 1)
    # (20 timing sentences: at batch 1 each is a batch, twice the sign tests' least)
    run(compress_argv(tiny_data, stock_checkpoint, out, cache, "--deploy-batch", "1", "--deploy-threads",
                      str(threads), "--max-len-b", "60", "--timing-sentences", "20"))
    record = json.loads((out / "compress.json").read_text())
    measured = record["stages"]["measure"]
    assert measured["largest_batch"] == 1 and measured["batches"] == measured["sentences"]
    where = measured["deployment"]
    assert (where["batch"], where["threads"]) == (1, threads) and where["instruction_set"] != "unknown"
    assert where["memory"]["unpruned"] > 0 and where["memory"]["compressed"] > 0
    disk = where["memory"]["on_disk"]  # the weights' bytes: fewer once heads and layers are gone
    assert 0 < disk["compressed"] < disk["unpruned"]
    assert measured["batch64"]["batch"] == 64 and "latency_batch1" not in measured
    assert record["stages"]["cost-table"]["identity"]["threads"] == threads
    card = (out / "MODEL_CARD.md").read_text()
    assert "as latency at batch 1, one sentence at a time (--deploy-batch 1); at batches of 64 sentences" in card
    assert f"- **Measured on** {where['cpu']} ({where['instruction_set']}), CTranslate2 " in card
    assert "MiB resident against the unpruned model's" in card and "MiB on disk against" in card


def test_deployment_options_out_of_range_are_one_line(tiny_data, stock_checkpoint, tmp_path):
    for extra, message in ((("--deploy-batch", "0"), "--deploy-batch must be at least 1 sentence, not 0"),
                           (("--deploy-threads", "999"), "--deploy-threads must be between 1 and this machine's")):
        proc = run(compress_argv(tiny_data, stock_checkpoint, tmp_path / "out", tmp_path / "cache", *extra),
                   check=False)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert not (tmp_path / "out").exists()
