"""compress --max-chrf-loss: the quality bound in chrF points, chosen on the held-out split of valid as
--max-bleu-loss is, and judged after recovery on that split in chrF; one target at a time."""
from __future__ import annotations

import json

from conftest import run
from test_compress import compress_argv


def test_a_chrf_bound_is_chosen_and_judged_in_chrf(tiny_data, stock_checkpoint, tmp_path):
    out = tmp_path / "out"
    printed = run(compress_argv(tiny_data, stock_checkpoint, out, tmp_path / "cache", "--heldout-sentences", "50",
                                "--max-len-b", "60", target=("--max-chrf-loss", "100"))).stdout
    assert "--max-chrf-loss 100" in printed.splitlines()[0] and "chrF on 'heldout' before recovery" in printed
    record = json.loads((out / "compress.json").read_text())
    choice, heldout = record["stages"]["choice"], record["stages"]["report"]["heldout"]
    assert choice["metric"] == "chrF" and choice["chosen"]["heldout_score"] is not None
    assert heldout["metric"] == "chrF" and heldout["loss"] == round(heldout["unpruned"] - heldout["compressed"], 2)
    low, high = heldout["delta_interval"]  # compressed minus unpruned, so the loss's interval is (-high, -low)
    assert low <= -heldout["loss"] <= high and heldout["verdict"] == "met"  # a bound of 100 chrF: even -low is in
    card = (out / "MODEL_CARD.md").read_text()
    assert (f"--max-chrf-loss 100: met ({heldout['loss']:.2f} chrF lost on valid's held-out split after recovery; "
            f"the loss's 95% interval {-high:.2f} to {-low:.2f} over 50 sentences)") in card
    assert any(line.startswith("target chrF loss at most 100 on held-out data: met") for line in
               record["verdict"]["lines"])


def test_one_target_at_a_time(tiny_data, stock_checkpoint, tmp_path):
    proc = run(compress_argv(tiny_data, stock_checkpoint, tmp_path / "out", tmp_path / "cache", "--max-chrf-loss",
                             "1"), check=False)  # beside the --speedup compress_argv gives
    assert proc.returncode == 2 and "give exactly one target" in proc.stderr and not (tmp_path / "out").exists()


def test_a_loss_within_the_bound_on_too_few_sentences_is_inconclusive():
    """The verdict rests on the interval: met when even its worst end is within the bound; a loss within it whose
    interval reaches beyond (too few sentences to see the bound) is inconclusive, never met; beyond it, missed."""
    from fairseq_headprune.compress.stages.report import quality_verdict
    from fairseq_headprune.stats import BleuBootstrap, ChrfBootstrap

    assert quality_verdict(0.2, 0.45, 0.5) == "met"
    assert quality_verdict(0.2, 1.38, 0.5) == "inconclusive"
    assert quality_verdict(0.6, 0.9, 0.5) == "missed"
    references = [f"a small house number {i} stands here" for i in range(40)]
    base = list(references)
    worse = [r if i % 4 else "a house" for i, r in enumerate(references)]
    chrf = ChrfBootstrap(BleuBootstrap(references, base, 200, 1), references)
    low, high = chrf.difference_interval(worse)
    delta = chrf.score(worse) - chrf.score(base)
    assert low <= delta <= high < 0  # a quarter of the sentences cut short: lower at every resample
