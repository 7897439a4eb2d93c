"""The order `make test` hands the test files to its workers: longest first, by tests/durations.json, which
tools/suite_durations.py writes from a JUnit report of the suite."""
import sys
from pathlib import Path
from types import SimpleNamespace

import conftest

sys.path.insert(0, str(conftest.ROOT / "tools"))
import suite_durations  # noqa: E402

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.test_cli" name="test_a" time="1.5"/>
<testcase classname="tests.test_compress" name="test_b" time="40.25"/>
<testcase classname="tests.test_cli" name="test_c" time="2.0"/>
<testcase classname="tests.test_translate.TestSomething" name="test_d" time="7"/>
</testsuite></testsuites>
"""


def test_the_durations_are_summed_per_file_longest_first(tmp_path):
    report = tmp_path / "report.xml"
    report.write_text(REPORT, encoding="utf-8")
    assert list(suite_durations.durations(str(report)).items()) == [
        ("tests/test_compress.py", 40.2), ("tests/test_translate.py", 7.0), ("tests/test_cli.py", 3.5)]


def test_a_report_it_cannot_read_is_one_line_and_exit_code_2(tmp_path, capsys):
    bad = tmp_path / "bad.xml"
    bad.write_text("<testsuites>", encoding="utf-8")
    for report in (bad, tmp_path / "missing.xml"):
        assert suite_durations.main([str(report)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"suite_durations: error: {report}: "), err
    assert suite_durations.main(["--help"]) == 0 and capsys.readouterr().out.startswith("usage: ")


def test_the_table_lists_every_test_file_and_nothing_else():
    files = {p.relative_to(conftest.ROOT).as_posix() for p in (conftest.ROOT / "tests").glob("test_*.py")}
    listed = set(conftest.DURATIONS)
    assert listed == files, ("tests/durations.json is out of date (tools/suite_durations.py writes it): "
                             f"missing {sorted(files - listed)}, stale {sorted(listed - files)}")
    assert all(seconds >= 0 for seconds in conftest.DURATIONS.values())


def test_the_longest_files_come_first_each_files_tests_together_in_their_order():
    longest = max(conftest.DURATIONS, key=conftest.DURATIONS.get)
    shortest = min(conftest.DURATIONS, key=conftest.DURATIONS.get)
    items = [SimpleNamespace(path=conftest.ROOT / path, name=name)
             for path, name in ((shortest, "a"), (longest, "b"), (shortest, "c"), ("tests/test_new.py", "d"),
                                (longest, "e"))]
    conftest.pytest_collection_modifyitems(None, None, items)
    assert [(Path(i.path).relative_to(conftest.ROOT).as_posix(), i.name) for i in items] == [
        (longest, "b"), (longest, "e"), ("tests/test_new.py", "d"), (shortest, "a"), (shortest, "c")]
