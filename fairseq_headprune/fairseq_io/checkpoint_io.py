"""Writing a checkpoint and its JSON record as one pair: whole or not at all, one writer per output path.

    write_checkpoint_pair(out_path, write_fn, record=None, record_path=None, companions=None)
        -> (out_path, record_path or None)

`write_fn(path)` writes the checkpoint to the temporary file `path` (e.g. `lambda p: save_state(state, p)`);
`record` (a JSON-able dict) is written beside it, at `record_path` (default: OUT with its extension replaced by
.json; a record path that is the checkpoint itself is refused). Every writer of checkpoints here uses it (`shrink`,
`remove`, `recover`, `gates --fold-out`):

- `save_state` stores tied embeddings once and writes equal states as equal bytes (no temporary name inside the
  zip), so a rerun's checkpoint has the hash its records name;
- a lock on the output path (an flock on `.OUT.lock` beside it, released by the kernel when the process dies): a
  second process writing the same OUT stops with one line; re-entrant within a process (`recover` holds it for
  its whole run);
- both files are written to temporaries in the same folder and fsync'ed, then a journal (`.OUT.pair`) naming the
  two renames is written atomically, then both are renamed over their targets and the journal removed. A kill -9
  before the journal leaves the old pair (and temporaries, removed by the next writer of OUT); after it, the next
  writer of OUT finishes the renames first (`finish_pending`), so the pair it finds is the new one, never a mix;
- `record["checkpoint_sha256"]` is the written checkpoint's hash, so a record names the exact file it describes;
- `companions` ({path: text}) are files that belong to the checkpoint (a trimmed vocabulary's dict.LANG.txt): written
  and renamed with the pair, under the same journal.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import json
import os
import tempfile
from typing import Callable, Iterator, Mapping, Optional, Sequence, Tuple

from fairseq_headprune.errors import UserError
from fairseq_headprune.records.identity import file_sha256
from fairseq_headprune.records.log import write_json_atomic


def record_path_for(out_path: str, folder: Optional[str] = None) -> str:
    """Where a checkpoint's JSON record goes: OUT with its extension replaced by .json (in `folder` if given)."""
    stem = os.path.splitext(os.path.basename(out_path))[0]
    return os.path.join(folder or os.path.dirname(os.path.abspath(out_path)), stem + ".json")


def check_pair_paths(option: str, out_path: str, record_path: Optional[str]) -> None:
    """Refuse, before any work, a record that would be written over the checkpoint."""
    if record_path and os.path.abspath(record_path) == os.path.abspath(out_path):
        raise UserError(f"{option} {out_path}: its JSON record would be written over it; name the checkpoint .pt")


def _hidden(path: str, suffix: str) -> str:
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(folder, f".{name}{suffix}")


_HELD: dict = {}  # lock path -> (fd, depth): a process holding OUT's lock (recover's whole run) may write OUT


@contextlib.contextmanager
def output_lock(out_path: str, option: str = "--out") -> Iterator[None]:
    """One process writing `out_path` at a time, re-entrant within it (the lock file stays: removing it would race
    another writer)."""
    path = _hidden(out_path, ".lock")
    if path in _HELD:
        fd, depth = _HELD[path]
        _HELD[path] = (fd, depth + 1)
        try:
            yield
        finally:
            _HELD[path] = (fd, _HELD[path][1] - 1)
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EACCES):
                raise UserError(f"{option} {out_path} is being written by another fairseq-headprune process; wait "
                                "for it or write elsewhere") from None
            raise
        _HELD[path] = (fd, 1)
        try:
            yield
        finally:
            del _HELD[path]
    finally:
        os.close(fd)


