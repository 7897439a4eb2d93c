"""Every command README.md and docs/*.md tell a user to run (their fenced `bash` blocks) runs as written, on tiny
models and data: the placeholders (DATA, model.pt, MODEL_DIR, MODEL_ARCH) replaced by fixtures, nothing else. A
documented line that stops working, or a new one, fails its document's test case. A usage synopsis ([optional]
options, A|B, ...) is a `text` block: it is not a command anybody can run as written.

Each document runs in a folder of its own (its relative outputs land there), so its commands must not need another
document's. The test files tests/test_documented_commands_GROUP.py run the documents of GROUPS, one test case each:
pytest-xdist's `--dist loadfile` gives each file to one worker, so the long documents are spread over files."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from documented_commands import ASSIGNMENT, fenced_commands, with_placeholders  # noqa: E402

import families as fam  # noqa: E402
from forked_cli import ForkedCli  # noqa: E402
from conftest import (BIN, ENV, ROOT, SLICE, _cached_data, _data_key, build_key, cached_build, copy_cached,  # noqa: E402
                      run_fairseq, stock_key, train)

DOCUMENTS = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
# the documents each test file runs (tests/test_documented_commands_GROUP.py), about equal in time; "compress" and
# "pipeline" start together on a fresh machine: pipeline's first document (families.md: the tiny multilingual
# model) builds what it alone needs while compress's builds the deep decoder, not waiting on that build's lock
GROUPS = {
    "readme": ("README.md",),
    "compress": ("docs/compress.md",),
    "studies": ("docs/michel.md", "docs/report.md", "docs/voita.md"),
    "pipeline": ("docs/families.md", "docs/deploy.md", "docs/recover.md", "docs/shrink.md", "docs/vocabulary.md"),
}
M2M_GENERATE = ("fairseq-generate data-bin --path 418M_last_checkpoint.pt --user-dir fairseq_headprune --task "
                "translation_multi_simple_epoch_headprune --mask-heads enc-dec:12:1-16,dec-self:3:5+9 --lang-pairs "
                "language_pairs_small_models.txt --fixed-dictionary model_dict.128k.txt --encoder-langtok src "
                "--decoder-langtok -s de -t fr --remove-bpe sentencepiece --beam 5")
M2M_SCORE = ("fairseq-headprune score data-bin --path 418M_last_checkpoint.pt --results-dir DIR --gen-subset valid "
             "--task translation_multi_simple_epoch --lang-pairs language_pairs_small_models.txt --fixed-dictionary "
             "model_dict.128k.txt --encoder-langtok src --decoder-langtok -s de -t fr --bpe sentencepiece "
             "--sentencepiece-model spm.128k.model")
# lines of those blocks not run here, and why (each must still be in its document: a stale entry fails a test)
NOT_RUN = {
    "make demo": "the bundled model's whole study (minutes of CPU); its parts are the report's, run below on the tiny "
                 "model",
    "make test": "runs this very suite",
    "MULTI30K=DIR recipes/compress_de_en.sh": "the bundled model's compression, about 50 CPU minutes and the "
                                              "Multi30k corpus; the compress line below is its command "
                                              "(recipes/readme_compress_de_en.sh runs it on the bundled model)",
    "recipes/voita_l0.sh": "the L0 gates' lambda sweep on the bundled model, hours of CPU; the L0 fine-tuning and "
                           "gates lines of docs/voita.md run on the tiny model",
    M2M_GENERATE: "M2M-100 418M's released checkpoint and files, which cannot be had here; docs/families.md's next "
                  "block runs the same task, mask and options on a tiny multilingual model",
    M2M_SCORE: "as the line above",
}


def as_run_here(command: str, placeholders: Dict[str, str], study_checkpoint: Path) -> str:
    """The command with its placeholders replaced by the fixtures (and nothing else changed). model.pt is the
    document's model (the deep decoder: compress reaches its documented speed-up), or for the whole study
    (`report`) the stock tiny model: the deep decoder's 36 heads in sublayers of 4 leave 27 removable, fewer than
    report's shrink sweep asks at 80% (refused in one line)."""
    if command.startswith("fairseq-headprune report "):
        placeholders = {**placeholders, "model.pt": str(study_checkpoint)}
    return with_placeholders(command, placeholders)


