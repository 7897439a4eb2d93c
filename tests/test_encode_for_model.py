"""data_prep/encode-for-model.sh in SentencePiece mode: raw parallel text cut into a released model's pieces and
binarised with its dictionaries (its own pair of them, or the one dictionary a multilingual release ships for both
sides) gives the very files the tiny multilingual model's data was built from; bad model folders are one line."""
from __future__ import annotations

import os
import shutil
import subprocess

import families as fam
from conftest import ENV, ROOT, SLICE

SCRIPT = ROOT / "data_prep" / "encode-for-model.sh"


def encode(model_dir, out, *extra_env, split="test"):
    env = {**ENV, **dict(extra_env)}
    return subprocess.run(["bash", str(SCRIPT), str(model_dir), "de", "en", str(SLICE / split), str(out), split],
                          capture_output=True, text=True, env=env)


def test_raw_text_is_cut_into_the_models_pieces_and_binarised_as_the_release_was(tmp_path):
    spm = fam.spm_data()
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    shutil.copy(spm / "spm.model", model_dir / "spm.model")
    for lang in ("de", "en"):
        shutil.copy(spm / f"dict.{lang}.txt", model_dir / f"dict.{lang}.txt")
    proc = encode(model_dir, tmp_path / "own")
    assert proc.returncode == 0, proc.stderr
    for lang in ("de", "en"):
        assert (tmp_path / "own" / "prep" / f"test.bpe.{lang}").read_text() == (spm / f"test.spm.{lang}").read_text()
        for ext in ("bin", "idx"):
            name = f"test.de-en.{lang}.{ext}"
            assert (tmp_path / "own" / name).read_bytes() == (spm / name).read_bytes()
        assert (tmp_path / "own" / f"test.raw.{lang}").read_text() == (SLICE / f"test.{lang}").read_text()
    # a multilingual release: one dictionary of both sides under its own name, the model under another
    release = tmp_path / "release"
    release.mkdir()
    shutil.copy(spm / "spm.model", release / "spm.128k.model")
    shutil.copy(spm / "dict.de.txt", release / "data_dict.128k.txt")  # (a joined dictionary: both sides' files equal)
    proc = encode(release, tmp_path / "shared", ("DICT", str(release / "data_dict.128k.txt")))
    assert proc.returncode == 0, proc.stderr
    for name in ("test.de-en.de.bin", "test.de-en.en.bin"):
        assert (tmp_path / "shared" / name).read_bytes() == (spm / name).read_bytes()


def test_a_model_folder_the_script_cannot_read_is_one_line(tmp_path):
    spm = fam.spm_data()
    cases = {"empty": ([], "holds neither BPE codes (code) nor a SentencePiece model"),
             "two-models": (["a.model", "b.model"], "holds 2 SentencePiece models: name one with SPM=FILE"),
             "no-dicts": (["spm.model"], "name the release's dictionary of both sides with DICT=FILE")}
    for name, (files, message) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        for f in files:
            shutil.copy(spm / "spm.model", folder / f)
        proc = encode(folder, tmp_path / f"out-{name}")
        assert proc.returncode == 2 and message in proc.stderr, (name, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and not os.path.exists(tmp_path / f"out-{name}")
    # a folder that already holds data binarised against other dictionaries (another model's DATA): refused, with
    # nothing in it touched
    model_dir, other = tmp_path / "model", tmp_path / "other-data"
    model_dir.mkdir()
    other.mkdir()
    shutil.copy(spm / "spm.model", model_dir / "spm.model")
    for lang in ("de", "en"):
        shutil.copy(spm / f"dict.{lang}.txt", model_dir / f"dict.{lang}.txt")
    (other / "dict.en.txt").write_text("the 10\nof 5\n")
    before = sorted(p.name for p in other.iterdir())
    proc = encode(model_dir, other)
    assert proc.returncode == 2 and "holds other symbols than" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and sorted(p.name for p in other.iterdir()) == before
    assert encode(model_dir, tmp_path / "own").returncode == 0 and encode(model_dir, tmp_path / "own").returncode == 0
