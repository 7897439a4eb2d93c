"""The recovery run elsewhere. --stop-after shrink writes OUT/recovery-run/: the recovery's script and every file it
reads (the shrunk model, the unpruned model it distils from, the data files of the subsets it trains and
validates on, any other file its options name), listed in inputs.json, the script's paths relative to its own
folder; so the folder, copied to a GPU machine, runs there from any directory, and fairseq-train writes its
checkpoints beside it. --recovered then adopts the best of them once it is checked to be a student of this run's
shrink (compress.stages.recover)."""
from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
from typing import Callable, Dict, List

from fairseq_headprune.compress.stages.contract import Context, Results
from fairseq_headprune.compress.stages.common import split_subsets
from fairseq_headprune.compress.stages.results import Shrunk
from fairseq_headprune.compress.stages.recovery import INPUTS, recover_key, recover_options, recovery_argv, recovery_set
from fairseq_headprune.fairseq_io.loading import PACKAGE_DIR
from fairseq_headprune.records.log import atomic_output, read_json, write_json_atomic
from fairseq_headprune.records.run_folder import within

FOLDER, SCRIPT = "recovery-run", "recovery-run.sh"  # OUT/recovery-run/recovery-run.sh
STUDENT, TEACHER, FILES = "student.pt", "teacher.pt", "files"
SUBSET_FILE = re.compile(r"\.[^.]+-[^.]+\.[^.]+(\.bin|\.idx)?")  # after the subset's name: .SRC-TGT.LANG[.bin|.idx]
SCRIPT_HEAD = """#!/bin/sh
# compress's recovery, as its recover stage would run it, reading only the files of this folder (inputs.json lists
# them): copy the folder to the machine that trains (fairseq and this package installed there), run this script
# from any directory; fairseq-train writes its checkpoints here (checkpoint_best.pt: for compress --recovered).
# "$@": more fairseq-train options (--distributed-world-size N, ...); $PYTHON: the Python that has this package.
here=$(cd "$(dirname "$0")" && pwd) || exit 2
# the package's folder, found without importing it (that would import torch and fairseq first)
user_dir=$("${PYTHON:-python3}" -c 'import sys, importlib.util as u; s = u.find_spec("fairseq_headprune")
sys.exit("fairseq_headprune is not installed for this Python") if s is None else print(s.submodule_search_locations[0])'
) || exit 2
"""
FORWARDER = """#!/bin/sh
# compress's recovery: recovery-run/recovery-run.sh, in the folder that holds every file it reads
exec sh "$(dirname "$0")/recovery-run/recovery-run.sh" "$@"
"""


def link(source: str, target: str) -> None:
    """`target` made the file `source` is: a hard link, or across file systems a link to its real path."""
    real = os.path.realpath(source)
    if os.path.lexists(target):
        os.remove(target)
    try:
        os.link(real, target)
    except OSError:
        os.symlink(real, target)


def subset_of(name: str, subsets: List[str]) -> str:
    """The subset a data file belongs to: its name's first part, without the digits of fairseq's further parts of
    a subset (train1, train2, ... beside train) unless the part is itself one of `subsets`."""
    first = name.split(".")[0]
    return first if first in subsets else re.sub(r"\d+$", "", first)


def data_files(folder: str, subsets: List[str]) -> List[str]:
    """The files of a data folder a fairseq training on `subsets` reads: each subset's SUBSET.SRC-TGT.LANG files
    (binarised or raw), and every file no subset holds (dictionaries, language lists); not the other subsets'
    files, nor the subsets' text beside them (train.bpe.de)."""
    names = sorted(n for n in os.listdir(folder) if os.path.isfile(os.path.join(folder, n)))
    binarised = {subset_of(n, subsets) for n in names if n.endswith(".bin")}
    return [n for n in names if (SUBSET_FILE.fullmatch(n[len(n.split(".")[0]):]) if subset_of(n, subsets) in subsets
                                 else subset_of(n, subsets) not in binarised)]


def place_data(data: str, subsets: List[str], place: str) -> Dict[str, List[str]]:
    """The recovery's data folder linked into place/data (each folder of a sharded DATA into place/data-N):
    {folder's name there: its files}."""
    folders = data.split(os.pathsep)
    placed = {}
    for i, folder in enumerate(folders):
        name = "data" if len(folders) == 1 else f"data-{i + 1}"
        target = os.path.join(place, name)
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(target)
        placed[name] = data_files(folder, subsets)
        for file in placed[name]:
            link(os.path.join(folder, file), os.path.join(target, file))
    return placed