# model.pt: a tiny model trained for seconds whose decoder holds most of its decoding time (4 layers over one
# encoder layer), so that a documented `--speedup 1.5` is reachable on any machine: the stock tiny model's decoding
# time is mostly per-step overhead, which no shape removes, and its targets are refused. 4 layers, not more: the
# choice fits every structure (decoder depth x FFN share) once and the documented commands ablate every head, so
# each decoder layer costs every document's compress and study commands their share (8 layers took 2.3x as long
# for docs/compress.md's first line, reaching the same 1.6x)
DEEP_DECODER = [
    "--arch", "transformer", "--share-all-embeddings",
    "--encoder-layers", "1", "--encoder-attention-heads", "4",
    "--decoder-layers", "4", "--decoder-attention-heads", "4",
    "--encoder-embed-dim", "64", "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128",
    "--decoder-ffn-embed-dim", "128",
]
# trained longer than the other tiny models: at their 120 updates (valid perplexity about 170) 4 of the 48 test
# sentences came out differently from CTranslate2 float32 and fairseq at beam 5, more than the export check allows
DEEP_UPDATES = 1000


def deep_decoder_checkpoint(dest: Path) -> Path:
    """A copy, in dest, of the deep decoder (built once per machine)."""
    key = stock_key() + hashlib.sha256(repr((DEEP_DECODER, DEEP_UPDATES)).encode()).hexdigest()[:8]
    cached = cached_build("deep-decoder", key,
                          lambda out: train(_cached_data(), out, updates=DEEP_UPDATES, arch=DEEP_DECODER))
    return copy_cached(cached, dest) / "checkpoint_last.pt"


SENTENCES = 48  # of valid and test in the DATA fixture: every command reads them whole, some many times
TRAIN_PAIRS = 600  # of train: the calibration's 1000 sentences and the recovery's epochs read all of them


def build_data(out: Path) -> None:
    """DATA as the README describes it (binarised with the model's dictionaries, train, valid and test, the raw
    test references as DATA/test.raw.en) and MODEL_DIR (its BPE codes): the tiny data, train cut to its first
    TRAIN_PAIRS pairs, valid and test to their first SENTENCES sentences."""
    tiny_data = _cached_data()
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


def data_fixture(dest: Path) -> Path:
    """A copy, in dest, of DATA (built once per machine)."""
    key = _data_key() + build_key(build_data) + f"-{SENTENCES}-{TRAIN_PAIRS}"
    return copy_cached(cached_build("documented-data", key, build_data), dest)


def multilingual_fixtures(folder: Path) -> Dict[str, str]:
    """docs/families.md's placeholders: the tiny multilingual model (de-en and en-de, language tokens, as M2M-100),
    DATA its 16-sentence de-en slice, MODEL_DIR the folder of its SentencePiece model."""
    model_dir = folder / "model"
    model_dir.mkdir()
    shutil.copyfile(fam.multilingual(), model_dir / "model.pt")
    shutil.copyfile(fam.spm_data() / "spm.model", model_dir / "spm.model")
    data = shutil.copytree(fam.spm_data() / "slice", folder / "data")
    return {"DATA": str(data), "MODEL_DIR": str(model_dir), "model.pt": str(model_dir / "model.pt")}


def fixtures(document: str, folder: Path) -> Dict[str, str]:
    """The values of the document's placeholders, made in folder."""
    folder.mkdir()
    if document == "docs/families.md":
        return multilingual_fixtures(folder)
    data = data_fixture(folder / "data")
    # MODEL_DIR: the model's folder, for its BPE codes; MODEL_ARCH: the options it was trained with
    return {"DATA": str(data), "MODEL_DIR": str(data), "model.pt": str(deep_decoder_checkpoint(folder / "deep")),
            "MODEL_ARCH": " ".join(DEEP_DECODER)}