def _fsync_folder(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def finish_pending(out_path: str, record_path: Optional[str] = None, others: Sequence[str] = ()) -> None:
    """Complete the renames of a writer of `out_path` killed after its journal (the new pair), then remove the
    temporaries of writers killed before it (the old pair stays; `others`: companion files' paths). Call under
    output_lock."""
    journal = _hidden(out_path, ".pair")
    if os.path.exists(journal):
        try:
            with open(journal, encoding="utf-8") as f:
                moves = json.load(f)["moves"]
        except (OSError, ValueError, KeyError):
            moves = []  # written atomically, so unreadable only if it is not ours: leave the files alone
        for tmp, target in moves:
            if os.path.exists(tmp):
                os.replace(tmp, target)
        _fsync_folder(out_path)
        os.unlink(journal)
    for target in (out_path, record_path or record_path_for(out_path), *others):
        for tmp in glob.glob(glob.escape(_hidden(target, ".")) + "*.tmp"):
            os.unlink(tmp)


def _temporary(target: str) -> str:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(target)),
                               prefix=f".{os.path.basename(target)}.", suffix=".tmp")
    os.close(fd)
    return tmp


def _sha256(path: str) -> str:
    return file_sha256(path)


def _write_text(path: str, text: str, umask: int) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(path, 0o666 & ~umask)


def write_checkpoint_pair(out_path: str, write_fn: Callable[[str], None], record: Optional[dict] = None,
                          record_path: Optional[str] = None, option: str = "--out",
                          companions: Optional[Mapping[str, str]] = None) -> Tuple[str, Optional[str]]:
    """Write the checkpoint (and its record, and its companion files) as described in the module docstring;
    returns the paths of the pair."""
    if record is not None:
        record_path = record_path or record_path_for(out_path)
        check_pair_paths(option, out_path, record_path)
    else:
        record_path = None
    companions = dict(companions or {})
    with output_lock(out_path, option):
        finish_pending(out_path, record_path, list(companions))
        temporaries = []
        try:
            tmp_ckpt = _temporary(out_path)
            temporaries.append(tmp_ckpt)
            write_fn(tmp_ckpt)
            with open(tmp_ckpt, "rb+") as f:
                os.fsync(f.fileno())
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp_ckpt, 0o666 & ~umask)  # mkstemp makes 0600; a checkpoint is an ordinary file
            moves = [(tmp_ckpt, os.path.abspath(out_path))]
            if record_path:
                tmp_record = _temporary(record_path)
                temporaries.append(tmp_record)
                with open(tmp_record, "w", encoding="utf-8") as f:
                    json.dump({**record, "checkpoint_sha256": _sha256(tmp_ckpt)}, f, indent=1)
                    f.write("\n")
                    f.flush()
                    os.fsync(f.fileno())
                os.chmod(tmp_record, 0o666 & ~umask)
                moves.append((tmp_record, os.path.abspath(record_path)))
            for path, text in companions.items():
                tmp = _temporary(path)
                temporaries.append(tmp)
                _write_text(tmp, text, umask)
                moves.append((tmp, os.path.abspath(path)))

            write_json_atomic(_hidden(out_path, ".pair"), {"moves": moves})  # from here on, the new pair
        except BaseException:
            for tmp in temporaries:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            raise
        finish_pending(out_path, record_path, list(companions))
    return out_path, record_path


# --------------------------------------------------------------------------------------------- what is written

# fairseq ties these when the model shares embeddings (--share-all-embeddings, --share-decoder-input-output-embed)
TIED_NAMES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight")


def shared_once(weights: dict) -> dict:
    """The state dict with equal tied embeddings as one tensor, so torch.save stores them once (a dtype cast or
    a copy per name would store a 50% pruned model's vocabulary three times, larger than its unpruned parent)."""
    import torch

    out = dict(weights)
    kept = []
    for name in TIED_NAMES:
        tensor = out.get(name)
        if not torch.is_tensor(tensor):
            continue
        same = next((t for t in kept if t.shape == tensor.shape and t.dtype == tensor.dtype
                     and (t.data_ptr() == tensor.data_ptr() or torch.equal(t, tensor))), None)
        if same is None:
            kept.append(tensor)
        else:
            out[name] = same
    return out


def save_state(state: dict, path: str) -> None:
    """torch.save of a checkpoint state, tied embeddings stored once, through a file object: torch names the zip's
    folder after the file otherwise, and a random temporary name would make equal states differ in bytes."""
    import torch

    if isinstance(state.get("model"), dict):
        state = {**state, "model": shared_once(state["model"])}
    with open(path, "wb") as f:
        torch.save(state, f)

