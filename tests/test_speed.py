"""The speed table's bookkeeping: three models, every batch size, the equal-work speed-up, the FLOP ratio,
incremental state sizes."""
import json

from conftest import run

HALF = ",".join([f"enc-self:{layer}:1-4" for layer in range(1, 5)]
                + [f"{t}:{layer}:1-2" for t in ("enc-dec", "dec-self") for layer in range(1, 4)])


def test_speed_table(tiny_data, stock_checkpoint, tmp_path):
    out = run(["fairseq-headprune", "speed", tiny_data, "--path", stock_checkpoint, "--gen-subset", "test",
               "--heads", HALF, "--results-dir", tmp_path, "--batch-sizes", "1,4", "--runs", "2",
               "--num-sentences", "8", "--beam", "2"]).stdout
    result = json.loads((tmp_path / "speed.json").read_text())
    assert result["heads_pruned"] == 28 and result["heads_total"] == 56
    assert result["params"]["pruned"] < result["params"]["unpruned"] == result["params"]["masked"]
    assert 1.0 < result["flop_ratio"] < 2.0  # was flop_bound_speedup: a ratio, not a bound (issue 17)
    assert result["reorder_ratio"] > 1.0  # half the decoder self-attention heads: a smaller cache to copy
    for bs in ("1", "4"):
        row = result["batch_sizes"][bs]
        for name in ("unpruned", "masked", "pruned"):
            assert row[name]["sentences_per_s"] > 0 and row[name]["incremental_state_bytes"] > 0
        # half the decoder heads are gone: their cached keys and values too
        assert row["pruned"]["incremental_state_bytes"] < row["masked"]["incremental_state_bytes"]
        assert row["pruned"]["speedup"] == row["pruned"]["tokens_per_s"] / row["unpruned"]["tokens_per_s"]
        # equal work: the pruned and the masked model write the same tokens in every run
        assert row["pruned"]["same_tokens_as_masked"] and row["pruned"]["tokens"] == row["masked"]["tokens"]
        assert row["pruned"]["speedup_over_masked"] > 0 and row["pruned"]["speedup_over_masked_std"] >= 0
    assert "FLOP ratio" in out and "copy ratio" in out
