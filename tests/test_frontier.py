"""benchmarks/frontier.py: the table and figure of compress runs, from their records alone."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fairseq_headprune.errors import UserError
from fairseq_headprune.studies import frontier

ROOT = Path(__file__).resolve().parents[1]


def record(chosen, epochs, speed, test, also, shape=None, hidden=None, distill=None, vocab_map=None, latency=None,
           distillation_set=None, interval=None):
    recover = {"budget_epochs": epochs, "distill_hidden": {"weight": hidden} if hidden else None}
    if distillation_set:
        recover["distillation_set"] = distillation_set
    measure = {"speedup_equal_work": speed, "flop_ratio": speed * 0.9}
    chrf = {"chrf_delta": -0.4, "chrf_p": 0.02} if interval else {}  # a run recorded since chrF and intervals
    if latency:
        measure["latency_batch1"] = {"speedup": latency}
    if interval:
        measure["speedup_equal_work_interval"] = {"ratio": speed, "low": interval[0], "high": interval[1]}
    return {"options": {"shape": shape, "vocab_map": vocab_map}, "stages": {
        "choice": {"chosen": chosen},
        "recover": {**recover, "distill": distill} if distill else recover,  # (records before --distill: none)
        "measure": measure,
        "report": {"subset": "test", "bleu_delta": test[0], "p": test[1], **chrf,
                   "also": [{"subset": "second", "bleu_delta": also[0], "p": also[1]}]}}}


def test_frontier_tables_every_run_by_speed_with_its_sets(tmp_path):
    runs = {"fast": record({"enc_heads": 8, "dec_heads": 3, "dec_layers": 4}, 8, 2.05, (-0.73, 0.025), (-0.28, 0.288),
                           hidden=0.2),
            "slow": record({"enc_heads": 8, "dec_heads": 7}, 4, 1.07, (0.13, 0.313), (0.24, 0.338), shape="8/7"),
            "seq": record({"enc_heads": 8, "dec_heads": 3, "dec_layers": 4}, 8, 2.02, (-0.5, 0.1), (-0.2, 0.3),
                          shape="8/4x3", distill="both", vocab_map=True, latency=2.5,
                          distillation_set={"sources": 10, "pairs": 20, "nbest": 2}, interval=(1.95, 2.11))}
    for name, rec in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "compress.json").write_text(json.dumps(rec))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "frontier.py"), str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "frontier.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| slow") or line.startswith("| fast")]
    assert rows[0].startswith("| slow | 8/7 heads per stack (encoder/decoder) (given by --shape) | 4 | 1.07x (no "
                              "interval recorded) | 0.96 | not measured |")
    assert rows[0].endswith("| +0.13 (0.313) | +0.24 (0.338) |")
    assert "decoder 4 layers x 3 heads (hidden-state term β 0.2) | 8 | 2.05x (no interval recorded) | 1.84 | " \
        "not measured | -0.73 (0.025) | " \
        "-0.28 (0.288)" in rows[1]
    assert "| seq | encoder 8 heads per layer, decoder 4 layers x 3 heads (given by --shape) (--distill both) " \
        "(vocabulary map) (+20 pairs of --distill-source text) | 8 | 2.02x (1.95-2.11) | 1.82 | 2.50x | " \
        "-0.50 (0.100); chrF -0.40 (0.020) | -0.20 (0.300) |" in text
    assert (tmp_path / "frontier.png").stat().st_size > 1000
    served = record({"enc_heads": 2, "dec_heads": 4, "dec_layers": 2}, 8, 3.8, (-3.0, 0.0), (-2.0, 0.0),
                    interval=(3.7, 3.9))  # --deploy-batch 1: timed at batch 1 first, at batch 64 beside it
    served["stages"]["measure"].update(deployment={"batch": 1}, batch64={"speedup": 3.1,
                                                                        "interval": {"low": 3.0, "high": 3.2}})
    row = frontier.row("served", served)
    assert (row["speed"], row["speed_interval"]["low"], row["latency"]) == (3.1, 3.0, 3.8)
    empty = tmp_path / "none"
    empty.mkdir()
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "frontier.py"), str(empty)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip().endswith("no */compress.json of a finished run")


def test_the_frontier_reads_every_control_file(tmp_path):
    """Each control*-bleu.json of a folder is a control of the frontier (its p in the table, its note under it); a
    name in two files is refused in one line."""
    def write(name, models, note):
        (tmp_path / name).write_text(json.dumps({"models": models, "note": note}))

    write("control-bleu.json", {"ctl-e8": {"test": {"bleu_delta": -0.07, "p": 0.409}}}, "on train")
    write("control-distill-set-bleu.json", {"ctl-set": {"test": {"bleu_delta": -0.6, "p": 0.04},
                                                        "val500": {"bleu_delta": 0.1, "p": 0.4}}}, "beside a set")
    assert frontier.controls(str(tmp_path)) == {"ctl-e8": {"test": -0.07}, "ctl-set": {"test": -0.6, "val500": 0.1}}
    table = frontier.controls_markdown(str(tmp_path), ["test", "val500"])
    assert "| ctl-e8 | -0.07 (0.409) |  |" in table and "| ctl-set | -0.60 (0.040) | +0.10 (0.400) |" in table
    assert "control-distill-set-bleu.json: beside a set" in table
    write("control-other-bleu.json", {"ctl-e8": {"test": {"bleu_delta": 0.0, "p": 0.5}}}, "")
    with pytest.raises(UserError, match="ctl-e8 is named in another"):
        frontier.controls(str(tmp_path))
    assert frontier.controls_markdown(str(tmp_path / "none"), ["test"]) == ""
