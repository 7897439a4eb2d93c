"""`fairseq-headprune report`: the whole study of a tiny model end to end, resumed after a kill, and the claims'
verdict rules on synthetic rows (each rule both ways) and on the committed results of the bundled model."""
import base64
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from browser import browser_probe, browser_problems, embedded_images, pil_problems
from conftest import BIN, ENV, ROOT, run, run_fairseq
from fairseq_headprune.report import claims as cl
from fairseq_headprune.cli.report import fairseq_argv
from fairseq_headprune.report.parts import set_option
from fairseq_headprune.records.log import read_json
from fairseq_headprune.records.rows import best_per_layer

REPORT = ["--gen-subset", "test", "--beam", "1", "--max-tokens", "3000", "--masks-per-batch", "8",
          "--prune-step", "0.25", "--speed-batch-sizes", "1,8", "--speed-runs", "1", "--speed-sentences", "8",
          "--analyze-sentences", "16", "--dynamics", "none", "--note", "tiny test model",
          "--shrink-percents", "25,50,75", "--shrink-methods", "michel,full+out-proj+ffn",
          "--shrink-calibration-subset", "test", "--shrink-calibration-sentences", "24", "--deploy-runs", "1",
          "--deploy-batch1-sentences", "4"]


def report(data, checkpoint, out, *extra, check=True):
    return run(["fairseq-headprune", "report", data, "--path", checkpoint, "--results-dir", out, *REPORT, *extra],
               check=check)


@pytest.fixture(scope="module")
def slice_data(tiny_data, tmp_path_factory) -> Path:
    """The first 48 test sentences of the tiny data, binarised with its dictionaries: every decode is short."""
    out = tmp_path_factory.mktemp("slice")
    for lang in ("de", "en"):
        lines = (tiny_data / f"test.bpe.{lang}").read_text(encoding="utf-8").splitlines()[:48]
        (out / f"slice.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run_fairseq(["fairseq-preprocess", "--source-lang", "de", "--target-lang", "en",
                 "--srcdict", tiny_data / "dict.de.txt", "--tgtdict", tiny_data / "dict.en.txt",
                 "--testpref", out / "slice", "--destdir", out, "--workers", "1"])
    return out


@pytest.fixture(scope="module")
def full_report(slice_data, stock_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    proc = report(slice_data, stock_checkpoint, out)
    return out, proc


def test_report_runs_every_part_and_writes_md_and_html(full_report, slice_data, stock_checkpoint):
    out, proc = full_report
    for name in ("importance.json", "ablation-single.jsonl", "ablation-keep-one.jsonl", "pruning.jsonl", "speed.json",
                 "shrink-sweep.jsonl", "shrink-sweep.png", "deploy.json", "deploy.png", "models/shrink-ps50.pt",
                 "report-state.json", "report.md", "report.html"):
        assert (out / name).exists(), name
    state = json.loads((out / "report-state.json").read_text())
    assert set(state["parts"]) >= {"score", "single", "keep-one", "prune", "prune-types", "speed", "shrink", "deploy"}
    # shrink: one row per budget and method besides the unpruned one, rendered as the report's table
    shrink = [json.loads(x) for x in (out / "shrink-sweep.jsonl").read_text().splitlines()[1:]]
    assert sorted((r["method"], r["removed"]) for r in shrink if r["key"] != "unpruned") == sorted(
        (m, n) for m in ("michel", "full+out-proj+ffn") for n in (14, 28, 42))  # of the tiny model's 56 heads
    md = (out / "report.md").read_text()
    section = md[md.index("## Pruning without retraining"):md.index("## Commands")]
    for r in shrink[1:]:
        assert f"{r['bleu']:.2f} ({r['delta']:+.2f})" in section
    assert "--sweep 25,50,75 --sweep-methods michel,full+out-proj+ffn --calibration-subset test" in section
    # deploy: the unpruned model and its per-stack shrink in the three engines, as the table's file holds them
    table = json.loads((out / "deploy.json").read_text())
    section = md[md.index("## Deployment: fairseq and CTranslate2"):md.index("## Commands")]
    assert [(r["model"], r["engine"]) for r in table["rows"]] == [
        (m, e) for m in ("unpruned", "shrink-ps50") for e in ("fairseq", "ct2-float32", "ct2-int8")]
    for r in table["rows"]:
        assert f"| {r['model']} | {r['shape']} | {r['heads_kept']} |" in section
    assert "judged: shrink-ps50, the only per-stack model" in section
    assert re.search(r"fairseq-headprune deploy .* --calibration-subset test --calibration-sentences 24 --runs 1 "
                     r"--batch1-sentences 4", section)
    # the commands recorded are the user's fairseq options plus the part's, never the report's own options
    single = state["parts"]["single"]["commands"][0]
    assert single.startswith(f"fairseq-headprune ablate {slice_data} --path {stock_checkpoint}")
    assert "--mode single" in single and "--beam 1" in single
    assert "--note" not in single and "--prune-step" not in single
    md = (out / "report.md").read_text()
    assert "sacreBLEU" in md and "nrefs:1|case:mixed" in md
    assert "tiny test model" in md
    # no source parse here: the syntactic function is "not measured", never a count of 0 heads
    assert "| syntactic | not measured | - |" in md and "syntactic functions skipped" in md
    for heading in ("The papers' claims, checked", "Head importance", "Single-head ablation", "One head per layer",
                    "Pruning curves", "Speed of pruned models", "Training dynamics", "Voita et al.: L0 gates",
                    "Commands"):
        assert heading in md, heading
    # every claim has a verdict computed from the files: the parts run here give real verdicts
    verdicts = dict(re.findall(r"^\| (C\d|V) \|.*\| \*\*([a-z ]+)\*\* \|$", md, re.M))
    assert set(verdicts) == {"C1", "C2", "C3", "C4", "C5", "C6", "V"}
    for cid in ("C1", "C2", "C3", "C4", "C6"):
        assert verdicts[cid] in (cl.SUPPORTED, cl.NOT_SUPPORTED), (cid, verdicts[cid])
    assert verdicts["C5"] == cl.NOT_RUN and verdicts["V"] == cl.NOT_RUN  # --dynamics none, no --l0-sweep
    assert "recipes/voita_l0.sh" in md and "iwslt_dynamics" in md  # what to run instead of a made-up value
    claims, recorded = recompute_claims(out)
    assert [(c.id, c.ours, c.verdict) for c in claims] == [(r["id"], r["ours"], r["verdict"]) for r in recorded]
    # each linked figure exists; the HTML embeds them all and references no file
    for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):
        assert (out / link).exists(), link
    html = (out / "report.html").read_text()
    assert html.count("<img ") == md.count("![") >= 9
    assert html.count('src="data:image/png;base64,') == html.count("<img ")
    assert "report finished" in proc.stdout


