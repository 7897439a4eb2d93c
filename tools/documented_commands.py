"""The commands a Markdown document tells a user to run: its fenced ```bash blocks, continuation lines joined,
comments dropped. `tests/test_documented_commands_*.py` run them on tiny models; a recipe that runs one of them on
a real model (recipes/readme_compress_de_en.sh) takes it from here, so both run the line as written.

usage: python tools/documented_commands.py DOC.md [--starting PREFIX] [--assignments] [--set PLACEHOLDER=VALUE ...]
  prints each command (one a line) that starts with PREFIX, after the variable assignments (DEC=...) that precede
  it in the document when --assignments is given, each placeholder (DATA, model.pt, MODEL_DIR) replaced by VALUE."""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Dict, List

ASSIGNMENT = re.compile(r"[A-Z_]+=(\"[^\"]*\"|\S*)")


def fenced_commands(path: Path) -> List[str]:
    """The commands of a Markdown file's ```bash blocks: continuation lines joined, comments dropped."""
    commands, block = [], None
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if block is None:
            if line.strip() == "```bash":
                block = []
            continue
        if line.strip() == "```":
            text = "\n".join(block).replace("\\\n", " ")
            for command in text.splitlines():
                command = re.sub(r"(^|\s)#.*$", "", command).strip()
                if command:
                    commands.append(re.sub(r"\s+", " ", command))
            block = None
        else:
            block.append(line)
    return commands


def with_placeholders(command: str, values: Dict[str, str]) -> str:
    """The command with each placeholder (a whole word, not part of a path: DATA, model.pt, MODEL_DIR) replaced by
    its value, and nothing else changed."""
    for placeholder, value in values.items():
        command = re.sub(rf"(?<![\w/.]){re.escape(placeholder)}\b", lambda _, value=value: value, command)
    return command


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("document", type=Path)
    parser.add_argument("--starting", default="", help="only the commands that start with this")
    parser.add_argument("--assignments", action="store_true", help="each preceded by the assignments before it")
    parser.add_argument("--set", action="append", default=[], metavar="PLACEHOLDER=VALUE")
    args = parser.parse_args(argv)
    if any("=" not in pair for pair in args.set):
        print(f"documented_commands: --set takes PLACEHOLDER=VALUE: {args.set}", file=sys.stderr)
        return 2
    values = dict(pair.split("=", 1) for pair in args.set)
    if not args.document.is_file():
        print(f"documented_commands: no such document: {args.document}", file=sys.stderr)
        return 2
    assignments = []
    for command in fenced_commands(args.document):
        command = with_placeholders(command, values)
        if ASSIGNMENT.fullmatch(command):
            assignments.append(command)
        elif command.startswith(args.starting):
            print("\n".join([*assignments, command]) if args.assignments else command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
