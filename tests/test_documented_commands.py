"""Every command README.md and docs/*.md tell a user to run (their fenced `bash` blocks) runs here as written, on the
tiny model and data: the placeholders (DATA, model.pt, MODEL_DIR) replaced by fixtures, nothing else. A documented
line that stops working, or a new one, fails this test. A usage synopsis ([optional] options, A|B, ...) is a `text`
block: it is not a command anybody can run as written."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from documented_commands import ASSIGNMENT, fenced_commands, with_placeholders  # noqa: E402

from conftest import (BIN, ENV, ROOT, SLICE, _cached_data, _data_key, build_key, cached_build, copy_cached, run_fairseq,
                      train)

DOCUMENTS = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
M2M_GENERATE = ("fairseq-generate data-bin --path 418M_last_checkpoint.pt --user-dir fairseq_headprune --task "
                "translation_multi_simple_epoch_headprune --mask-heads enc-dec:12:1-16,dec-self:3:5+9 --lang-pairs "
                "language_pairs_small_models.txt --fixed-dictionary model_dict.128k.txt --encoder-langtok src "
                "--decoder-langtok -s de -t fr --remove-bpe sentencepiece --beam 5")
M2M_SCORE = ("fairseq-headprune score data-bin --path 418M_last_checkpoint.pt --results-dir DIR --gen-subset valid "
             "--task translation_multi_simple_epoch --lang-pairs language_pairs_small_models.txt --fixed-dictionary "
             "model_dict.128k.txt --encoder-langtok src --decoder-langtok -s de -t fr --bpe sentencepiece "
             "--sentencepiece-model spm.128k.model")
# lines of those blocks not run here, and why (each must still be in its document: a stale entry fails the test)
NOT_RUN = {
    "make demo": "the bundled model's whole study (minutes of CPU); its parts are the report's, run below on the tiny "
                 "model",
    "make test": "runs this very suite",
    "MULTI30K=DIR recipes/compress_de_en.sh": "the bundled model's compression, about 50 CPU minutes and the "
                                              "Multi30k corpus; the compress line below is its command "
                                              "(recipes/readme_compress_de_en.sh runs it on the bundled model)",
    "recipes/voita_l0.sh": "the L0 gates' lambda sweep on the bundled model, hours of CPU; tests/test_gates.py trains "
                           "the gates on the tiny model",
    M2M_GENERATE: "M2M-100 418M's released checkpoint and files, which cannot be had here; tests/test_families.py "
                  "runs the same task, mask and options on a tiny model of its task and shape",
    M2M_SCORE: "as the line above",
}


def as_run_here(command: str, data: Path, checkpoint: Path, study_checkpoint: Path) -> str:
    """The command with its placeholders replaced by the fixtures (and nothing else changed). model.pt is the deep
    decoder (compress reaches its documented speed-up), or for the whole study (`report`) the stock tiny model: the
    deep decoder's 68 heads in sublayers of 4 leave 51 removable, fewer than report's shrink sweep asks at 80%
    (refused in one line)."""
    model = study_checkpoint if command.startswith("fairseq-headprune report ") else checkpoint
    # MODEL_DIR: the model's folder, for its BPE codes
    return with_placeholders(command, {"DATA": str(data), "MODEL_DIR": str(data), "model.pt": str(model)})


# model.pt: a tiny model trained for seconds whose decoder holds most of its decoding time (8 layers over one
# encoder layer), so that a documented `--speedup 1.5` is reachable on any machine: the stock tiny model's decoding
# time is mostly per-step overhead, which no shape removes, and its targets are refused
DEEP_DECODER = [
    "--arch", "transformer", "--share-all-embeddings",
    "--encoder-layers", "1", "--encoder-attention-heads", "4",
    "--decoder-layers", "8", "--decoder-attention-heads", "4",
    "--encoder-embed-dim", "64", "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128",
    "--decoder-ffn-embed-dim", "128",
]


# trained longer than the other tiny models: at their 120 updates (valid perplexity about 170) 4 of the 48 test
# sentences came out differently from CTranslate2 float32 and fairseq at beam 5, more than the export check allows
DEEP_UPDATES = 1000


@pytest.fixture(scope="module")
def deep_decoder_checkpoint(tmp_path_factory) -> Path:
    key = (_data_key() + build_key(train)
           + hashlib.sha256(repr((DEEP_DECODER, DEEP_UPDATES)).encode()).hexdigest()[:8])
    cached = cached_build("deep-decoder", key,
                          lambda out: train(_cached_data(), out, updates=DEEP_UPDATES, arch=DEEP_DECODER))
    return copy_cached(cached, tmp_path_factory.mktemp("deep")) / "checkpoint_last.pt"


SENTENCES = 48  # of valid and test in the DATA fixture: every command reads them whole, some many times
TRAIN_PAIRS = 600  # of train: the calibration's 1000 sentences and the recovery's epochs read all of them


def data_fixture(tiny_data: Path, out: Path) -> Path:
    """DATA as the README describes it (binarised with the model's dictionaries, train, valid and test, the raw
    test references as DATA/test.raw.en) and MODEL_DIR (its BPE codes): the tiny data, train cut to its first
    TRAIN_PAIRS pairs, valid and test to their first SENTENCES sentences."""
    out.mkdir()
    for path in tiny_data.iterdir():
        if path.name.startswith("dict.") or path.name == "code":
            shutil.copyfile(path, out / path.name)
    for split, n in (("train", TRAIN_PAIRS), ("valid", SENTENCES), ("test", SENTENCES)):
        for lang in ("de", "en"):
            lines = (tiny_data / f"{split}.bpe.{lang}").read_text(encoding="utf-8").splitlines()[:n]
            (out / f"{split}.bpe.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run_fairseq(["fairseq-preprocess", "--source-lang", "de", "--target-lang", "en",
                 "--srcdict", tiny_data / "dict.de.txt", "--tgtdict", tiny_data / "dict.en.txt",
                 "--trainpref", out / "train.bpe", "--validpref", out / "valid.bpe", "--testpref", out / "test.bpe",
                 "--destdir", out, "--workers", "1"])
    raw = (SLICE / "test.en").read_text(encoding="utf-8").splitlines()[:SENTENCES]
    (out / "test.raw.en").write_text("\n".join(raw) + "\n", encoding="utf-8")  # as encode-for-model.sh keeps it
    return out


def test_the_commands_of_readme_and_docs_run_as_written(tiny_data, stock_checkpoint, deep_decoder_checkpoint, tmp_path):
    data = data_fixture(tiny_data, tmp_path / "data")
    work = tmp_path / "work"  # the user's folder: relative outputs (small/, study/) land here
    work.mkdir()
    raw = (SLICE / "test.de").read_text(encoding="utf-8").splitlines()[:5]
    (work / "raw.de").write_text("\n".join(raw) + "\n", encoding="utf-8")  # the user's raw text for `translate`
    (work / "fairseq_headprune").symlink_to(ROOT / "fairseq_headprune")  # --user-dir fairseq_headprune, from a clone
    env = {**ENV, "PATH": f"{BIN}{os.pathsep}{ENV.get('PATH', '')}", "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT)}
    found = {doc: fenced_commands(ROOT / doc) for doc in DOCUMENTS}
    every = [c for commands in found.values() for c in commands]
    assert set(NOT_RUN) <= set(every), sorted(set(NOT_RUN) - set(every))
    ran = []
    for commands in found.values():
        assignments = []  # DEC=...: a variable the following commands read, as in the user's shell
        for command in commands:
            if command in NOT_RUN:
                continue
            line = as_run_here(command, data, deep_decoder_checkpoint, stock_checkpoint)
            if ASSIGNMENT.fullmatch(line):
                assignments.append(line)
                continue
            before = tree(work)
            proc = subprocess.run(["bash", "-c", "\n".join([*assignments, line])], cwd=work, env=env,
                                  capture_output=True, text=True)
            check_outcome(command, proc, work)
            if "--dry-run" in command.split():
                assert tree(work) == before  # the plan only: nothing written
            ran.append(command)
    assert len(ran) >= 10, ran  # report, compress, fairseq-generate, translate, and compress.md's own


def tree(folder: Path) -> dict:
    """Every file under a folder (links to folders not followed) with its size and modification time."""
    files = [Path(root) / name for root, _, names in os.walk(folder) for name in names]
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in files if p.is_file()}


def check_outcome(command: str, proc: subprocess.CompletedProcess, work: Path) -> None:
    """What each documented command promises, on the tiny model."""
    where = f"{command}\n{proc.stderr[-3000:]}"
    words = command.split()
    if words[:2] == ["fairseq-headprune", "compress"]:
        out = work / words[words.index("--out") + 1]
        if "--dry-run" in words:
            assert proc.returncode == 0 and "fairseq-train " in proc.stdout, where
            return
        if "--stop-after" in words:
            assert proc.returncode == 0, where
            return
        if proc.returncode == 2 and "--max-bleu-loss" in words:  # a bound even the mildest shape misses
            last = proc.stderr.strip().splitlines()[-1]  # after the stages' progress bars: the one-line refusal
            assert last.startswith("fairseq-headprune compress: error: --max-bleu-loss") and \
                "even the mildest shape" in last and "Traceback" not in proc.stderr, where
            return
        if proc.returncode == 2:  # a target no shape of the tiny model reaches: refused, each row decided
            assert "no shape reaches it" in proc.stderr, where
            table = json.loads((out / "stages" / "cost-table" / "stage.json").read_text())
            assert all(r["sign_test"]["batches"] >= 10 for r in table["result"]["rows"])
            return
        assert proc.returncode == 0, where
        for name in ("model.pt", "MODEL_CARD.md", "compress.json"):
            assert (out / name).exists(), where
        return
    assert proc.returncode == 0, where
    if words[:2] == ["fairseq-headprune", "report"]:
        assert (work / words[words.index("--results-dir") + 1] / "report.html").exists()
    elif words[:2] == ["fairseq-headprune", "translate"]:
        out = work / words[words.index(">") + 1]
        lines = out.read_text(encoding="utf-8").splitlines()
        assert len(lines) == 5 and all(line.strip() for line in lines) and "@@" not in out.read_text(), lines
    elif words[0] == "fairseq-generate":
        assert re.search(r"^H-\d+\t", proc.stdout, re.M), proc.stdout[-2000:]


def test_the_readme_compress_line_as_the_recipe_takes_it():
    """recipes/readme_compress_de_en.sh runs the README's compress line on the bundled model: the tool it takes the
    line from gives one compress command, after the DEC it reads, with the placeholders replaced and nothing else."""
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "documented_commands.py"), str(ROOT / "README.md"),
                           "--starting", "fairseq-headprune compress", "--assignments", "--set", "DATA=data-bin",
                           "--set", "model.pt=m/model.pt", "--set", "MODEL_DIR=m"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    written = [c for c in fenced_commands(ROOT / "README.md") if c.startswith("fairseq-headprune compress")]
    assert len(written) == 1 and lines[-1] == with_placeholders(written[0], {"DATA": "data-bin",
                                                                             "model.pt": "m/model.pt"})
    assert lines[-1].startswith("fairseq-headprune compress data-bin --path m/model.pt ") and "$DEC" in lines[-1]
    assert any(line.startswith("DEC=") and "--bpe-codes m/code" in line for line in lines[:-1])
    bad = subprocess.run([sys.executable, str(ROOT / "tools" / "documented_commands.py"), "nowhere.md"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
