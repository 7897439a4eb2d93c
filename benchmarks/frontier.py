"""The speed/BLEU frontier of the models `compress` built: one table and one figure per folder of
runs, read from each run's compress.json (fairseq_headprune.studies.frontier; `report --compress-runs` shows it too).

  python benchmarks/frontier.py results/compress-de-en [results/compress-en-fr ...]

Writes FOLDER/frontier.md and FOLDER/frontier.png.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import List

logging.getLogger("matplotlib").setLevel(logging.WARNING)  # the package's import leaves the root logger at DEBUG
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.append(ROOT)


def main(folders: List[str]) -> int:
    from fairseq_headprune import plots
    from fairseq_headprune.records.log import atomic_output
    from fairseq_headprune.studies import frontier

    for folder in folders:
        found = frontier.rows(folder)
        if not found:
            print(f"{folder}: no */compress.json of a finished run", file=sys.stderr)
            return 2
        sets = frontier.reported_sets(found)
        text = (f"# The frontier of `compress` in {os.path.basename(folder.rstrip('/'))} (benchmarks/frontier.py)\n\n"
                f"{frontier.TEXT} {frontier.significance(found)}\n\n{frontier.markdown(found, sets)}\n\n"
                "![frontier](frontier.png)\n\n"
                f"{frontier.LEGEND}\n")
        table = frontier.controls_markdown(folder, sets)
        if table:
            text += ("\n## Controls\n\nThe unpruned model through a recovery with nothing removed, scored as the runs "
                     f"are (benchmarks/engine_bleu.py).\n\n{table}\n")
        with atomic_output(os.path.join(folder, "frontier.md")) as f:
            f.write(text)
        plots.compress_frontier(found, sets, frontier.controls(folder), os.path.join(folder, "frontier.png"))
        print(f"wrote {folder}/frontier.md and frontier.png ({len(found)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