def place_named_files(argv: List[str], place: str) -> List[str]:
    """The arguments with every other file they name by its absolute path (a BPE's codes, a language list) linked
    into place/files/ and named there."""
    files = os.path.join(place, FILES)
    shutil.rmtree(files, ignore_errors=True)
    out = []
    for token in argv:
        if os.path.isabs(token) and os.path.isfile(token) and within(token, place) is None:
            os.makedirs(files, exist_ok=True)
            placed = os.path.join(files, f"{len(os.listdir(files)) + 1}-{os.path.basename(token)}")
            link(token, placed)
            token = placed
        out.append(token)
    return out


def in_double_quotes(text: str) -> str:
    return "".join("\\" + c if c in '\\"$`' else c for c in text)


def shell_word(token: str, place: str) -> str:
    """An argument as the script writes it: a path inside the folder as "$here/...", the package's folder as
    "$user_dir", anything else quoted as it is."""
    if token == PACKAGE_DIR:
        return '"$user_dir"'
    parts = token.split(os.pathsep)
    inside = [within(p, place) if os.path.isabs(p) else None for p in parts]
    if all(i is None for i in inside):
        return shlex.quote(token)
    return '"' + os.pathsep.join(in_double_quotes(p) if i is None else
                                 "$here" + ("" if i == "." else "/" + in_double_quotes(i))
                                 for p, i in zip(parts, inside)) + '"'


def script_text(argv: List[str], place: str) -> str:
    return SCRIPT_HEAD + "exec fairseq-train " + " ".join(shell_word(t, place) for t in argv) + ' "$@"\n'


def clear_if_stale(place: str, key: Dict, log: Callable) -> None:
    """A folder written for another recovery (another student, teacher or options) is removed whole, the
    checkpoints of that recovery with it."""
    held = read_json(os.path.join(place, INPUTS))
    if held and held.get("run") != key:
        shutil.rmtree(place)
        log(f"{place}: written for another recovery (another shrink or recovery options): replaced, with its "
            "checkpoints")


def write_folder(loaded, options, data: str, shrunk: Shrunk, key: Dict, log: Callable) -> str:
    """--stop-after shrink: OUT/recovery-run/ (the script, the student, the teacher, the data, inputs.json last)
    and OUT/recovery-run.sh running its script; the command printed as it runs here. Returns the folder."""
    out = os.path.abspath(options.out)
    place = os.path.join(out, FOLDER)
    clear_if_stale(place, key, log)
    os.makedirs(place, exist_ok=True)
    student, teacher = os.path.join(place, STUDENT), os.path.join(place, TEACHER)
    link(shrunk.checkpoint, student)
    train_subset, valid_subset, _ = split_subsets(options.train_options)
    placed = place_data(data, [train_subset, *valid_subset.split(",")], place)
    settings = dataclasses.replace(recover_options(loaded, options, os.path.join(place, "model.pt"), place,
                                                   shrunk.layers), teacher=teacher)
    argv, _ = recovery_argv(loaded, options, os.pathsep.join(os.path.join(place, n) for n in placed), student,
                            settings)
    argv = place_named_files(argv, place)
    if "--teacher-path" in argv:
        link(loaded.checkpoint, teacher)
    elif os.path.lexists(teacher):
        os.remove(teacher)
    with atomic_output(os.path.join(place, SCRIPT)) as f:
        f.write(script_text(argv, place))
    os.chmod(os.path.join(place, SCRIPT), 0o755)
    with atomic_output(os.path.join(out, SCRIPT)) as f:
        f.write(FORWARDER)
    os.chmod(os.path.join(out, SCRIPT), 0o755)
    files = sorted(os.path.relpath(os.path.join(root, n), place) for root, _, names in os.walk(place) for n in names
                   if n != INPUTS and not n.startswith("checkpoint"))
    write_json_atomic(os.path.join(place, INPUTS), {"run": key, "student_sha256": shrunk.checkpoint_sha256,
                                                     "script": SCRIPT, "files": files, "data": placed})
    best = os.path.join(place, "checkpoint_best.pt")
    log(f"the recovery, to run here or elsewhere (GPUs: --distributed-world-size N; a cluster: its fairseq-train "
        f"under torchrun or srun): {place}/ holds its script {SCRIPT} and every file it reads; copy that folder "
        f"to the machine that trains and run `sh {FOLDER}/{SCRIPT}` there, or here (`sh {out}/{SCRIPT}`):\n  "
        f"fairseq-train {shlex.join(argv)}\nthen the same compress command with --recovered {best} (copied back "
        "from where it ran) goes on from its result")
    return place


def left_at_stop(context: Context, results: Results) -> None:
    """The shrink stage's result held under --stop-after shrink (with a recovery to run): OUT/recovery-run/."""
    o = context.options
    if o.stop_after != "shrink" or not o.budget_epochs:
        return
    data, sample = recovery_set(context.loaded, o, results.get("choice"), context.stages_root, context.log)
    key = recover_key(context.loaded, o, results["shrink"].checkpoint_sha256, sample)
    write_folder(context.loaded, o, data, results["shrink"], key, context.log)
