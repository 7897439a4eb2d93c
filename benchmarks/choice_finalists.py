"""The finalists a compress choice timed, side by side for several choices: each finalist's shape, its predicted and
timed speed-up (95% interval), the verdict against the target and the calibration NLL after shrink's closed-form
fits where the pick computed it; the winner marked. Reads each choice stage's record (OUT/stages/choice/stage.json,
or a copy of it) and writes one markdown table per record.

  python benchmarks/choice_finalists.py OUT.md NAME=STAGE_JSON [NAME=STAGE_JSON ...]
"""
from __future__ import annotations

import json
import os
import sys
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.append(ROOT)


def table(name: str, result: Dict) -> List[str]:
    """One choice's finalists as markdown lines."""
    from fairseq_headprune.compress.choice import Candidate, label

    chosen = label(Candidate.of(result["chosen"]))
    lines = [f"## {name}", "", f"Chosen: **{chosen}**. Rule: {result['chosen_by']}.", "",
             "| finalist | predicted | timed (95% interval) | verdict | NLL after the fits |",
             "|---|---|---|---|---|"]
    for p in sorted(result["timed"], key=lambda p: -p["measured_speedup"]):
        interval = p.get("measured_interval") or {}
        timed = f"{p['measured_speedup']:.2f}x" + (f" ({interval['low']:.2f}-{interval['high']:.2f})"
                                                  if "low" in interval else "")
        nll = f"{p['calibration_nll']:.4f}" if "calibration_nll" in p else \
            (f"passed over for {p['passed_over_for']}" if p.get("passed_over_for") else "")
        name = label(Candidate.of(p))
        mark = "**" if name == chosen else ""
        lines.append(f"| {mark}{name}{mark} | {p['predicted_speedup']:.2f}x | {timed} | {p.get('verdict', '')} "
                     f"| {nll} |")
    return lines + [""]


def main(argv: List[str]) -> int:
    if len(argv) < 2 or any("=" not in a for a in argv[1:]):
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    from fairseq_headprune.records.log import atomic_output

    out = ["# The finalists of compress choices (benchmarks/choice_finalists.py)", ""]
    for item in argv[1:]:
        name, path = item.split("=", 1)
        with open(path, encoding="utf-8") as f:
            out += table(name, json.load(f)["result"])
    with atomic_output(argv[0]) as f:
        f.write("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