def run_document(document: str, study_checkpoint: Path, tmp_path: Path) -> List[str]:
    """Runs the document's commands in order in a folder of their own, each checked by check_outcome; returns those
    run. study_checkpoint: the model of `report` (conftest's stock tiny model)."""
    placeholders = fixtures(document, tmp_path / "fixtures")
    work = tmp_path / "work"  # the user's folder: relative outputs (small/, study/) land here
    work.mkdir()
    for lang in ("de", "en"):  # the user's raw text (raw.de for `translate`; both sides for data_prep)
        raw = (SLICE / f"test.{lang}").read_text(encoding="utf-8").splitlines()[:5]
        (work / f"raw.{lang}").write_text("\n".join(raw) + "\n", encoding="utf-8")
    for folder in ("fairseq_headprune", "data_prep"):  # --user-dir fairseq_headprune and data_prep/, from a clone
        (work / folder).symlink_to(ROOT / folder)
    env = {**ENV, "PATH": f"{BIN}{os.pathsep}{ENV.get('PATH', '')}", "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT)}
    ran, assignments = [], []  # DEC=...: a variable the following commands read, as in the user's shell
    with ForkedCli(tmp_path / "cli", env) as cli:  # fairseq-headprune without its start-up per line
        for command in fenced_commands(ROOT / document):
            if command in NOT_RUN:
                continue
            line = as_run_here(command, placeholders, study_checkpoint)
            if ASSIGNMENT.fullmatch(line):
                assignments.append(line)
                continue
            before = tree(work)
            proc = subprocess.run(["bash", "-c", "\n".join([*assignments, line])], cwd=work, env=cli.env,
                                  capture_output=True, text=True)
            check_outcome(command, proc, work)
            if "--dry-run" in command.split():
                assert tree(work) == before  # the plan only: nothing written
            ran.append(command)
    return ran


def tree(folder: Path) -> dict:
    """Every file under a folder (links to folders not followed) with its size and modification time."""
    files = [Path(root) / name for root, _, names in os.walk(folder) for name in names]
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in files if p.is_file()}


# what a fairseq-headprune command writes in its --results-dir (patterns, each matched by a file)
RESULTS = {
    "score": ["importance.json"],
    "ablate": ["ablation-*.jsonl", "ablation-*.md"],
    "prune": ["pruning.jsonl", "pruning.png"],
    "analyze": ["heads_analysis.json", "head_functions.png"],
    "gates": ["gates.json", "closed-heads.json", "kept-heads.md"],
    "compare": ["compare.jsonl", "compare.md"],
    "survivors": ["survivors.md", "survivors.png"],
    "speed": ["speed.json"],
    "deploy": ["deploy.md", "deploy.json", "deploy.png"],
    "report": ["report.html", "report.md", "claims.json"],
}


def option(words: List[str], name: str) -> str:
    return words[words.index(name) + 1]


def check_outcome(command: str, proc: subprocess.CompletedProcess, work: Path) -> None:
    """What each documented command promises, on the tiny models."""
    where = f"{command}\n{proc.stderr[-3000:]}"
    words = command.split()
    if words[:2] == ["fairseq-headprune", "compress"]:
        check_compress(words, proc, work, where)
        return
    assert proc.returncode == 0, where
    name = words[1] if words[0] == "fairseq-headprune" else words[0]
    if words[0] == "fairseq-headprune" and "--results-dir" in words:
        patterns = ["shrink-sweep.jsonl", "shrink-sweep.md"] if "--sweep" in words else RESULTS.get(name, [])
        results = work / option(words, "--results-dir")
        missing = [p for p in patterns if not any(results.glob(p))]
        assert not missing, f"{where}\nnot written in {results}: {missing}"
    if name in ("shrink", "recover", "remove") and "--out" in words:
        out = work / option(words, "--out")
        assert out.is_file(), where
        if name != "remove" and "--results-dir" not in words:  # the checkpoint's record, beside it
            assert out.with_suffix(".json").is_file(), where
        if "--recover-epochs" in words:  # the shrunk model kept beside the recovered one
            assert out.with_suffix(".shrunk.pt").is_file(), where
    elif name == "export-ct2":
        out = work / option(words, "--out")
        assert (out / "model.bin").is_file() and (out / "translate.json").is_file(), where
    elif name == "gates" and "--fold-out" in words:
        assert (work / option(words, "--fold-out")).is_file(), where
    elif name == "fairseq-train":
        assert (work / option(words, "--save-dir") / "checkpoint_last.pt").is_file(), where
    elif name == "translate":
        out = work / words[words.index(">") + 1]
        lines = out.read_text(encoding="utf-8").splitlines()
        assert len(lines) == 5 and all(line.strip() for line in lines) and "@@" not in out.read_text(), lines
    elif name == "fairseq-generate":
        assert re.search(r"^H-\d+\t", proc.stdout, re.M), proc.stdout[-2000:]


def check_compress(words: List[str], proc: subprocess.CompletedProcess, work: Path, where: str) -> None:
    """compress: its folder, its plan, or its one-line refusal of a target the tiny model cannot reach."""
    out = work / option(words, "--out")
    if "--dry-run" in words:
        assert proc.returncode == 0 and "fairseq-train " in proc.stdout, where
        return
    if "--stop-after" in words:
        assert proc.returncode == 0 and (out / "recovery-run.sh").is_file(), where
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
