"""Checkpoint writers (shrink, remove, gates --fold-out) write a checkpoint and its record as one pair: once,
atomically, under a lock on the output path; a writer killed with SIGKILL at any moment leaves the old pair or (after
the next writer of the path completes its journal) the new pair, never a mix, and its temporaries are removed."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ENV
from fairseq_headprune.fairseq_io.checkpoint_io import finish_pending, output_lock, write_checkpoint_pair
from fairseq_headprune.errors import UserError
from fairseq_headprune.records.identity import file_sha256

# a writer in another process, this package's checkpoint_io alone (its __init__ would import fairseq and torch)
WRITER = """
import os, signal, sys, types
package = types.ModuleType('fairseq_headprune'); package.__path__ = [sys.argv[1]]
sys.modules['fairseq_headprune'] = package
from fairseq_headprune.fairseq_io import checkpoint_io
out, content, die_at = sys.argv[2], sys.argv[3], sys.argv[4]
real_replace, renames = os.replace, []
def replace(a, b):
    real_replace(a, b)
    renames.append(b)
    if die_at == 'between-renames' and len(renames) == 2:  # the journal's rename, then the checkpoint's
        os.kill(os.getpid(), signal.SIGKILL)
checkpoint_io.os.replace = replace
def write(path):
    with open(path, 'w') as f:
        f.write(content[: len(content) // 2])
        if die_at == 'writing':
            f.flush(); os.kill(os.getpid(), signal.SIGKILL)
        f.write(content[len(content) // 2:])
checkpoint_io.write_checkpoint_pair(out, write, {'content': content})
"""


def writer(out, content, die_at="never"):
    import fairseq_headprune

    return subprocess.run([sys.executable, "-c", WRITER, os.path.dirname(fairseq_headprune.__file__), str(out),
                           content, die_at], env=ENV, capture_output=True, text=True)


def pair(out):
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["checkpoint_sha256"] == file_sha256(str(out)), "the record names the file beside it"
    return out.read_text(), record["content"]


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp") or p.name.endswith(".pair"))


def test_a_pair_is_written_whole_with_the_checkpoints_hash(tmp_path):
    out = tmp_path / "model.pt"
    assert write_checkpoint_pair(str(out), lambda p: open(p, "w").write("weights"), {"content": "weights"}) == (
        str(out), str(tmp_path / "model.json"))
    assert pair(out) == ("weights", "weights")
    assert leftovers(tmp_path) == []


def test_a_record_that_would_overwrite_its_checkpoint_is_refused(tmp_path):
    with pytest.raises(UserError, match="would be written over it"):
        write_checkpoint_pair(str(tmp_path / "model.json"), lambda p: None, {"x": 1})
    assert list(tmp_path.iterdir()) == []


def test_a_second_writer_of_the_same_path_is_refused(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "model.pt"
    holder = subprocess.Popen([sys.executable, "-c", (  # another process writing OUT
        "import sys, time\nfrom fairseq_headprune.fairseq_io.checkpoint_io import output_lock\n"
        f"with output_lock({str(out)!r}):\n    print('held', flush=True)\n    time.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match="being written by another fairseq-headprune process"):
            write_checkpoint_pair(str(out), lambda p: open(p, "w").write("x"), {"content": "x"})
    finally:
        holder.kill()
        holder.wait()
    assert not out.exists()
    with output_lock(str(out)):  # the process holding OUT's lock (recover, for its whole run) writes it
        write_checkpoint_pair(str(out), lambda p: open(p, "w").write("x"), {"content": "x"})
    assert out.read_text() == "x"


@pytest.mark.parametrize("die_at, expected", [("writing", "old"), ("between-renames", "new")])
def test_a_writer_killed_leaves_the_old_pair_or_the_new_one_never_a_mix(tmp_path, die_at, expected):
    out = tmp_path / "model.pt"
    assert writer(out, "old-weights").returncode == 0
    proc = writer(out, "new-weights", die_at)
    assert proc.returncode == -9, proc.stderr
    if die_at == "between-renames":  # the new checkpoint is in place, the record not yet: the journal says so
        assert leftovers(tmp_path) != []
    finish_pending(str(out))  # what the next writer of the path does first
    assert pair(out) == ((f"{expected}-weights",) * 2)
    assert leftovers(tmp_path) == [], "the killed writer's temporaries are removed"
    assert writer(out, "newer-weights").returncode == 0
    assert pair(out) == ("newer-weights", "newer-weights") and leftovers(tmp_path) == []
