"""The compress card is written for the person who deploys the model: a plain summary first (what was removed, speed
and latency at batch 1, BLEU on each held-out set with its p, the verdict on speed and BLEU), sets the unpruned model
was trained on labelled as such, a glossary, no path of the machine that made it (in the card or compress.json).
The committed cards under results/ are checked as they are; tools/render_card.py renders them from their records."""
from __future__ import annotations

import json
import re
import subprocess
import sys

from conftest import ENV, ROOT
from fairseq_headprune.compress import model_card

RUNS = sorted(p.parent for p in (ROOT / "results").glob("compress-*/*/compress.json"))
ABSOLUTE = re.compile(r"(?<![\w.])/(work|home|tmp|root|Users|mnt|opt|var)/")


def test_committed_cards_and_records_hold_no_machine_path_and_state_the_latency_at_batch_1():
    assert len(RUNS) >= 17
    for run in RUNS:
        card, record = (run / "MODEL_CARD.md").read_text(), (run / "compress.json").read_text()
        assert not ABSOLUTE.search(card) and not ABSOLUTE.search(record), run
        summary = card.split("## Summary")[1].split("## Result")[0]
        assert "latency at batch 1" in summary and "**Target**" in summary and "*Equal work*" in summary, run
        for jargon in ("crude slice", "Fisher block", "ids hash"):
            assert jargon not in card, (run, jargon)
        assert "| FFN units | 50 (% of every FFN's hidden units kept) | yes |" in card, run  # removable since
        assert card == model_card.render(json.loads(record)), run  # rendered from the record it sits beside
        if '"subset": "traintail"' in record:  # the last train sentences: the bundled model was trained on them
            assert "traintail" not in summary.split("**On the unpruned model's own training data**")[0], run
            assert "traintail (the unpruned model's training data)" in card, run


def _record():
    return json.loads((ROOT / "results" / "compress-de-en" / "speedup-1.5" / "compress.json").read_text())


def test_the_summary_states_latency_the_verdict_on_both_and_labels_the_teachers_training_data():
    record = _record()
    record["stages"]["measure"]["latency_batch1"] = {"sentences": 50, "forced_length": 15, "speedup": 1.42,
                                                     "ms": {"unpruned": 21.3, "compressed": 15.0}}
    card = model_card.render(record)
    summary = card.split("## Summary")[1].split("## Result")[0]
    assert "latency at batch 1 (one sentence at a time) 1.42x: 15.0 ms a sentence against 21.3 ms" in summary
    assert "1.60x in batches of up to 64 sentences" in summary
    assert "| latency at batch 1, equal work (50 sentences) | 21.3 ms | 15.0 ms (1.42x) |" in card
    assert "--speedup 1.5: speed met (1.60x); BLEU significantly lower (p < 0.05) on val500" in summary
    record["teacher_trained_on"] = []
    unlabelled = model_card.render(record).split("## Summary")[1].split("## Result")[0]
    assert "traintail 44.72" in unlabelled.split("**Target**")[0] and "own training data" not in unlabelled
    assert "on val500, traintail" in unlabelled  # then it counts as held out


def test_portable_names_paths_by_out_data_or_file_name():
    out, data = "/x/runs/small", "/x/data-bin"
    record = {"options": {"out": out, "references": "/x/data-bin/test.raw.en",
                          "command": f"fairseq-headprune compress {data} --path ckpt/model.pt --out {out} "
                                     f"--also-references=/x/data-bin/a.en,/y/b.en --bpe-codes /z/code"},
              "stages": {"shrink": {"checkpoint": "/x/runs/small/stages/shrink/model.pt"}},
              "source_checkpoint": "/elsewhere/model.pt", "note": "a/b relative", "data": data}
    got = model_card.portable(record, out, data)
    assert got["options"]["out"] == "OUT" and got["data"] == "DATA"
    assert got["options"]["references"] == "DATA/test.raw.en"
    assert got["stages"]["shrink"]["checkpoint"] == "OUT/stages/shrink/model.pt"
    assert got["source_checkpoint"] == "model.pt" and got["note"] == "a/b relative"
    assert got["options"]["command"] == ("fairseq-headprune compress DATA --path ckpt/model.pt --out OUT "
                                         "--also-references=DATA/a.en,b.en --bpe-codes code")
    assert model_card.portable(got, "OUT", "DATA") == got  # a second pass changes nothing


def test_render_card_tool_rewrites_a_record_of_absolute_paths(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    record = _record()
    record["options"]["out"], record["data"] = str(tmp_path / "out"), str(tmp_path / "bin")
    record["options"]["references"] = str(tmp_path / "bin" / "test.raw.en")
    record["stages"]["report"]["references"] = str(tmp_path / "bin" / "test.raw.en")
    record["source_checkpoint"] = str(tmp_path / "model.pt")
    record.pop("teacher_trained_on", None)
    (run / "compress.json").write_text(json.dumps(record))
    tool = [sys.executable, ROOT / "tools" / "render_card.py", run]
    refused = subprocess.run([*tool, "--teacher-trained-on", "nosuch"], capture_output=True, text=True, env=ENV)
    assert refused.returncode == 2 and "not a reported set" in refused.stderr and not (run / "MODEL_CARD.md").exists()
    subprocess.run([*tool, "--teacher-trained-on", "traintail"], check=True, capture_output=True, env=ENV)
    card, written = (run / "MODEL_CARD.md").read_text(), (run / "compress.json").read_text()
    assert str(tmp_path) not in card and str(tmp_path) not in written
    assert "against DATA/test.raw.en" in card and json.loads(written)["teacher_trained_on"] == ["traintail"]
    assert "traintail (the unpruned model's training data: not a held-out result)" in "".join(
        json.loads(written)["verdict"]["lines"])


def test_chrf_and_the_bleu_interval_stand_beside_bleu():
    record = _record()
    report = record["stages"]["report"]
    for r in (report, *report["also"]):
        r.update({"bleu_delta_interval": [-0.9, 0.1], "chrf_unpruned": 60.0, "chrf_compressed": 59.5,
                  "chrf_delta": -0.5, "chrf_p": 0.04})
    report["chrf_signature"] = "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0"
    card = model_card.render(record)
    summary = card.split("## Summary")[1].split("## Result")[0]
    assert "95% interval -0.90 to +0.10, p " in summary and "; chrF 59.50 against 60.00 (-0.50, p 0.040)" in summary
    assert f"| chrF, {report['subset']} | 60.00 | 59.50 (p 0.040) |" in card
    assert "chrF: sacreBLEU (nrefs:1|case:mixed|eff:yes|nc:6" in card and "inconclusive" in card
