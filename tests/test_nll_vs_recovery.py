"""benchmarks/nll_vs_recovery.py: which runs it compares, and the rank correlation it reports."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def benchmark():
    spec = importlib.util.spec_from_file_location("nll_vs_recovery", ROOT / "benchmarks" / "nll_vs_recovery.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(folder, name, heads, losses, **recover):
    (folder / name).mkdir()
    record = {"stages": {"choice": {"chosen": {"heads": heads, "enc_heads": 2, "dec_heads": 1}},
                         "recover": {"recovered": True, "epochs": [{"valid_loss": v} for v in losses], **recover}}}
    (folder / name / "compress.json").write_text(json.dumps(record))


def test_one_run_per_shape_the_longest_and_only_the_default_recovery(tmp_path):
    m = benchmark()
    write(tmp_path, "a-4-epochs", "1:1", [0.6, 0.5, 0.45, 0.44])
    write(tmp_path, "a-8-epochs", "1:1", [0.6, 0.5, 0.45, 0.44, 0.43, 0.43, 0.42, 0.42])  # the same shape, longer
    write(tmp_path, "hidden", "1:1", [0.9], distill_hidden={"weight": 0.2})
    write(tmp_path, "sequences", "1:1", [0.7], distill="both")
    write(tmp_path, "b", "1:1,1:2", [0.7, 0.6])
    runs = m.distinct_runs(str(tmp_path))
    assert [(name, len(losses)) for name, _, losses in runs] == [("a-8-epochs", 8), ("b", 2)]


def test_spearman_over_the_runs_that_reached_each_epoch():
    m = benchmark()
    rows = [{"reconstructed_nll": n, "valid_loss": losses} for n, losses in
            [(0.7, [0.40, 0.38, 0.37, 0.36]), (0.8, [0.50, 0.48, 0.47, 0.46]), (0.9, [0.45, 0.44, 0.43, 0.42]),
             (1.0, [0.60])]]
    out = m.rank_correlations(rows)
    assert out[1]["runs"] == 4 and out[1]["rho"] == 0.8  # one pair of four swapped
    assert out[4]["runs"] == 3 and out[4]["rho"] == 0.5
    assert 8 not in out  # fewer than three runs reached it
