"""`fairseq-headprune deploy` on a tiny model: its own per-stack shrink and a `remove`d checkpoint beside the
unpruned model in fairseq and CTranslate2, the unpruned float32 export translating as fairseq, equal work at forced
lengths, the files, the reuse of its shrink; bad input refused in one line; the frontier and the targets' arithmetic."""
from __future__ import annotations

import json
import shutil

import pytest

from conftest import run

from fairseq_headprune.errors import UserError
from fairseq_headprune.plots import pareto_frontier
from fairseq_headprune.studies import deploy

PER_STACK = ",".join([f"enc-self:{layer}:1-4" for layer in range(1, 5)]
                     + [f"{t}:{layer}:1-2" for t in ("enc-dec", "dec-self") for layer in range(1, 4)])


def deploy_argv(data, checkpoint, out, *extra):
    # the tiny model's references are BPE text: no --bpe, so hypotheses and references compare as they are
    return ["fairseq-headprune", "deploy", data, "--path", checkpoint, "--gen-subset", "test", "--results-dir", out,
            "--references", data / "test.bpe.en", "--beam", "2", "--batch-size", "64", "--max-len-b", "12",
            "--runs", "1", "--batch1-sentences", "3", "--calibration-sentences", "64", *extra]


def test_deploy_on_a_tiny_model(tiny_data, stock_checkpoint, tmp_path):
    pruned = tmp_path / "ps.pt"
    run(["fairseq-headprune", "remove", tiny_data, "--path", stock_checkpoint, "--heads", PER_STACK, "--out", pruned])
    out = tmp_path / "table"
    printed = run(deploy_argv(tiny_data, stock_checkpoint, out, "--compare", f"ps={pruned}", "--candidate", "ps",
                              "--ceilings", "4/2", "4/2:ffn=50%,vocab=50%", "--runs", "2")).stdout  # an interval
    assert "judged: ps, named before this table (--candidate)" in printed
    table = json.loads((out / "deploy.json").read_text())
    rows = {(r["model"], r["engine"]): r for r in table["rows"]}
    assert set(rows) == {(m, e) for m in ("unpruned", "shrink-ps50", "ps") for e in deploy.ENGINES}
    # float32 CTranslate2 writes fairseq's hypotheses (and fairseq is not disturbed by the int8 export beside it)
    assert rows[("unpruned", "ct2-float32")]["differing_from_fairseq"] == 0
    assert rows[("unpruned", "ct2-float32")]["bleu"] == rows[("unpruned", "fairseq")]["bleu"]
    assert rows[("ps", "fairseq")]["shape"] == "per-stack" and rows[("ps", "ct2-int8")]["ct2_heads_per_stack"] == [4, 2]
    shrunk = json.loads((out / "models" / "shrink-ps50.json").read_text())
    assert rows[("shrink-ps50", "fairseq")]["shape"] == "per-stack"
    assert rows[("shrink-ps50", "fairseq")]["heads_kept"] == shrunk["heads_kept"] == shrunk["heads_total"] // 2
    for engine in deploy.ENGINES:  # equal work: the same tokens for every model when forced
        assert len({rows[(m, engine)]["tokens_forced-batch"] for m in ("unpruned", "shrink-ps50", "ps")}) == 1
    assert rows[("ps", "ct2-int8")]["flop_ratio"] > 1.0
    # every speed ratio with its 95% interval over the rounds, in the table too
    interval = rows[("ps", "ct2-int8")]["x_unpruned_same_engine_forced-batch_interval"]
    assert interval["low"] <= rows[("ps", "ct2-int8")]["x_unpruned_same_engine_forced-batch"] <= interval["high"]
    assert interval["rounds"] == table["meta"]["runs"] and "95% Student-t interval" in (out / "deploy.md").read_text()
    judged = next(m for m in table["targets"]["per_stack_int8"]["models"] if m["model"] == "ps")
    assert judged["x_unpruned_int8_interval"] == interval and judged["speed_verdict"] in (
        "met", "met at the median, not at the lower bound", "missed")
    # every difference to the unpruned fairseq model carries its paired-bootstrap p, the settings printed
    assert rows[("unpruned", "fairseq")]["p_vs_unpruned_fairseq"] is None
    assert all(0 <= r["p_vs_unpruned_fairseq"] <= 1 for k, r in rows.items() if k != ("unpruned", "fairseq"))
    assert "paired bootstrap" in (out / "deploy.md").read_text() and "(p 0." in printed
    # chrF beside BLEU, its p on the same resamples
    assert rows[("unpruned", "fairseq")]["chrf_delta"] == 0 and "chrF's p" in (out / "deploy.md").read_text()
    assert all(0 <= r["chrf_p_vs_unpruned_fairseq"] <= 1 and r["chrf_delta"] == round(
        r["chrf"] - rows[("unpruned", "fairseq")]["chrf"], 2) for k, r in rows.items() if k != ("unpruned", "fairseq"))
    assert "| chrF | ΔchrF (p) |" in (out / "deploy.md").read_text()
    assert [m["model"] for m in table["targets"]["per_stack_int8"]["models"]] == ["shrink-ps50", "ps"]
    assert (out / "deploy.png").stat().st_size > 0 and "Targets:" in (out / "deploy.md").read_text()
    # ceilings: timed in int8 at equal work in the same rounds; the ceiling of ps's shape has ps's FLOP ratio
    ceilings = {c["shape"]: c for c in table["ceilings"]}
    assert set(ceilings) == {"4/2", "4/2 (ffn 50%, vocab 50%)"}
    assert ceilings["4/2"]["ct2_heads_per_stack"] == [4, 2]
    assert ceilings["4/2"]["flop_ratio"] == rows[("ps", "ct2-int8")]["flop_ratio"]
    assert ceilings["4/2 (ffn 50%, vocab 50%)"]["flop_ratio"] > ceilings["4/2"]["flop_ratio"]
    forced_tokens = rows[("unpruned", "ct2-int8")]["tokens_forced-batch"]
    assert {c["tokens_forced-batch"] for c in ceilings.values()} == {forced_tokens}
    assert "## Ceilings" in (out / "deploy.md").read_text()
    # a rerun with the same options reuses its shrink; another budget makes its own
    assert "reusing" in run(deploy_argv(tiny_data, stock_checkpoint, out)).stdout
    again = run(deploy_argv(tiny_data, stock_checkpoint, out, "--calibration-sentences", "32")).stdout
    assert "reusing" not in again and "calibration: 32 sentences" in again
    data = tmp_path / "data"  # the calibration subset's files are part of the identity, by content
    shutil.copytree(tiny_data, data)
    (data / "valid.bpe.de").write_text("changed\n")
    assert "reusing" not in run(deploy_argv(data, stock_checkpoint, out, "--calibration-sentences", "32")).stdout


