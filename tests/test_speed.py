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


def _speed_ct2(data, checkpoint, out, heads, *extra, check=True):
    return run(["fairseq-headprune", "speed", data, "--path", checkpoint, "--gen-subset", "test", "--heads", heads,
                "--results-dir", out, "--engine", "ct2", "--beam", "2", "--num-sentences", "8", *extra], check=check)


def test_speed_in_ctranslate2(tiny_data, stock_checkpoint, tmp_path):
    out = _speed_ct2(tiny_data, stock_checkpoint, tmp_path, HALF, "--batch-sizes", "1,4", "--runs", "2").stdout
    result = json.loads((tmp_path / "speed-ct2-float32.json").read_text())
    assert result["engine"] == "ct2" and result["compute_type"] == "float32" and result["heads_pruned"] == 28
    # a per-stack shape: CTranslate2 really runs 4 encoder and 2 decoder heads
    assert result["ct2_heads_per_stack"] == {"unpruned": [8, 4], "pruned": [4, 2]}
    assert 1.0 < result["flop_ratio"] < 2.0
    assert "1" in result["threads"]  # one thread always; all cores beside it where there are more
    for by_threads in result["threads"].values():
        for bs in ("1", "4"):
            row = by_threads["batch_sizes"][bs]
            assert all(row[name]["sentences_per_s"] > 0 for name in ("unpruned", "masked", "pruned"))
            # equal work: the pruned model and its zero-padded twin translate alike, token for token
            assert row["pruned"]["differing_from_masked"] == 0 and row["pruned"]["same_tokens_as_masked"]
            assert row["pruned"]["speedup_over_masked"] > 0
    assert "pruned over masked (equal work)" in out and "FLOP ratio" in out


def test_speed_in_ctranslate2_int8_and_an_uneven_shape(tiny_data, stock_checkpoint, tmp_path):
    # one encoder layer keeps all its heads: CTranslate2 pads the others up to it, so it runs the unpruned encoder
    uneven = ",".join([f"enc-self:{layer}:1-4" for layer in (1, 2, 3)] + [f"dec-self:{layer}:1-2" for layer in (1, 2)])
    _speed_ct2(tiny_data, stock_checkpoint, tmp_path, uneven, "--batch-sizes", "4", "--runs", "1",
               "--compute-type", "int8")
    result = json.loads((tmp_path / "speed-ct2-int8.json").read_text())
    assert result["compute_type"] == "int8"
    assert result["ct2_heads_per_stack"] == {"unpruned": [8, 4], "pruned": [8, 4]}
    assert result["flop_ratio"] == 1.0  # the FLOPs of the shape CTranslate2 runs, not of the pruned checkpoint


def test_speed_engine_options_refused_in_one_line(tiny_data, stock_checkpoint, tmp_path):
    for extra, message in ((["--compute-type", "int8"], "--compute-type is CTranslate2's: it needs --engine ct2"),
                           (["--engine", "onnx"], "--engine must be fairseq or ct2"),
                           (["--engine", "ct2", "--compute-type", "int4"], "--compute-type int4: CTranslate2 runs"),
                           (["--engine", "ct2", "--unkpen", "1"], "CTranslate2 cannot decode as fairseq does")):
        proc = run(["fairseq-headprune", "speed", tiny_data, "--path", stock_checkpoint, "--gen-subset", "test",
                    "--heads", HALF, "--results-dir", tmp_path / "r", *extra], check=False)
        assert proc.returncode == 2 and message in proc.stderr, (extra, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()
