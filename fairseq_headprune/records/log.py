"""Result files: written so that a crash never leaves a half-written file, read by one reader, and written by one
process per folder.

A results log is an append-only JSONL file whose first line is a header: the run identity the rows were computed
under (fairseq_headprune.records.identity). `read_log` is the only reader; `ResultsLog` the only writer;
`FolderLock` makes a second process writing into the same folder stop with one line.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import tempfile
from typing import IO, Any, Dict, Iterator, List, Optional, Tuple

from fairseq_headprune.errors import UserError
from fairseq_headprune.records.identity import describe_differences, upgrade_fingerprints


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


def read_json(path: Optional[str]) -> Optional[Any]:
    """A JSON result file, or None when there is none; a file that is not JSON is one line, not a traceback."""
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read {path}: {e}") from None


def read_log(path: str) -> Tuple[Dict, List[Dict]]:
    """(header, rows) of a results log. A torn last line (a run killed mid-write) is left out, never repaired here
    (the writer drops it when it reopens the file); any other line that is not JSON is an error."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    lines = data.split(b"\n")
    parsed = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            parsed.append(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError):
            if i == len(lines) - 1:  # torn last line: no newline after it
                break
            raise UserError(f"{path}: line {i + 1} is not JSON (not a results file of this tool?)") from None
    if not parsed or not isinstance(parsed[0], dict) or "header" not in parsed[0]:
        raise UserError(f"{path} is not a results file of this tool (no header line)")
    return parsed[0]["header"], parsed[1:]


LOCK_NAME = ".fairseq-headprune.lock"  # the file FolderLock holds in a results folder


class FolderLock:
    """One writing process per results folder (per shard of a sharded sweep): an exclusive `flock` on a file in
    the folder, released by the kernel when the process dies. Re-entrant within a process, so a report that runs
    several studies into one folder takes it once."""

    _held: Dict[str, Tuple[int, int]] = {}  # lock path -> (fd, depth)

    def __init__(self, folder: str, shard: Optional[Tuple[int, int]] = None, option: str = "--results-dir"):
        self.folder, self.option = folder, option  # option: the command's name for the folder, for its refusal
        name = LOCK_NAME + (f".shard-{shard[0]}-of-{shard[1]}" if shard and shard[1] > 1 else "")
        self.path = os.path.join(os.path.realpath(folder), name)

    def acquire(self) -> "FolderLock":
        ensure_writable_folder(self.folder)
        if self.path in FolderLock._held:
            fd, depth = FolderLock._held[self.path]
            FolderLock._held[self.path] = (fd, depth + 1)
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EACCES):
                raise UserError(f"{self.folder} is being written by another fairseq-headprune process; wait for it "
                                f"to finish or use another {self.option}") from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        FolderLock._held[self.path] = (fd, 1)
        return self

    def release(self) -> None:
        fd, depth = FolderLock._held[self.path]
        if depth > 1:
            FolderLock._held[self.path] = (fd, depth - 1)
            return
        del FolderLock._held[self.path]
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def ensure_writable_folder(folder: str) -> None:
    """The results folder exists (created if needed) and can be written: checked before any work starts."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise UserError(f"--results-dir {folder} is a file, not a folder")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create --results-dir {folder}: {e.strerror}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"--results-dir {folder} is not writable")


class ResultsLog:
    """An append-only JSONL file of result rows, tied to the run identity they were computed under.

    The first line is the header (the identity). Each row is appended and fsync'ed as soon as it is computed, so a
    killed sweep loses at most the row in progress; reopening with the same identity resumes (rows already there
    are skipped by the caller via `done`), and reopening with another identity is refused, naming every field that
    differs, rather than mixing results of two runs. A torn last line (a kill mid-write) is dropped.

    `confirm(fields)` checks identity fields known only later (a data fingerprint after loading, a study input
    used by some invocations only): a field the header lacks is added to it, one it holds must match.
    """

    def __init__(self, path: str, header: dict):
        self.path = path
        self.header = _plain(header)
        self.rows: list = []
        if os.path.exists(path) and os.path.getsize(path) > 0:
            self._load_existing()
        else:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._append({"header": self.header})

    def _load_existing(self) -> None:
        theirs, rows = read_log(self.path)
        with open(self.path, "rb") as f:
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        if len(complete) != len(data):  # drop a torn last line
            with open(self.path, "r+b") as f:
                f.truncate(len(complete))
        upgraded = upgrade_fingerprints(theirs)  # a file fingerprinted by its batches, read with the same batching
        # fields the file holds beyond ours were confirmed by other invocations (see confirm): not compared here
        self._refuse_if_different({k: v for k, v in upgraded.items() if k in self.header}, self.header)
        self.header, self.rows = upgraded, rows
        if upgraded != theirs:
            self._rewrite()

    def _refuse_if_different(self, theirs: dict, ours: dict) -> None:
        differences = describe_differences(theirs, ours)
        if differences:
            raise UserError(f"{self.path} holds results of another run ({'; '.join(differences)}); "
                            "use another --results-dir or delete the file")

    def confirm(self, fields: dict) -> None:
        fields = _plain(fields)
        self.header = upgrade_fingerprints(self.header)
        known = {k: v for k, v in fields.items() if k in self.header}
        self._refuse_if_different({k: self.header[k] for k in known}, known)
        new = {k: v for k, v in fields.items() if k not in self.header}
        if new:
            self.header = {**self.header, **new}
            self._rewrite()

    def _rewrite(self) -> None:
        with atomic_output(self.path) as f:
            for obj in [{"header": self.header}, *self.rows]:
                f.write(json.dumps(obj, sort_keys=True) + "\n")

    def note_run(self, info: dict) -> None:
        """Add `info` to the header's `runs` list: how one invocation computed its rows (masks per beam search,
        workers), which no row depends on. Not identity: a file's fields beyond a run's own are not compared."""
        self.header = {**self.header, "runs": [*self.header.get("runs", []), _plain(info)]}
        with atomic_output(self.path) as f:
            for obj in [{"header": self.header}, *self.rows]:
                f.write(json.dumps(obj, sort_keys=True) + "\n")

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


def _plain(obj: Any) -> Any:
    """The object as it reads back from JSON (tuples become lists), so headers compare equal across runs."""
    return json.loads(json.dumps(obj, sort_keys=True))
