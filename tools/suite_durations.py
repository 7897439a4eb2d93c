"""The seconds each test file took, from a JUnit XML report of the suite, as tests/durations.json (the order in
which `make test` hands the files to its workers: longest first, tests/conftest.py).

    .venv/bin/python -m pytest -q -n 2 --dist loadfile tests --junitxml=report.xml
    .venv/bin/python tools/suite_durations.py report.xml > tests/durations.json

A test's time in the report is its setup, call and teardown together (pytest's default), so a fixture built once
per worker counts towards the first file that asks for it."""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path
from typing import Dict

ROOT = Path(__file__).resolve().parents[1]


def test_file(classname: str) -> str:
    """tests/test_x.py for a JUnit classname "tests.test_x" or "tests.test_x.SomeClass"."""
    parts = classname.split(".")
    for n in range(len(parts), 0, -1):
        path = "/".join(parts[:n]) + ".py"
        if (ROOT / path).is_file():
            return path
    raise ValueError(f"no test file for the JUnit classname {classname!r}")


def durations(report: str) -> Dict[str, float]:
    """Seconds per test file, longest first."""
    seconds: Dict[str, float] = defaultdict(float)
    for case in ElementTree.parse(report).iter("testcase"):
        seconds[test_file(case.get("classname", ""))] += float(case.get("time") or 0.0)
    return {path: round(s, 1) for path, s in sorted(seconds.items(), key=lambda item: -item[1])}


USAGE = "usage: tools/suite_durations.py REPORT.xml  (pytest --junitxml)"


def main(argv) -> int:
    if argv in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        table = durations(argv[0])
    except (OSError, ElementTree.ParseError, ValueError) as e:
        print(f"suite_durations: error: {argv[0]}: {e}", file=sys.stderr)
        return 2
    print(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
