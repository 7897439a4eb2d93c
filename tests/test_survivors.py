"""`survivors`: the heads an L0 sweep keeps across λ, per type and layer, and the functions of the kept encoder
heads (files only: no model)."""
import json

import pytest

from fairseq_headprune.errors import UserError
from fairseq_headprune.studies.survivors import function_of, rows_of, run, survivor_row, table


def _gates(lam, enc, dec_self, updates=300):
    """A gates.json as `gates` writes it: 2 layers x 4 heads per type, gate matrices as given (enc-dec all open)."""
    return {"l0_lambda": lam, "updates": updates, "gated_types": ["enc-self", "enc-dec", "dec-self"], "total": 24,
            "heads": {"enc-self": {"gate": enc}, "enc-dec": {"gate": [[1.0] * 4, [1.0] * 4]},
                      "dec-self": {"gate": dec_self}}}


ANALYSIS = {"enc-self": [{"layer": 1, "heads": [{"head": 1, "labels": ["positional -1"]},
                                                {"head": 2, "labels": ["rare", "syntactic nsubj v->d"]},
                                                {"head": 3, "labels": ["rare"]}, {"head": 4, "labels": []}]},
                         {"layer": 2, "heads": [{"head": h, "labels": []} for h in range(1, 5)]}]}


def test_a_head_counts_under_its_first_function():
    assert function_of(["rare", "positional +1"]) == "positional"
    assert function_of(["rare", "syntactic amod d->v"]) == "syntactic"
    assert function_of(["rare"]) == "rare" and function_of([]) == "none"


def test_kept_heads_per_type_layer_and_function():
    from fairseq_headprune.studies.survivors import encoder_functions

    row = survivor_row(_gates(0.01, [[0.0, 0.5, 0.0, 1.0], [0.0, 0.0, 0.0, 0.2]], [[1.0, 0, 0, 0], [0, 0, 0, 0]]),
                       encoder_functions(ANALYSIS))
    assert row["kept_per_layer"] == {"enc-self": [2, 1], "enc-dec": [4, 4], "dec-self": [1, 0]}
    assert row["kept_per_type"] == {"enc-self": 3, "enc-dec": 8, "dec-self": 1} and row["kept"] == 12
    assert row["heads_per_type"] == {"enc-self": 8, "enc-dec": 8, "dec-self": 8}
    # kept encoder heads: (1,2) syntactic (its first function), (1,4) none, (2,4) none; positional (1,1) closed
    assert row["functions_kept"] == {"positional": 0, "syntactic": 1, "rare": 0, "none": 2}
    assert row["functions_all"] == {"positional": 1, "syntactic": 1, "rare": 1, "none": 5}


def test_rows_by_lambda_and_runs_of_another_length_refused(tmp_path):
    files = []
    for lam, updates in ((0.02, 300), (0.0, 300), (0.01, 300)):
        files.append(tmp_path / f"{lam}.json")
        files[-1].write_text(json.dumps(_gates(lam, [[1.0] * 4] * 2, [[1.0] * 4] * 2, updates)))
    rows = rows_of([str(f) for f in files], None)
    assert [r["l0_lambda"] for r in rows] == [0.0, 0.01, 0.02] and "functions_kept" not in rows[0]
    assert "| 0.01 | 24/24 | 8/8 | 8/8 | 8/8 | 4 4 | 4 4 | 4 4 |" in table(rows)
    other = tmp_path / "longer.json"
    other.write_text(json.dumps(_gates(0.05, [[1.0] * 4] * 2, [[1.0] * 4] * 2, 600)))
    with pytest.raises(UserError, match="different lengths"):
        rows_of([str(files[0]), str(other)], None)


def test_the_command_writes_table_and_figure_and_refuses_bad_files_in_one_line(tmp_path):
    from conftest import run

    gates = tmp_path / "gates.json"
    gates.write_text(json.dumps(_gates(0.01, [[0.0, 0.5, 0.0, 1.0], [0.0] * 4], [[1.0] * 4] * 2)))
    analysis = tmp_path / "heads_analysis.json"
    analysis.write_text(json.dumps(ANALYSIS))
    out = tmp_path / "out"
    run(["fairseq-headprune", "survivors", gates, "--analysis", analysis, "--results-dir", out])
    md = (out / "survivors.md").read_text()
    assert "| 0.01 | 0/1 | 1/1 | 0/1 | 1/5 |" in md and (out / "survivors.png").stat().st_size > 1000
    for bad, needle in ((["--analysis", gates], "not a heads_analysis.json"), ([], None)):
        broken = tmp_path / "broken.json"
        broken.write_text("{not json")
        args = [broken] + bad if needle is None else [gates] + bad
        proc = run(["fairseq-headprune", "survivors", *args, "--results-dir", out], check=False)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert (needle or "cannot read") in proc.stderr


def test_functions_the_analysis_did_not_measure_are_left_out(tmp_path):
    """An analysis without a source parse skipped syntactic functions: no head is shown as 'not syntactic'."""
    gates = tmp_path / "gates.json"
    gates.write_text(json.dumps(_gates(0.01, [[0.0, 0.5, 0.0, 1.0], [0.0] * 4], [[1.0] * 4] * 2)))
    analysis = tmp_path / "heads_analysis.json"
    analysis.write_text(json.dumps({**ANALYSIS, "meta": {"syntactic": {"skipped": "no --source-parses given"}}}))
    md = open(run([str(gates)], str(analysis), str(tmp_path))[0]).read()
    assert "| λ | positional | rare | none |" in md and "syntactic functions not measured" in md
    assert "syntactic |" not in md
    analysis.write_text(json.dumps({**ANALYSIS, "meta": {"syntactic": {"relations": {}}}}))
    parsed = open(run([str(gates)], str(analysis), str(tmp_path))[0]).read()
    assert "| λ | positional | syntactic | rare | none |" in parsed