def test_a_finished_report_reuses_every_part(full_report, slice_data, stock_checkpoint):
    out, _ = full_report
    before = {p.name: p.stat().st_mtime for p in out.glob("*.jsonl")}
    start = time.time()
    dynamics = ROOT / "results" / "dynamics" / "dynamics.jsonl"
    proc = report(slice_data, stock_checkpoint, out, "--dynamics", dynamics)  # the last --dynamics counts
    assert proc.stdout.count("done before, reused") >= 6
    assert {p.name: p.stat().st_mtime for p in out.glob("*.jsonl")} == before
    assert time.time() - start < 60
    # an input of another study is copied beside the report: claims.json names the copy
    assert (out / "inputs" / "dynamics.jsonl").read_bytes() == dynamics.read_bytes()
    claims = json.loads((out / "claims.json").read_text())
    assert claims["inputs"]["dynamics"] == str(out / "inputs" / "dynamics.jsonl")
    assert next(c for c in claims["claims"] if c["id"] == "C5")["verdict"] == cl.SUPPORTED


def _l0_sweep(path: Path, types, closed: str, kept_per_type) -> Path:
    """A compare.jsonl of an L0 sweep on the tiny model (56 heads): the unpruned model, a λ = 0 control and one
    pruned run 0.1 BLEU below the control."""
    rows = [{"header": {"command": "compare", "total_heads": 56}},
            {"key": "baseline", "method": "unpruned", "heads_kept": 56, "bleu": 20.0},
            {"key": "l0:0", "method": "l0", "l0_lambda": 0.0, "updates": 300, "types": types, "heads_kept": 56,
             "kept_per_type": {"enc-self": 32, "enc-dec": 12, "dec-self": 12}, "masked": "", "bleu": 20.5},
            {"key": "l0:1", "method": "l0", "l0_lambda": 0.05, "updates": 300, "types": types,
             "heads_kept": sum(kept_per_type.values()), "kept_per_type": kept_per_type, "masked": closed,
             "bleu": 20.4}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_v_is_judged_on_the_encoder_only_sweep_beside_the_pooled_one(full_report, slice_data, stock_checkpoint,
                                                                      tmp_path):
    import shutil

    out = tmp_path / "report"
    shutil.copytree(full_report[0], out)
    pooled = _l0_sweep(tmp_path / "all.jsonl", ["enc-self", "enc-dec", "dec-self"],
                       "enc-self:1:1+2,dec-self:1:1-4,dec-self:2:1-4", {"enc-self": 30, "enc-dec": 12, "dec-self": 4})
    alone = _l0_sweep(tmp_path / "enc.jsonl", ["enc-self"], "enc-self:1:1-8,enc-self:2:1-8,enc-self:3:1-4",
                      {"enc-self": 12, "enc-dec": 12, "dec-self": 12})
    proc = report(slice_data, stock_checkpoint, out, "--render-only", "--l0-sweep", pooled,
                  "--l0-encoder-sweep", alone)
    assert proc.returncode == 0
    claims = json.loads((out / "claims.json").read_text())
    assert claims["inputs"]["l0_encoder_sweep"] == str(out / "inputs" / "l0-encoder-sweep.jsonl")
    v = next(c for c in claims["claims"] if c["id"] == "V")
    assert v["verdict"] == cl.SUPPORTED  # 20 of 32 encoder heads gated alone; the pooled run closed 2 of 32
    assert v["ours"].startswith("encoder self-attention gated alone: 20 of 32 encoder self-attention heads closed")
    assert "All three types gated: encoder self-attention: 2 of 32" in v["ours"]
    recomputed, recorded = recompute_claims(out)
    assert [(c.id, c.ours, c.verdict) for c in recomputed] == [(r["id"], r["ours"], r["verdict"]) for r in recorded]
    md = (out / "report.md").read_text()
    section = md[md.index("## Voita et al.: L0 gates"):]
    assert "Every head gated: from" in section and "Encoder self-attention gated alone (Voita's main" in section
    assert "| l0 | 0.05 | 36/56 | 12 | 20.40 | +0.40 | -0.10 |" in section  # both baselines
    missing = report(slice_data, stock_checkpoint, out, "--render-only", "--l0-encoder-sweep", tmp_path / "no.jsonl",
                     check=False)
    assert missing.returncode == 2 and "--l0-encoder-sweep: no such file" in missing.stderr.strip().splitlines()[-1]


def test_report_refuses_foreign_results(full_report, slice_data, stock_checkpoint, tmp_path):
    out, _ = full_report
    other = tmp_path / "other"
    other.mkdir()
    (other / "ablation-single.jsonl").write_text((out / "ablation-single.jsonl").read_text())
    # the same files decoded with another beam: the ablate command refuses them, the report says which part
    proc = run(["fairseq-headprune", "report", slice_data, "--path", stock_checkpoint, "--results-dir", other,
                *set_option(REPORT, "--beam", "2"), "--parts", "single"], check=False)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert "part single (ablate)" in last and "holds results of another run" in last


def test_bad_parts_is_one_line(slice_data, stock_checkpoint, tmp_path):
    proc = report(slice_data, stock_checkpoint, tmp_path, "--parts", "single,bogus", check=False)
    assert proc.returncode == 2 and "unknown part 'bogus'" in proc.stderr.strip().splitlines()[-1]


def test_killed_report_resumes(slice_data, stock_checkpoint, full_report, tmp_path):
    out, _ = full_report
    cmd = [str(BIN / "fairseq-headprune"), "report", str(slice_data), "--path", str(stock_checkpoint),
           "--results-dir", str(tmp_path), *REPORT, "--parts", "score,single"]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = tmp_path / "ablation-single.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and sum(1 for _ in open(log)) >= 3:  # header, baseline, a group of heads started
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the report finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = open(log).read().splitlines()
    state = json.loads((tmp_path / "report-state.json").read_text())
    assert list(state["parts"]) == ["score"]  # single was under way
    resumed = run(["fairseq-headprune", "report", slice_data, "--path", stock_checkpoint, "--results-dir", tmp_path,
                   *REPORT, "--parts", "score,single"]).stdout
    assert "score: done before, reused" in resumed
    lines = open(log).read().splitlines()
    assert lines[1 : len(kept)] == kept[1:]  # rows written before the kill are kept, not recomputed
    # ... under the same header; the resumed run adds how it batched its masks (`runs`, not identity)
    header, kept_header = json.loads(lines[0])["header"], json.loads(kept[0])["header"]
    assert {k: v for k, v in header.items() if k != "runs"} == {k: v for k, v in kept_header.items() if k != "runs"}
    # and the resumed sweep is the uninterrupted one
    fresh = [json.loads(x) for x in (out / "ablation-single.jsonl").read_text().splitlines()[1:]]
    again = [json.loads(x) for x in lines[1:]]
    assert sorted((r["key"], r["bleu"]) for r in again) == sorted((r["key"], r["bleu"]) for r in fresh)
    assert (tmp_path / "report.html").exists()


def test_keep_one_selected_by_loss_gives_c2(slice_data, stock_checkpoint, tmp_path):
    """--keep-one-select loss: NLL over every head, BLEU only for each layer's chosen head; C2 computed from those."""
    proc = report(slice_data, stock_checkpoint, tmp_path, "--parts", "keep-one", "--keep-one-select", "loss")
    command = json.loads((tmp_path / "report-state.json").read_text())["parts"]["keep-one"]["commands"][0]
    assert ("--mode keep-one --masks-per-batch 8 --metric loss --select-subset test --report-subset test "
            "--report-metric bleu") in command and "--keep-one-select" not in command
    assert not (tmp_path / "ablation-keep-one.jsonl").exists()
    select = [json.loads(x) for x in (tmp_path / "ablation-keep-one-loss.jsonl").read_text().splitlines()[2:]]
    rows = [json.loads(x) for x in (tmp_path / "ablation-keep-one-loss-report-test-bleu.jsonl").read_text()
            .splitlines()[2:]]
    assert len(select) == 4 * 8 + 2 * 3 * 4 and len(rows) == 4 + 3 + 3  # every head by NLL; one per layer by BLEU
    claims = json.loads((tmp_path / "claims.json").read_text())
    assert claims["inputs"]["keep_one"] == str(tmp_path / "ablation-keep-one-loss-report-test-bleu.jsonl")
    c2 = next(c for c in claims["claims"] if c["id"] == "C2")
    assert c2["verdict"] in (cl.SUPPORTED, cl.NOT_SUPPORTED) and "of 10 layers keep BLEU" in c2["ours"]
    assert "chosen by lowest NLL" in c2["rule"]
    fine = sum(not (r["significant"] and r["delta"] < 0) for r in rows)
    assert c2["ours"].startswith(f"{fine} of 10 layers")
    recomputed, recorded = recompute_claims(tmp_path)
    assert [(c.ours, c.verdict) for c in recomputed if c.id == "C2"] == [(c2["ours"], c2["verdict"])]
    md = (tmp_path / "report.md").read_text()
    assert "chosen by the lowest teacher-forced NLL on `test`" in md and "scored by BLEU on `test`" in md
    for r in rows:
        assert f"| {r['type']} | {r['layer']} | {r['head']} |" in md
    # a layer without its chosen row is incomplete
    cut = cl.claim_keep_one([{"key": "baseline", "bleu": 1.0}] + rows[:-1], 10, heads_per_layer={
        (r["type"], r["layer"]): 1 for r in rows}, selected_by="loss")
    assert cut.verdict == cl.INCOMPLETE
    assert "report finished" in proc.stdout


def test_argv_helpers():
    argv = ["DATA", "--path", "m.pt", "--results-dir", "R", "--beam", "5", "--note=a b", "--render-only", "-s", "de"]
    assert fairseq_argv(argv) == ["DATA", "--path", "m.pt", "--beam", "5", "-s", "de"]
    assert set_option(["D", "--gen-subset", "test", "--beam", "5"], "--gen-subset", "valid") == \
        ["D", "--gen-subset", "valid", "--beam", "5"]
    assert set_option(["D", "--gen-subset=test"], "--gen-subset", "valid") == ["D", "--gen-subset", "valid"]
    assert set_option(["D"], "--results-dir", "X") == ["D", "--results-dir", "X"]


# ---------------------------------------------------------------- claims on synthetic rows: each rule both ways

def _single(n_heads=10, drops=0):
    rows = [{"key": "baseline", "bleu": 30.0}]
    for i in range(n_heads):
        drop = i < drops
        rows.append({"key": f"enc-self:1:{i + 1}", "type": "enc-self", "layer": 1, "head": i + 1,
                     "bleu": 29.0 if drop else 30.1, "delta": -1.0 if drop else 0.1, "significant": drop})
    return rows


def test_c1_most_heads_removable_both_ways():
    assert cl.claim_single_heads(_single(10, 4), 10).verdict == cl.SUPPORTED
    assert cl.claim_single_heads(_single(10, 5), 10).verdict == cl.NOT_SUPPORTED  # exactly half is not "most"
    assert cl.claim_single_heads(_single(10, 2), 12).verdict == cl.INCOMPLETE
    missing = cl.claim_single_heads(None, 10, "fairseq-headprune ablate X")
    assert missing.verdict == cl.NOT_RUN and missing.command == "fairseq-headprune ablate X"
    # a significant gain is not a loss
    rows = _single(4, 0)
    for r in rows[1:]:
        r.update(significant=True, delta=0.5)
    assert cl.claim_single_heads(rows, 4).verdict == cl.SUPPORTED


def _keep_one(bad_layers, layers=4, heads=2):
    rows = [{"key": "baseline", "bleu": 30.0}]
    for layer in range(1, layers + 1):
        for h in range(1, heads + 1):
            bad = layer <= bad_layers
            delta = -5.0 - h if bad else -0.1 * h
            rows.append({"key": f"keep:enc-dec:{layer}:{h}", "type": "enc-dec", "layer": layer, "head": h,
                         "bleu": 30.0 + delta, "delta": delta, "significant": bad})
    return rows


def test_c2_layers_to_one_head_both_ways():
    per_layer = {("enc-dec", layer): 2 for layer in range(1, 5)}
    good = cl.claim_keep_one(_keep_one(1), 4, heads_per_layer=per_layer)
    assert good.verdict == cl.SUPPORTED and "3 of 4 layers" in good.ours and "enc-dec layer 1 -6.00" in good.ours
    assert cl.claim_keep_one(_keep_one(2), 4, heads_per_layer=per_layer).verdict == cl.NOT_SUPPORTED
    assert cl.claim_keep_one(_keep_one(1)[:-1], 4, heads_per_layer=per_layer).verdict == cl.INCOMPLETE
    best = best_per_layer(_keep_one(0))
    assert [r["head"] for r in best] == [1, 1, 1, 1]  # the higher BLEU


def _curve(order, types, bleus, total=100):
    n = len(bleus) - 1
    return [{"key": f"{order}:{i}", "order": order, "types": list(types), "percent_pruned": 100.0 * i / n,
             "heads_masked": i * total // n, "bleu": b} for i, b in enumerate(bleus)]


ALL = ("enc-self", "enc-dec", "dec-self")


def test_c3_prunable_share_both_ways():
    # steps of 10%: within 0.5 BLEU up to 30% -> supported; a dip at 10% stops the count even if BLEU recovers
    ok = cl.claim_prunable(_curve("importance", ALL, [30, 30.2, 29.8, 29.6, 28, 20, 10, 5, 2, 1, 0]))
    assert ok.verdict == cl.SUPPORTED and ok.ours.startswith("30% of heads pruned")
    dip = cl.claim_prunable(_curve("importance", ALL, [30, 29.4, 30, 30, 28, 20, 10, 5, 2, 1, 0]))
    assert dip.verdict == cl.NOT_SUPPORTED and dip.ours.startswith("0% of heads pruned")
    assert cl.claim_prunable(_curve("random", ALL, [30, 30])).verdict == cl.NOT_RUN  # no importance curve
    assert cl.prunable_percent([(0, 30), (10, 29.5), (20, 29.49)], 0.5) == 10


def test_c4_enc_dec_most_sensitive_both_ways():
    rows = (_curve("importance", ["enc-self"], [30, 29, 25, 10]) + _curve("importance", ["enc-dec"], [30, 20, 5, 0])
            + _curve("importance", ["dec-self"], [30, 29, 28, 20]))
    claim = cl.claim_enc_dec_sensitive(rows, None)
    assert claim.verdict == cl.SUPPORTED and claim.ours.startswith("mean BLEU over the curve: enc-dec")
    swapped = [dict(r, types=["enc-dec"] if r["types"] == ["enc-self"] else ["enc-self"] if r["types"] == ["enc-dec"]
                    else r["types"]) for r in rows]
    assert cl.claim_enc_dec_sensitive(swapped, None).verdict == cl.NOT_SUPPORTED
    # without per-type curves: the single-head ablation's mean change decides
    single = [{"key": "baseline", "bleu": 30}] + [
        {"key": f"{t}:1:1", "type": t, "layer": 1, "head": 1, "delta": d, "bleu": 30 + d, "significant": False}
        for t, d in (("enc-self", -0.1), ("enc-dec", -0.5), ("dec-self", 0.0))]
    fallback = cl.claim_enc_dec_sensitive(_curve("importance", ALL, [30, 20]), single)
    assert fallback.verdict == cl.SUPPORTED and "single-head" in fallback.rule
    single[2]["delta"] = 0.2
    assert cl.claim_enc_dec_sensitive(None, single).verdict == cl.NOT_SUPPORTED
    assert cl.claim_enc_dec_sensitive(None, None).verdict == cl.NOT_RUN


def _dynamics(first, last):
    rows = []
    for epoch, kept in ((1, first), (2, (first + last) / 2), (3, last)):
        for p, retained in zip((0, 10, 20, 30, 40, 50, 60), [100] + [kept] * 5 + [0]):
            rows.append({"key": f"{epoch}:{p}", "epoch": epoch, "percent_pruned": float(p), "bleu": retained / 3,
                         "bleu_retained": float(retained)})
    return rows


def test_c5_dynamics_both_ways():
    assert cl.claim_dynamics(_dynamics(60, 90)).verdict == cl.SUPPORTED
    assert cl.claim_dynamics(_dynamics(85, 90)).verdict == cl.NOT_SUPPORTED
    assert cl.claim_dynamics([r for r in _dynamics(60, 90) if r["epoch"] == 1]).verdict == cl.NOT_RUN
    assert cl.claim_dynamics(None, "bash recipes/iwslt_dynamics.sh").command == "bash recipes/iwslt_dynamics.sh"


def _speed(pruned_rate, std=1.0):
    def model(rate):
        return {"sentences_per_s": rate, "sentences_per_s_std": std, "tokens_per_s": rate * 10,
                "incremental_state_bytes": 1000}
    rows = {}
    for b in ("1", "64"):
        row = {"unpruned": model(100.0), "masked": model(100.0), "pruned": model(pruned_rate)}
        row["pruned"]["speedup"] = pruned_rate / 100.0
        # equal work (what C6 reads): pruned over masked, the two having written the same tokens
        row["pruned"].update(speedup_over_masked=pruned_rate / 100.0, speedup_over_masked_std=0.0,
                             same_tokens_as_masked=True)
        rows[b] = row
    return {"heads_pruned": 72, "heads_total": 144, "batch_sizes": rows, "flop_bound_speedup": 1.2,
            "flop_ratio": 1.2}


def test_c6_speed_both_ways():
    assert cl.claim_speed(_speed(110.0)).verdict == cl.SUPPORTED
    assert cl.claim_speed(_speed(101.5)).verdict == cl.NOT_SUPPORTED  # within the noise
    assert cl.claim_speed(_speed(90.0)).verdict == cl.NOT_SUPPORTED
    assert cl.claim_speed(None).verdict == cl.NOT_RUN


def test_voita_both_ways():
    full = {"method": "unpruned", "lambda": None, "heads_kept": 48, "heads_total": 48, "bleu": 30.0}
    points = [full, {"method": "l0", "lambda": 0.01, "heads_kept": 20, "heads_total": 48, "bleu": 29.8},
              {"method": "l0", "lambda": 0.1, "heads_kept": 5, "heads_total": 48, "bleu": 25.0},
              {"method": "michel", "lambda": None, "heads_kept": 5, "heads_total": 48, "bleu": 29.9}]
    claim = cl.claim_voita(points)
    assert claim.verdict == cl.SUPPORTED and claim.ours.startswith("28 of 48 heads closed (λ=0.01)")
    points[1]["bleu"] = 29.7  # 0.3 BLEU lost: no longer within 0.25
    assert cl.claim_voita(points).verdict == cl.NOT_SUPPORTED
    assert cl.claim_voita(points[1:]).verdict == cl.INCOMPLETE  # no full model to compare with
    assert cl.claim_voita(None, "bash recipes/voita_l0.sh").verdict == cl.NOT_RUN
    assert cl.claim_voita([full, points[3]]).verdict == cl.NOT_RUN  # Michel's masks are not an L0 sweep


def test_l0_points_read_a_compare_file(tmp_path):
    rows = [{"header": {"command": "compare", "total_heads": 144}},
            {"key": "baseline", "method": "unpruned", "heads_kept": 144, "bleu": 36.7},
            {"key": "michel:enc-self:60", "method": "michel", "heads_kept": 60, "bleu": 30.0},
            {"key": "l0:ab", "method": "l0", "l0_lambda": 0.05, "heads_kept": 60, "bleu": 36.5}]
    path = tmp_path / "compare.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    points = cl.l0_points(str(path))
    assert [(p["method"], p["lambda"], p["heads_total"]) for p in points] == \
        [("unpruned", None, 144), ("michel", None, 144), ("l0", 0.05, 144)]
    claim = cl.claim_voita(points)
    assert claim.verdict == cl.SUPPORTED and claim.ours.startswith("84 of 144 heads closed (λ=0.05), BLEU 36.50")


# ---------------------------------------------------------------- claims on the committed results

def test_claims_on_committed_dynamics():
    rows = cl.read_rows(str(ROOT / "results" / "dynamics" / "dynamics.jsonl"))
    claim = cl.claim_dynamics(rows)
    # epochs 1..25 of the bundled model's run: epoch 1 keeps about two thirds of its BLEU at 10-50% pruned, the
    # last over 90%
    assert claim.verdict == cl.SUPPORTED
    first, last = map(float, re.findall(r"keeps (\d+)%", claim.ours))
    assert first < 75 and last > 90


COMMITTED = ROOT / "results" / "report-de-en"


def recompute_claims(folder: Path):
    """The claims of a written report, computed again from the input files its claims.json names."""
    recorded = json.loads((folder / "claims.json").read_text(encoding="utf-8"))
    inputs = recorded["inputs"]
    path = lambda name: str(ROOT / inputs[name]) if inputs[name] else None  # noqa: E731
    per_layer = {(k.split(":")[0], int(k.split(":")[1])): n for k, n in inputs["heads_per_layer"].items()}
    single, pruning = cl.read_rows(path("single")), cl.read_rows(path("pruning"))
    selected_by = inputs.get("keep_one_select", "bleu")  # loss: one NLL-chosen head per layer, decoded
    keep_one_per_layer = {k: 1 for k in per_layer} if selected_by == "loss" else per_layer
    l0 = path("l0_sweep")
    encoder = path("l0_encoder_sweep") if inputs.get("l0_encoder_sweep") else None
    return [cl.claim_single_heads(single, inputs["heads"]),
            cl.claim_keep_one(cl.read_rows(path("keep_one")), len(per_layer), heads_per_layer=keep_one_per_layer,
                              selected_by=selected_by),
            cl.claim_prunable(pruning), cl.claim_enc_dec_sensitive(pruning, single),
            cl.claim_dynamics(cl.read_rows(path("dynamics"))), cl.claim_speed(read_json(path("speed"))),
            cl.claim_voita(cl.l0_points(l0) if l0 else None,
                           encoder_only=cl.l0_points(encoder) if encoder else None)], recorded["claims"]


def test_committed_report_claims_are_computed_from_its_files():
    """The committed full-size report of the bundled model: each claim row (ours and verdict) is what the rules
    give on the committed result files: never typed in, never stale."""
    claims, recorded = recompute_claims(COMMITTED)
    md = (COMMITTED / "report.md").read_text(encoding="utf-8")
    assert [(c.id, c.ours, c.verdict) for c in claims] == [(r["id"], r["ours"], r["verdict"]) for r in recorded]
    for c in claims:
        assert f"| {c.id} | {c.claim} | {c.paper} | {c.ours} | **{c.verdict}** |" in md
    dynamics = next(c for c in claims if c.id == "C5")
    assert dynamics.verdict == cl.SUPPORTED  # the bundled model's training run is committed
    for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):
        assert (COMMITTED / link).exists(), link


# ---------------------------------------------------------------- the HTML in a real browser

def test_html_report_loads_in_chromium_with_every_image(full_report, tmp_path):
    out, _ = full_report
    html = (out / "report.html").read_text(encoding="utf-8")
    images = embedded_images(html)
    assert len(images) == html.count("<img ") >= 9
    probe = browser_probe(out / "report.html", tmp_path)
    assert probe["title"].endswith("fairseq-headprune report")
    assert probe["tables"] >= 8
    assert pil_problems(images) == {}  # every PNG decodes completely (CRCs, every row)
    assert browser_problems(images, probe) == {}  # and the browser drew every pixel of it
    for seen in probe["images"]:
        assert seen["width"] > 100 and seen["height"] > 100


def test_committed_report_html_decodes_completely(tmp_path):
    html = (COMMITTED / "report.html").read_text(encoding="utf-8")
    images = embedded_images(html)
    assert len(images) == html.count("<img ") >= 9
    assert pil_problems(images) == {}
    assert browser_problems(images, browser_probe(COMMITTED / "report.html", tmp_path)) == {}


def _corrupt(data: bytes, how: str) -> bytes:
    if how == "header":  # the signature and IHDR: a broken-image icon
        return b"\0" * 3 + data[3:]
    if how == "truncated":  # the body cut at 60%: a valid header, the top rows decode
        return data[: int(len(data) * 0.6)]
    if how == "zeroed":  # a fifth of the body zeroed in the middle (IDAT), length unchanged
        n = len(data)
        return data[: 2 * n // 5] + bytes(n // 5) + data[3 * n // 5:]
    raise ValueError(how)


def test_browser_and_pil_checks_see_broken_headers_and_bodies(tmp_path):
    """The checks of the test above on a page whose first three images are damaged: a broken header, a body
    truncated to 60% and a body with zeroed middle bytes (both still report their size); the rest are intact.
    Each of the two decoders flags exactly the three damaged images."""
    html = (COMMITTED / "report.html").read_text(encoding="utf-8")
    intact = embedded_images(html)
    damaged = {0: "header", 1: "truncated", 2: "zeroed"}
    page = html
    for i, how in damaged.items():
        old = base64.b64encode(intact[i]).decode()
        page = page.replace(old, base64.b64encode(_corrupt(intact[i], how)).decode(), 1)
    broken = tmp_path / "broken.html"
    broken.write_text(page, encoding="utf-8")
    assert embedded_images(page)[3:] == intact[3:]
    assert set(pil_problems(embedded_images(page))) == set(damaged)
    probe = browser_probe(broken, tmp_path)
    assert set(browser_problems(intact, probe)) == set(damaged)
    # what the old header-only check saw: the two damaged bodies still report their full size
    for i in (1, 2):
        assert probe["images"][i]["complete"] and probe["images"][i]["width"] > 100
    assert probe["images"][0]["width"] == 0


def test_prune_progress_counts_only_the_whole_model_curves(tmp_path):
    """pruning.jsonl also holds the per-type curves (and rows merged from elsewhere): the prune part's progress
    counts the rows of its own orders over all types."""
    from fairseq_headprune.report.pipeline import Ticker, expected_rows
    from fairseq_headprune.report.parts import Part, ReportOptions
    from fairseq_headprune.core.heads import HeadLayout

    layout = HeadLayout({(t, layer): tuple(range(1, 5)) for t in ("enc-self", "enc-dec", "dec-self")
                         for layer in (1, 2)}, {})
    options = ReportOptions(subset="test", prune_orders="importance,random", prune_step=0.25, keep_one_select="bleu")
    path, expected, prefixes = expected_rows(Part("prune", "pruning curves"), layout, options, str(tmp_path))
    assert path == str(tmp_path / "pruning.jsonl") and expected == 2 * 5
    keys = ["importance:enc-self,enc-dec,dec-self:0", "importance:enc-self,enc-dec,dec-self:6",
            "random:enc-self,enc-dec,dec-self:0", "importance:enc-dec:2", "oracle:enc-self,enc-dec,dec-self:6"]
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"header": {}}) + "\n")
        f.writelines(json.dumps({"key": k, "bleu": 1.0}) + "\n" for k in keys)
    assert Ticker("prune", path, expected, key_prefixes=prefixes).rows() == 3
    assert Ticker("single", path, expected).rows() == len(keys)


