"""Writing results so that a crash never leaves a half-written file."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import IO, Any, Iterator


@contextlib.contextmanager
def atomic_output(path: str, mode: str = "w") -> Iterator[IO]:
    """A file to write `path` through: a temporary file in the same folder, fsync'ed and renamed over `path`
    when the block ends, removed if it raises."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; results are ordinary files for their readers
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str, obj: Any) -> None:
    with atomic_output(path) as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


class ResultsLog:
    """An append-only JSONL file of result rows, tied to what they were computed from.

    The first line is a header (model hash, data fingerprint, options). Each row is appended and fsync'ed as
    soon as it is computed, so a killed sweep loses at most the row in progress; reopening with the same
    header resumes (rows already there are skipped by the caller via `done`), and reopening with another
    header is refused rather than mixing results of two runs. A torn last line (a kill mid-write) is dropped.
    """

    def __init__(self, path: str, header: dict):
        self.path = path
        self.header = header
        self.rows: list = []
        if os.path.exists(path) and os.path.getsize(path) > 0:
            self._load_existing()
        else:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._append({"header": header})

    def _load_existing(self) -> None:
        from fairseq_headprune.errors import UserError

        with open(self.path, "rb") as f:
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        if len(complete) != len(data):  # drop a torn last line
            with open(self.path, "r+b") as f:
                f.truncate(len(complete))
        lines = [json.loads(line) for line in complete.decode("utf-8").splitlines() if line.strip()]
        if not lines or "header" not in lines[0]:
            raise UserError(f"{self.path} is not a results file of this tool (no header line)")
        theirs = lines[0]["header"]
        for key, value in self.header.items():
            if theirs.get(key) != value:
                raise UserError(
                    f"{self.path} holds results of another run ({key}: {theirs.get(key)!r} there, {value!r} now); "
                    "use another --results-dir or delete the file"
                )
        self.rows = lines[1:]

    def _append(self, obj: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(obj, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def done(self, key_field: str = "key") -> set:
        return {row[key_field] for row in self.rows}

    def append(self, row: dict) -> None:
        self._append(row)
        self.rows.append(row)
