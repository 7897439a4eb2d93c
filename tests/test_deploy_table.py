"""benchmarks/deploy_table.py on a tiny model: every model in fairseq and CTranslate2, the unpruned float32 export
translating as fairseq, equal work at forced lengths, the files; the frontier and the targets' arithmetic."""
from __future__ import annotations

import json
import sys

from conftest import ROOT, run

sys.path.insert(0, str(ROOT / "benchmarks"))
import deploy_table  # noqa: E402

from fairseq_headprune.plots import pareto_frontier  # noqa: E402

PER_STACK = ",".join([f"enc-self:{layer}:1-4" for layer in range(1, 5)]
                     + [f"{t}:{layer}:1-2" for t in ("enc-dec", "dec-self") for layer in range(1, 4)])


def test_deploy_table_on_a_tiny_model(tiny_data, stock_checkpoint, tmp_path):
    pruned = tmp_path / "ps.pt"
    run(["fairseq-headprune", "remove", tiny_data, "--path", stock_checkpoint, "--heads", PER_STACK, "--out", pruned])
    out = tmp_path / "table"
    # the tiny model's references are BPE text: no --bpe, so hypotheses and references compare as they are
    assert deploy_table.main(["--unpruned", str(stock_checkpoint), "--data", str(tiny_data), "--references",
                              str(tiny_data / "test.bpe.en"), f"ps={pruned}", "--runs", "1", "--batch1-sentences",
                              "3", "--out", str(out), "--decoding", "--beam", "2", "--batch-size", "64",
                              "--max-tokens", "100000", "--max-len-b", "12"]) == 0
    table = json.loads((out / "deploy.json").read_text())
    rows = {(r["model"], r["engine"]): r for r in table["rows"]}
    assert set(rows) == {(m, e) for m in ("unpruned", "ps") for e in deploy_table.ENGINES}
    # float32 CTranslate2 writes fairseq's hypotheses (and fairseq is not disturbed by the int8 export beside it)
    assert rows[("unpruned", "ct2-float32")]["differing_from_fairseq"] == 0
    assert rows[("unpruned", "ct2-float32")]["bleu"] == rows[("unpruned", "fairseq")]["bleu"]
    assert rows[("ps", "fairseq")]["shape"] == "per-stack" and rows[("ps", "ct2-int8")]["ct2_heads_per_stack"] == [4, 2]
    for engine in deploy_table.ENGINES:  # equal work: the same tokens for both models when forced
        assert rows[("unpruned", engine)]["tokens_forced-64"] == rows[("ps", engine)]["tokens_forced-64"]
    assert rows[("ps", "ct2-int8")]["flop_ratio"] > 1.0
    assert [m["model"] for m in table["targets"]["per_stack_int8"]["models"]] == ["ps"]
    assert (out / "deploy.png").stat().st_size > 0 and "## Targets" in (out / "deploy.md").read_text()


def test_frontier_and_targets():
    assert pareto_frontier([(1.0, 41.5), (1.5, 41.5), (3.0, 41.4), (2.0, 40.0), (4.0, 39.9)]) == [
        (1.5, 41.5), (3.0, 41.4), (4.0, 39.9)]

    def row(model, engine, bleu, speed, shape="per-stack"):
        return {"model": model, "engine": engine, "bleu": bleu, "shape": shape, "differing_from_fairseq": 0,
                "x_unpruned_same_engine_forced-64": speed, "x_unpruned_fairseq_forced-64": speed * 3,
                "x_unpruned_same_engine_forced-1": speed, "flop_ratio": 1.3}

    rows = [row("unpruned", "fairseq", 41.48, 1.0, "unpruned"), row("unpruned", "ct2-float32", 41.48, 1.0, "unpruned"),
            row("a", "ct2-int8", 41.0, 1.6), row("b", "ct2-int8", 40.9, 1.4), row("c", "ct2-int8", 41.4, 1.2, "free")]
    t = deploy_table.targets(rows)
    assert t["float32_as_fairseq"]["met"]
    assert [m["model"] for m in t["per_stack_int8"]["models"]] == ["a", "b"]  # the free shape is not a candidate
    assert t["per_stack_int8"]["best"]["model"] == "a" and t["per_stack_int8"]["met"]
    rows[2]["bleu"] = 40.9  # 0.58 below: missed
    assert not deploy_table.targets(rows)["per_stack_int8"]["met"]
