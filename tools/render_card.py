"""Render the MODEL_CARD.md of finished `compress` runs again from their compress.json, without running anything.

    .venv/bin/python tools/render_card.py RUN_FOLDER... [--teacher-trained-on SUBSET[,SUBSET...]]

Each RUN_FOLDER holds a compress.json. The record's paths are made portable (OUT/..., DATA/..., file names), its
verdict is worded again, and --teacher-trained-on labels the --also-report sets the unpruned model was trained on
(as `compress --teacher-trained-on` does); then compress.json and MODEL_CARD.md are written again, each whole.
Runs recorded before compress measured the latency at batch 1 say it was not measured.
"""
from __future__ import annotations

import argparse
import os
import sys

from fairseq_headprune.compress import model_card
from fairseq_headprune.compress.options import comma_list
from fairseq_headprune.compress.stages.outputs import verdict
from fairseq_headprune.errors import UserError
from fairseq_headprune.records.log import atomic_output, read_json, write_json_atomic


def render(folder: str, teacher_trained_on=None) -> None:
    path = os.path.join(folder, "compress.json")
    record = read_json(path)
    if not record or "report" not in record.get("stages", {}):
        raise UserError(f"{path}: not a finished compress record")
    if teacher_trained_on is not None:
        also = [a["subset"] for a in record["stages"]["report"].get("also") or []]
        for subset in teacher_trained_on:
            if subset not in also:
                raise UserError(f"--teacher-trained-on {subset}: not a reported set of {path} ({', '.join(also)})")
        record["teacher_trained_on"] = list(teacher_trained_on)
    record["verdict"] = verdict(record)
    record = model_card.portable(record, record["options"]["out"], record["data"])
    card = model_card.render(record)  # rendered before anything is written
    write_json_atomic(path, record)
    with atomic_output(os.path.join(folder, "MODEL_CARD.md")) as f:
        f.write(card)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="+", metavar="RUN_FOLDER")
    parser.add_argument("--teacher-trained-on", type=comma_list, default=None, metavar="SUBSET[,SUBSET...]")
    args = parser.parse_args(argv)
    try:
        for folder in args.folders:
            render(folder, args.teacher_trained_on)
            print(f"wrote {folder.rstrip('/')}/MODEL_CARD.md")
    except UserError as e:
        print(f"render_card: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