def test_shrink_part_without_its_calibration_subset_is_one_line(slice_data, stock_checkpoint, tmp_path):
    """The slice has no `valid`: the shrink part is refused before any part runs, naming the option to set."""
    args = [a for a in REPORT]
    args[args.index("--shrink-calibration-subset") + 1] = "valid"
    proc = run(["fairseq-headprune", "report", slice_data, "--path", stock_checkpoint, "--results-dir", tmp_path,
                *args, "--parts", "score,shrink"], check=False)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert "part shrink" in last and "--shrink-calibration-subset" in last
    assert not (tmp_path / "importance.json").exists()  # refused before the score part ran


def test_run_only_options_neither_rerun_a_part_nor_change_its_printed_command(slice_data, stock_checkpoint,
                                                                              tmp_path):
    """--workers changes how fast a part runs, not what it computes: a report run again with another number of
    workers reuses the finished parts, and prints the command lines that made their files, as they ran."""
    from fairseq_headprune.report.parts import command_identity

    assert command_identity("fairseq-headprune ablate d --workers 2 --mode single") == \
        "fairseq-headprune ablate d --mode single"
    assert command_identity("fairseq-headprune ablate d --workers=auto") == "fairseq-headprune ablate d"
    assert command_identity("fairseq-headprune ablate d --masks-per-batch 8 --workers 1") == \
        "fairseq-headprune ablate d"
    report(slice_data, stock_checkpoint, tmp_path, "--parts", "score,single", "--workers", "1")
    ran = json.loads((tmp_path / "report-state.json").read_text())["parts"]["single"]["commands"][0]
    assert "--workers 1" in ran
    again = report(slice_data, stock_checkpoint, tmp_path, "--parts", "score,single", "--workers", "2").stdout
    assert "single: done before, reused" in again
    md = (tmp_path / "report.md").read_text()
    assert ran in md and ran.replace("--workers 1", "--workers 2") not in md
    # another option that changes the results is another run: the part is not reused
    changed = report(slice_data, stock_checkpoint, tmp_path, "--parts", "score,single", "--beam", "2",
                     check=False)
    assert "single: done before, reused" not in changed.stdout