def test_bad_input_is_refused_in_one_line(tiny_data, stock_checkpoint, tmp_path):
    out = tmp_path / "refused"
    for extra, message in ((["--compare", "nameless"], "NAME=CHECKPOINT"),
                           (["--compare", f"x={tmp_path / 'none.pt'}"], "no such checkpoint"),
                           (["--compare", f"unpruned={stock_checkpoint}"], "is taken"),
                           (["--shrink-percent", "0"], "--calibration-sentences sets deploy's own shrink"),
                           (["--shrink-percent", "0", "--shape", "free", "--compare", f"x={stock_checkpoint}"],
                            "--shape sets deploy's own shrink"),
                           (["--shrink-percent", "100"], "--shrink-percent"),
                           (["--candidate", "nosuch"], "--candidate nosuch: not a model of this table"),
                           (["--ceilings", "4-2"], "is not [L x]ENC/[L x]DEC"),
                           (["--ceilings", "4/2:ffn=0%"], "keeps a share in (0, 100]%"),
                           (["--ceilings", "4/2:heads=50%"], "is not ffn=P% or vocab=P%"),
                           (["--ceilings", "4/2", "4/2"], "given twice"),
                           (["--ceilings", "9/2"], "the encoder keeps 1 to 8 heads per layer in this model, not 9"),
                           (["--unkpen", "1"], "CTranslate2 cannot decode")):
        proc = run(deploy_argv(tiny_data, stock_checkpoint, out, *extra), check=False)
        assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, (
            extra, proc.stderr)
    assert not (out / "deploy.json").exists()
    with pytest.raises(UserError, match="nothing to compare"):
        deploy.DeployOptions(shrink_percent=0).check()


def test_frontier_and_targets():
    assert pareto_frontier([(1.0, 41.5), (1.5, 41.5), (3.0, 41.4), (2.0, 40.0), (4.0, 39.9)]) == [
        (1.5, 41.5), (3.0, 41.4), (4.0, 39.9)]

    def row(model, engine, bleu, speed, shape="per-stack"):
        return {"model": model, "engine": engine, "bleu": bleu, "shape": shape, "differing_from_fairseq": 0,
                "x_unpruned_same_engine_forced-batch": speed, "x_unpruned_fairseq_forced-batch": speed * 3,
                "x_unpruned_same_engine_forced-1": speed, "flop_ratio": 1.3}

    rows = [row("unpruned", "fairseq", 41.48, 1.0, "unpruned"), row("unpruned", "ct2-float32", 41.48, 1.0, "unpruned"),
            row("a", "ct2-int8", 41.0, 1.6), row("b", "ct2-int8", 40.9, 1.4), row("c", "ct2-int8", 41.4, 1.2, "free")]
    t = deploy.targets(rows)
    assert t["float32_as_fairseq"]["met"]
    assert [m["model"] for m in t["per_stack_int8"]["models"]] == ["a", "b"]  # the free shape is not a candidate
    assert t["per_stack_int8"]["best"]["model"] == "a" and t["per_stack_int8"]["met"]
    assert "optimistic" in t["per_stack_int8"]["chosen_by"]
    chosen = deploy.targets(rows, candidate="b")["per_stack_int8"]  # chosen beforehand: judged even when missed
    assert chosen["best"]["model"] == "b" and not chosen["met"] and "--candidate" in chosen["chosen_by"]
    assert "no verdict" in deploy.target_lines(deploy.targets(rows, candidate="c"))[-1]  # the free shape
    rows[2]["bleu"] = 40.9  # 0.58 below: missed
    assert not deploy.targets(rows)["per_stack_int8"]["met"]
