"""The shrink study as a report part, without a model: its options as the command's, its tables, and the L0 runs
shown beside it only when they were scored like it."""
import json
from dataclasses import replace

import pytest

from fairseq_headprune.errors import UserError
from fairseq_headprune.report.parts import options_argv
from fairseq_headprune.studies import shrink_sweep as sweep

HEADER = {"checkpoint_sha256": "abc", "data_fingerprint": "d1", "subset": "test",
          "decoding": {"generation": {"beam": 5}}}


def rows(methods=("michel", "full+out-proj+ffn"), removed=(10, 20, 30)):
    out = [{"key": "unpruned", "method": "unpruned", "removed": 0, "bleu": 30.0}]
    for i, m in enumerate(methods):
        for n in removed:
            bleu = 30.0 - n / 10 * (i + 1)
            out.append({"key": f"{m}:{n}", "method": m, "tag": "", "removed": n, "bleu": bleu, "delta": bleu - 30,
                        "removed_per_type": {"enc-self": n, "enc-dec": 0, "dec-self": 0}, "emptied": [],
                        "fallbacks": []})
    return out


def write_compare(path, header):
    lines = [{"header": header}, {"key": "baseline", "method": "unpruned", "bleu": 30.0, "heads_kept": 40},
             {"key": "l0:0.01", "method": "l0", "l0_lambda": 0.01, "heads_kept": 25, "bleu": 29.0},
             {"key": "l0:0", "method": "l0", "l0_lambda": 0, "heads_kept": 40, "bleu": 31.0}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def test_study_options_render_as_the_shrink_command():
    options = sweep.SweepStudyOptions(subset="test", sweep="25,50", sweep_methods="michel", calibration_sentences=64)
    assert options_argv(options) == ["--sweep", "25,50", "--sweep-methods", "michel", "--calibration-sentences", "64"]
    built = options.sweep_options()
    assert built.percents == (25.0, 50.0) and built.methods == ("michel",)
    assert built.shrink.calibration_sentences == 64 and built.shrink.calibration_subset == "valid"


@pytest.mark.parametrize("field, value", [("sweep", "0,50"), ("sweep", "50,100"), ("sweep", "x"), ("sweep", ""),
                                          ("sweep_methods", "michel,bogus"), ("sweep_methods", "fisher+wings"),
                                          ("sweep_methods", ","), ("calibration_sentences", 0)])
def test_bad_study_options_are_refused(field, value):
    options = sweep.SweepStudyOptions(**{"subset": "test", "sweep": "50", field: value})
    with pytest.raises(UserError):
        options.sweep_options()


def test_the_default_sweep_shows_the_shrink_commands_default_pipeline():
    """The shrink command's defaults are the method `full+out-proj+ffn+min1`: the sweep's last default method."""
    from fairseq_headprune.prune.shrink_options import ShrinkOptions, with_fit

    default = ShrinkOptions()
    method = sweep.method_options(sweep.DEFAULT_METHODS[-1], default)
    assert method.search == "full"  # a greedy fill, which has no rearrangement step to switch
    assert replace(method, rearrange=default.rearrange) == default
    # a method without the minimum step lets sublayers empty, and changes nothing else
    assert sweep.method_options("full+out-proj+ffn", default) == replace(method, min_heads=0)
    # the input maps are a step of their own, off unless named (whatever the base options say)
    assert sweep.method_options("full+out-proj+ffn+in+min1", default) == with_fit(method, refit_inputs=True)
    fitted = sweep.method_options("full+out-proj+ffn+min1", with_fit(default, refit_inputs=True))
    assert not fitted.reconstruction.refit_inputs


def test_tables_split_curves_candidates_and_l0():
    data = rows() + [{"key": "full+ffn+mild50:20", "method": "full+ffn+mild50", "tag": "", "removed": 20,
                      "bleu": 27.5, "delta": -2.5, "removed_per_type": {"enc-self": 20, "enc-dec": 0, "dec-self": 0},
                      "emptied": ["enc-self:1"], "fallbacks": ["x"]}]
    l0 = [{"l0_lambda": 0.01, "heads_kept": 25, "bleu": 29.0}]
    tables = sweep.tables(data, l0, heads_total=40)
    headers, body = tables["curves"]
    assert headers == ["heads removed", "michel", "full+out-proj+ffn"]
    assert body[0] == ["10 (25%)", "29.00 (-1.00)", "28.00 (-2.00)"] and len(body) == 3
    assert tables["candidates"][1] == [["full+ffn+mild50", "20", "27.50", "-2.50", "20/0/0", "enc-self:1", "1"]]
    assert tables["l0"][1] == [["0.01", "15 (38%)", "29.00", "-1.00"]]
    markdown = sweep.table(data, l0, heads_total=40)
    assert "| 30 (75%) | 27.00 (-3.00) | 24.00 (-6.00) |" in markdown


def test_l0_runs_only_beside_a_sweep_scored_like_them(tmp_path):
    same = write_compare(tmp_path / "same.jsonl", {"checkpoint_sha256": "abc", "data_fingerprint": "d1",
                                                   "subset": "test", "decoding": {"beam": 5}})
    assert [r["l0_lambda"] for r in sweep.l0_rows(same, HEADER)] == [0.01]  # λ = 0 is the control, not a point
    assert [r["l0_lambda"] for r in sweep.l0_rows(same)] == [0.01]
    for field, value in (("checkpoint_sha256", "other"), ("data_fingerprint", "d2"), ("subset", "valid")):
        other = write_compare(tmp_path / f"{field}.jsonl", {**json.loads(open(same).readline())["header"],
                                                            field: value})
        assert sweep.l0_rows(other, HEADER) == [], field
    beam1 = write_compare(tmp_path / "beam1.jsonl", {**json.loads(open(same).readline())["header"],
                                                     "decoding": {"beam": 1}})
    assert sweep.l0_rows(beam1, HEADER) == []
    assert sweep.l0_rows(str(tmp_path / "missing.jsonl"), HEADER) == []