def test_recover_section_shows_a_given_study_and_judges_its_targets(full_report, slice_data, stock_checkpoint,
                                                                     tmp_path):
    import shutil

    from fairseq_headprune.records.identity import file_sha256

    out = tmp_path / "report"
    shutil.copytree(full_report[0], out)
    md = (out / "report.md").read_text()
    assert "No recover study for this model" in md  # the tiny model has none by default

    def row(key, removed, run, epoch, bleu, p=0.5, adjusted=None):
        r = {"key": key, "label": key, "removed_percent": removed, "run": run, "epoch": epoch, "bleu": bleu,
             "delta": bleu - 40.0, "p": p, "interval": [-1.0, 1.0]}
        if adjusted is not None:
            r.update(delta_adjusted=adjusted, control_delta=bleu - 40.0 - adjusted)
        return r

    epochs = lambda *losses: [{"epoch": i + 1, "valid_loss": v} for i, v in enumerate(losses)]  # noqa: E731
    study = {"subset": "test", "settings": "paired bootstrap, 7 resamples", "figure": None,
             "unpruned_sha256": file_sha256(stock_checkpoint),
             "rows": [{"key": "unpruned", "label": "unpruned", "removed_percent": 0, "run": None, "epoch": None,
                       "bleu": 40.0},
                      row("r50@1", 50, "r50", 1, 39.9, adjusted=-0.1), row("r50@2", 50, "r50", 2, 39.0, adjusted=-1.0),
                      row("r75@1", 75, "r75", 1, 38.0, adjusted=-2.0), row("s30", 30, "s30", 0, 39.5, p=0.001)],
             "costs": {"r50": {"epochs": epochs(2.0, 2.5), "cpu_minutes": 14.0, "peak_rss_gib": 1.5,
                               "default_recipe": True},
                       "r75": {"epochs": epochs(3.0), "cpu_minutes": 7.0, "peak_rss_gib": 1.6,
                               "default_recipe": True}}}
    path = tmp_path / "recover-test.json"
    path.write_text(json.dumps(study))
    report(slice_data, stock_checkpoint, out, "--render-only", "--recover-study", path)
    md = (out / "report.md").read_text()
    section = md[md.index("## Recovering what pruning lost"):md.index("## Commands")]
    assert "Not this model's" not in section and "paired bootstrap, 7 resamples" in section
    assert "| r50@2 (`r50@2`) | 50% | 2 | 39.00 | -1.00 |" in section
    # judged by the delivered epoch (lowest valid loss: epoch 1 at 50%), not by the best on the scored set
    assert "best r50@1: -0.10: **met**" in section and "best r75@1: -2.00: **missed**" in section
    assert "best s30: -0.50 (p 0.001): **missed**" in section
    assert "median 7.0 CPU-min an epoch (range 7.0-7.0); peak 1.6 GiB: **met**" in section
    assert (out / "inputs" / "recover-study.json").exists()
    study["unpruned_sha256"] = "0" * 64
    path.write_text(json.dumps(study))
    report(slice_data, stock_checkpoint, out, "--render-only", "--recover-study", path)
    assert "Not this model's: the study's unpruned model is checkpoint 000000000000" in (out / "report.md").read_text()


