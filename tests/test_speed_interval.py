"""A speed ratio with its 95% interval (engines.timing.speedup_interval): batches resampled with all their rounds;
the verdict on a target read from the interval's lower end; the same models timed twice in one run agree within
their intervals; the card and the verdict say it."""
from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import pytest

from fairseq_headprune import cli
from fairseq_headprune.cli import compress as compress_command
from fairseq_headprune.compress import model_card
from fairseq_headprune.compress.stages import outputs
from fairseq_headprune.compress.stages.common import engine_model
from fairseq_headprune.engines.timing import interval_words, speedup_interval, target_verdict, timed_rounds
from fairseq_headprune.fairseq_io.loading import load
from fairseq_headprune.prune.levers import timing_batches

RECORDED = Path(__file__).resolve().parent.parent / "results" / "compress-de-en" / "readme-line" / "compress.json"


def test_the_interval_holds_the_median_and_what_it_rests_on():
    rng = random.Random(0)
    base = [1 + rng.random() for _ in range(5 * 12)]  # 5 rounds of 12 batches, round-major
    other = [b / 2 * (1 + 0.1 * (rng.random() - 0.5)) for b in base]
    interval = speedup_interval(base, other, 12)
    ratios = [b / o for b, o in zip(base, other)]
    assert min(ratios) <= interval["low"] <= interval["ratio"] <= interval["high"] <= max(ratios)
    assert interval["low"] < interval["high"] and 1.9 < interval["low"] and interval["high"] < 2.1
    assert (interval["batches"], interval["rounds"], interval["level"]) == (12, 5, 0.95)
    assert speedup_interval(base, [b / 2 for b in base], 12) == {**interval, "ratio": 2.0, "low": 2.0, "high": 2.0}
    with pytest.raises(ValueError):
        speedup_interval(base, other, 7)  # 60 times are not whole rounds of 7 batches


def test_a_batch_keeps_its_rounds_together():
    """Every round of one batch reads 3x, of the other 1x: drawing batches (not single ratios) makes the interval
    span both, however many rounds there are."""
    base = [3.0, 1.0] * 20
    interval = speedup_interval(base, [1.0] * 40, 2)
    assert (interval["low"], interval["high"]) == (1.0, 3.0)


def test_one_batch_draws_its_rounds():
    """One batch timed over 10 rounds: the interval spans how its rounds spread (a draw of the one batch alone
    would give its median as both ends), and the words say one batch."""
    base = [1.5, 1.7, 1.6, 1.4, 1.8, 1.6, 1.5, 1.7, 1.6, 1.65]
    interval = speedup_interval(base, [1.0] * 10, 1)
    assert 1.4 <= interval["low"] < interval["ratio"] < interval["high"] <= 1.8, interval
    assert (interval["batches"], interval["rounds"]) == (1, 10)
    assert interval_words(interval).endswith("; 1 batch x 10 rounds)")


def test_a_target_is_met_at_the_lower_bound():
    interval = {"ratio": 1.55, "low": 1.48, "high": 1.61}
    assert target_verdict(interval, 1.45) == "met"
    assert target_verdict(interval, 1.5) == "met at the median, not at the lower bound"
    assert target_verdict(interval, 1.6) == "missed"


def test_the_same_models_timed_twice_in_one_run_agree_within_their_intervals(tiny_data, stock_checkpoint):
    """The unpruned tiny model against its own copy in ct2-int8, timed twice as the measure stage times them: each
    reading's interval holds 1 (the same model) or its ratio is within 10% of it (a 95% interval misses the truth
    in one reading of twenty by design, and more often beside the other test worker: 1.064x, 1.011-1.294x was
    seen there), and the two intervals overlap."""
    cfg, _ = cli.parse("compress", compress_command, [str(tiny_data), "--path", str(stock_checkpoint), "--out", "x",
                                                      "--speedup", "1.5", "--beam", "2", "--max-len-b", "12"])
    loaded = load(cfg)
    batches = timing_batches(loaded, "valid", 96)
    with tempfile.TemporaryDirectory() as tmp:
        decoders = {name: engine_model(loaded, "ct2-int8", None, tmp, name).run for name in ("a", "b")}
        readings = [timed_rounds(decoders, batches, 3, 10) for _ in range(2)]
    first, second = (speedup_interval(r["a"], r["b"], len(batches)) for r in readings)
    for interval in (first, second):
        assert interval["low"] <= 1.0 <= interval["high"] or abs(interval["ratio"] - 1) < 0.1, interval
    assert first["low"] <= second["high"] and second["low"] <= first["high"], (first, second)


def test_the_card_and_the_verdict_carry_the_interval():
    record = json.loads(RECORDED.read_text())
    measured = record["stages"]["measure"]
    target = record["options"]["speedup"]
    measured["speedup_equal_work_interval"] = {"ratio": target + 0.02, "low": target - 0.03,
                                               "high": target + 0.07, "level": 0.95, "batches": 16, "rounds": 3}
    card = model_card.render(record)
    assert f"{target + 0.02:.2f}x (95% interval {target - 0.03:.2f}-{target + 0.07:.2f}x; 16 batches x 3 rounds)" \
        in card
    assert f"--speedup {target:g}: speed met at the median, not at the lower bound" in card
    said = outputs.verdict(record)
    assert said["speed_verdict"] == "met at the median, not at the lower bound" and said["met"]
    assert any("95% interval" in line for line in said["lines"])
