"""Ablation sweeps: resumable after SIGKILL, refusing foreign results, sharded over processes."""
import hashlib
import json
import os
import signal
import subprocess
import time

import pytest

from conftest import BIN, ENV, run
from fairseq_headprune.records.log import ResultsLog

SWEEP = ["--gen-subset", "test", "--beam", "1", "--max-tokens", "3000", "--types", "enc-dec", "--masks-per-batch", "3"]


def ablate(data, checkpoint, results, *extra, check=True):
    return run(["fairseq-headprune", "ablate", data, "--path", checkpoint, "--results-dir", results, *SWEEP, *extra],
               check=check)


def rows_of(path):
    lines = [json.loads(line) for line in open(path, encoding="utf-8")]
    return lines[0]["header"], lines[1:]


@pytest.fixture(scope="module")
def uninterrupted(tiny_data, stock_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("ablate-full")
    ablate(tiny_data, stock_checkpoint, out)
    return out


def test_single_head_sweep_rows_and_table(uninterrupted, stock_checkpoint):
    header, rows = rows_of(uninterrupted / "ablation-single.jsonl")
    assert header["metric"] == "bleu" and header["bootstrap"]["samples"] == 1000
    # the header names the model by its content: a file of another checkpoint can be told apart
    assert header["checkpoint_sha256"] == hashlib.sha256(stock_checkpoint.read_bytes()).hexdigest()
    assert header["subset"] == "test" and len(header["data_fingerprint"]) == 16
    assert [r["key"] for r in rows] == ["baseline"] + [f"enc-dec:{layer}:{h}" for layer in (1, 2, 3)
                                                     for h in (1, 2, 3, 4)]
    for row in rows[1:]:
        assert row["delta"] == pytest.approx(row["bleu"] - rows[0]["bleu"])
        assert 0.0 <= row["p_value"] <= 1.0
        assert row["significant"] == (row["p_value"] < 0.01 and row["delta"] != 0)
    table = (uninterrupted / "ablation-single.md").read_text()
    assert "## enc-dec" in table and "| 3 |" in table
    assert (uninterrupted / "ablation-single-enc-dec.png").stat().st_size > 1000


def test_sigkill_halfway_then_rerun_gives_the_uninterrupted_result(tiny_data, stock_checkpoint, uninterrupted,
                                                                   tmp_path):
    log = tmp_path / "ablation-single.jsonl"
    cmd = [str(BIN / "fairseq-headprune"), "ablate", str(tiny_data), "--path", str(stock_checkpoint),
           "--results-dir", str(tmp_path), *SWEEP]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and sum(1 for _ in open(log)) >= 5:  # header, baseline and 3 heads
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the sweep finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    _, partial = rows_of(log)
    assert 4 <= len(partial) < 13
    ablate(tiny_data, stock_checkpoint, tmp_path)
    _, resumed = rows_of(log)
    _, full = rows_of(uninterrupted / "ablation-single.jsonl")
    assert [r["key"] for r in resumed] == [r["key"] for r in full]  # nothing lost, nothing twice
    assert resumed[: len(partial)] == partial  # finished rows were kept, not recomputed
    assert [r["hypotheses_sha256"] for r in resumed] == [r["hypotheses_sha256"] for r in full]
    assert (tmp_path / "ablation-single.md").read_text() == (uninterrupted / "ablation-single.md").read_text()


def test_results_of_another_run_are_refused(tiny_data, stock_checkpoint, uninterrupted, tmp_path):
    (tmp_path / "ablation-single.jsonl").write_bytes((uninterrupted / "ablation-single.jsonl").read_bytes())
    proc = run(["fairseq-headprune", "ablate", tiny_data, "--path", stock_checkpoint, "--results-dir", tmp_path,
                "--gen-subset", "test", "--beam", "2", "--max-tokens", "3000", "--types", "enc-dec"], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "holds results of another run (decoding" in proc.stderr.strip().splitlines()[-1]


def test_torn_last_line_is_dropped(tmp_path):
    path = tmp_path / "r.jsonl"
    log = ResultsLog(str(path), {"a": 1})
    log.append({"key": "x", "v": 1})
    with open(path, "a") as f:
        f.write('{"key": "y", "v"')  # a kill mid-write
    reopened = ResultsLog(str(path), {"a": 1})
    assert reopened.done() == {"x"}
    reopened.append({"key": "y", "v": 2})
    assert [json.loads(line)["key"] for line in open(path) if "key" in line] == ["x", "y"]


def test_manual_shards_merge_into_the_same_result(tiny_data, stock_checkpoint, uninterrupted, tmp_path):
    first = ablate(tiny_data, stock_checkpoint, tmp_path, "--num-shards", "2", "--shard-id", "0")
    assert "shard 0 of 2 done" in first.stdout
    ablate(tiny_data, stock_checkpoint, tmp_path, "--num-shards", "2", "--shard-id", "1")
    _, merged = rows_of(tmp_path / "ablation-single.jsonl")
    _, full = rows_of(uninterrupted / "ablation-single.jsonl")
    assert [(r["key"], r["hypotheses_sha256"]) for r in merged] == [(r["key"], r["hypotheses_sha256"]) for r in full]


def test_torchrun_two_processes_gather_one_file(tiny_data, stock_checkpoint, uninterrupted, tmp_path):
    run(["torchrun", "--standalone", "--nproc-per-node", "2", BIN / "fairseq-headprune", "ablate", tiny_data,
         "--path", stock_checkpoint, "--results-dir", tmp_path, *SWEEP])
    assert (tmp_path / "ablation-single.shard-0-of-2.jsonl").exists()
    assert (tmp_path / "ablation-single.shard-1-of-2.jsonl").exists()
    _, merged = rows_of(tmp_path / "ablation-single.jsonl")
    _, full = rows_of(uninterrupted / "ablation-single.jsonl")
    assert [(r["key"], r["hypotheses_sha256"], r.get("p_value")) for r in merged] == \
        [(r["key"], r["hypotheses_sha256"], r.get("p_value")) for r in full]
    assert (tmp_path / "ablation-single.md").read_text() == (uninterrupted / "ablation-single.md").read_text()


def test_keep_one_select_and_report(tiny_data, stock_checkpoint, tmp_path):
    out = run(["fairseq-headprune", "ablate", tiny_data, "--path", stock_checkpoint, "--results-dir", tmp_path,
               "--mode", "keep-one", "--select-subset", "valid", "--report-subset", "test", "--beam", "1",
               "--max-tokens", "3000", "--types", "dec-self"]).stdout
    header, rows = rows_of(tmp_path / "ablation-keep-one.jsonl")
    assert header["subset"] == "valid" and len(rows) == 1 + 3 * 4
    for row in rows[1:]:
        layer_heads = {1, 2, 3, 4}
        assert row["head"] in layer_heads
    table = (tmp_path / "ablation-keep-one.md").read_text()
    best = {}
    for row in rows[1:]:
        if row["layer"] not in best or row["bleu"] > best[row["layer"]]["bleu"]:
            best[row["layer"]] = row
    for layer, row in best.items():
        assert f"| dec-self | {layer} | {row['head']} |" in table
    report_header, report_rows = rows_of(tmp_path / "ablation-keep-one-report-test.jsonl")
    assert report_header["subset"] == "test" and report_header["selected_on"] == "valid"
    assert sorted(r["key"] for r in report_rows[1:]) == sorted(r["key"] for r in best.values())
    assert "ablation-keep-one-report-test.md" in out


def test_loss_preview_and_correlate(tiny_data, stock_checkpoint, uninterrupted, tmp_path):
    ablate(tiny_data, stock_checkpoint, tmp_path, "--metric", "loss")
    header, rows = rows_of(tmp_path / "ablation-single-loss.jsonl")
    assert header["metric"] == "loss" and "p_value" not in rows[1]
    assert all(r["delta"] == pytest.approx(r["nll"] - rows[0]["nll"]) for r in rows[1:])
    out = run(["fairseq-headprune", "correlate", tmp_path / "ablation-single-loss.jsonl",
               uninterrupted / "ablation-single.jsonl", "--results-dir", tmp_path]).stdout
    result = json.loads((tmp_path / "correlation-ablation-single-loss-vs-ablation-single.json").read_text())
    assert result["n"] == 12 and -1 <= result["pearson_r"] <= 1
    assert result["first"] == "ablation-single-loss.jsonl"  # relative to the result's folder
    assert (tmp_path / result["second"]).samefile(uninterrupted / "ablation-single.jsonl")
    from scipy import stats

    x = [r["delta"] for r in rows[1:]]
    _, full = rows_of(uninterrupted / "ablation-single.jsonl")
    y = [r["delta"] for r in full[1:]]
    assert result["spearman_r"] == pytest.approx(stats.spearmanr(x, y)[0])
    assert result["pearson_r"] == pytest.approx(stats.pearsonr(x, y)[0])
    assert result["pearson_p"] == pytest.approx(stats.pearsonr(x, y)[1])
    assert "Pearson r" in out


def test_shared_decode_equals_one_decode_per_mask(tiny_data, stock_checkpoint):
    """Several masks in one beam search (rows repeated per mask, encoder reused) give each mask's own output."""
    from fairseq_headprune import cli
    from fairseq_headprune.decoding.evaluate import SubsetEvaluator
    from fairseq_headprune.cli import ablate as ablation
    from fairseq_headprune.core.heads import Head
    from fairseq_headprune.fairseq_io.loading import load
    from fairseq_headprune.core.masking import set_head_masks

    cfg, _ = cli.parse("ablate", ablation, [str(tiny_data), "--path", str(stock_checkpoint), "--results-dir", "unused",
                                            "--gen-subset", "test", "--beam", "4", "--max-tokens", "1200"])
    loaded = load(cfg)
    evaluator = SubsetEvaluator(loaded, "test")
    assert len(evaluator.samples) > 1  # several batches, sentences finishing at different steps
    # the first group leaves the encoder alone (decoded first, on a fresh cache); groups of enc-self masks run
    # the encoder from their lowest masked layer
    masks = [[], [Head("enc-dec", 3, 2)], [Head("dec-self", 1, 4)], [Head("enc-dec", 1, 1), Head("dec-self", 3, 2)],
             [Head("enc-self", 2, 3)], [Head("enc-self", 4, h) for h in range(1, 9)], [Head("enc-self", 3, 5)]]
    shared = evaluator.translate_many(masks, masks_per_batch=4)
    one_by_one = []
    for mask in masks:
        set_head_masks(loaded.model, mask)
        one_by_one.append(evaluator.translate())
    set_head_masks(loaded.model, [])
    assert len({tuple(h) for h in one_by_one}) == len(masks), "every mask must change the output"
    assert shared == one_by_one


def test_keep_one_chosen_by_loss_reported_by_bleu(tiny_data, stock_checkpoint, tmp_path):
    """NLL chooses each layer's head on valid (every head tried); only the chosen ones are decoded on test."""
    out = run(["fairseq-headprune", "ablate", tiny_data, "--path", stock_checkpoint, "--results-dir", tmp_path,
               "--mode", "keep-one", "--metric", "loss", "--select-subset", "valid", "--report-subset", "test",
               "--report-metric", "bleu", "--beam", "1", "--max-tokens", "3000", "--types", "dec-self"]).stdout
    select_header, select_rows = rows_of(tmp_path / "ablation-keep-one-loss.jsonl")
    assert select_header["metric"] == "loss" and select_header["subset"] == "valid" and len(select_rows) == 1 + 3 * 4
    lowest = {}
    for row in select_rows[1:]:
        if row["layer"] not in lowest or row["nll"] < lowest[row["layer"]]["nll"]:
            lowest[row["layer"]] = row
    assert not (tmp_path / "ablation-keep-one-loss-report-test.jsonl").exists()
    header, rows = rows_of(tmp_path / "ablation-keep-one-loss-report-test-bleu.jsonl")
    assert (header["metric"], header["selection_metric"], header["subset"], header["selected_on"]) == \
        ("bleu", "loss", "test", "valid")
    assert header["bleu_signature"] and header["bootstrap"]["samples"] == 1000
    assert rows[0]["key"] == "baseline" and "bleu" in rows[0]
    assert sorted((r["layer"], r["head"]) for r in rows[1:]) == sorted((n, r["head"]) for n, r in lowest.items())
    for row in rows[1:]:
        assert row["key"] == f"keep:dec-self:{row['layer']}:{row['head']}"
        assert row["delta"] == pytest.approx(row["bleu"] - rows[0]["bleu"])
        assert 0.0 <= row["p_value"] <= 1.0
        assert row["significant"] == (row["p_value"] < 0.01 and row["delta"] != 0)
    table = (tmp_path / "ablation-keep-one-loss-report-test-bleu.md").read_text()
    assert "NLL change on valid | BLEU change on test |" in table and "lowest teacher-forced NLL" in table
    by_layer = {r["layer"]: r for r in rows[1:]}
    for layer, chosen in lowest.items():  # each column in its own metric's format
        bleu = by_layer[layer]
        change = f"{bleu['delta']:+.2f}"
        assert (f"| dec-self | {layer} | {chosen['head']} | {chosen['delta']:+.3f} | "
                f"{f'**{change}**' if bleu['significant'] else change} |") in table
    assert "ablation-keep-one-loss-report-test-bleu.md" in out


@pytest.mark.parametrize("extra, message", [
    (["--mode", "keep-one", "--report-metric", "bleu"], "--report-metric needs --report-subset"),
    (["--mode", "single", "--report-metric", "bleu"], "--report-metric applies to --mode keep-one"),
    (["--mode", "keep-one", "--report-references", "refs.en"], "--report-references needs --report-subset"),
])
def test_report_metric_bad_combinations_are_one_line(tiny_data, stock_checkpoint, tmp_path, extra, message):
    proc = run(["fairseq-headprune", "ablate", tiny_data, "--path", stock_checkpoint, "--results-dir", tmp_path,
                "--gen-subset", "test", *extra], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert message in lines[-1] and lines[-1].startswith("fairseq-headprune ablate: error:")
    assert not list(tmp_path.iterdir())  # refused before anything was computed