def test_compress_section_shows_the_frontier_of_given_runs_and_whose_they_are(full_report, slice_data,
                                                                               stock_checkpoint, tmp_path):
    """`--compress-runs DIR`: every finished run of DIR (its compress.json) a row of the section's table with its
    shape, epochs, speed and ΔBLEU per set, the controls beside them, the figure drawn; runs compressed from another
    checkpoint said so; a folder with no finished run refused in one line."""
    import shutil

    from fairseq_headprune.records.identity import file_sha256

    out = tmp_path / "report"
    shutil.copytree(full_report[0], out)
    assert "No compress runs for this model" in (out / "report.md").read_text()  # the tiny model has none

    def record(sha, chosen, epochs, speed, test, also):
        return {"options": {"shape": None}, "stages": {
            "cost-table": {"identity": {"model_sha256": sha}}, "choice": {"chosen": chosen},
            "recover": {"budget_epochs": epochs}, "measure": {"speedup_equal_work": speed, "flop_ratio": 0.9 * speed},
            "report": {"subset": "test", "bleu_delta": test[0], "p": test[1], "significance": "7 resamples",
                       "also": [{"subset": "second", "bleu_delta": also[0], "p": also[1]}]}}}

    runs = tmp_path / "runs"
    sha = file_sha256(stock_checkpoint)
    for name, rec in {"fast": record(sha, {"enc_heads": 8, "dec_heads": 3, "dec_layers": 4}, 8, 2.05, (-0.73, 0.025),
                                     (-0.28, 0.288)),
                      "slow": record(sha, {"enc_heads": 8, "dec_heads": 7}, 4, 1.07, (0.13, 0.313), (0.24, 0.338))
                      }.items():
        (runs / name).mkdir(parents=True)
        (runs / name / "compress.json").write_text(json.dumps(rec))
    (runs / "unfinished").mkdir()  # a run stopped before its report: no row
    (runs / "unfinished" / "compress.json").write_text(json.dumps({"stages": {"choice": {}}}))
    (runs / "control-bleu.json").write_text(json.dumps({"models": {"ctl-e8": {"test": {"bleu_delta": -0.07},
                                                                              "second": {"bleu_delta": 0.29}}}}))
    report(slice_data, stock_checkpoint, out, "--render-only", "--compress-runs", runs)
    md = (out / "report.md").read_text()
    section = md[md.index("## Compressing for deployment"):md.index("## Commands")]
    assert "2 runs of `compress`" in section and "Not all of them" not in section
    assert "Significance: 7 resamples." in section  # as the runs' records say it
    assert "| slow | 8/7 heads per stack (encoder/decoder) | 4 | 1.07x (no interval recorded) | 0.96 | " \
        "not measured | +0.13 (0.313) | +0.24 (0.338) |" in section
    assert "| fast | encoder 8 heads per layer, decoder 4 layers x 3 heads | 8 | 2.05x (no interval recorded) | " \
        "1.84 | not measured | -0.73 (0.025) | -0.28 (0.288) |" in section
    assert section.index("| slow") < section.index("| fast")  # slowest first
    assert "ctl-e8: test -0.07, second +0.29" in section
    assert (out / "report-compress-frontier.png").stat().st_size > 1000
    assert json.loads((out / "inputs" / "compress-runs.json").read_text())["folder"] == str(runs)
    rec = json.loads((runs / "fast" / "compress.json").read_text())
    rec["stages"]["cost-table"]["identity"]["model_sha256"] = "0" * 64
    (runs / "fast" / "compress.json").write_text(json.dumps(rec))
    report(slice_data, stock_checkpoint, out, "--render-only", "--compress-runs", runs)
    assert "compressed from checkpoint(s) 000000000000" in (out / "report.md").read_text()
    proc = report(slice_data, stock_checkpoint, out, "--render-only", "--compress-runs", runs / "unfinished",
                  check=False)
    assert proc.returncode == 2 and "--compress-runs: no finished compress run in" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    (runs / "unfinished" / "compress.json").write_text("{")  # a broken record: one line, never a traceback
    proc = report(slice_data, stock_checkpoint, out, "--render-only", "--compress-runs", runs, check=False)
    assert proc.returncode == 2 and "unfinished/compress.json: not a finished compress record" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
