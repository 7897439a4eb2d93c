"""The fairseq families people hold (tests/families.py builds a tiny model of each), under the task each was trained
with: every command once per family, the pruned model reloaded by fairseq-generate under that task, and the same
I_h for a single-pair model scored under `translation` and under `translation_multi_simple_epoch`."""
import json

import pytest

import families as fam
from conftest import run, run_fairseq
from fairseq_headprune.loading import PACKAGE_DIR

SPM = ["--bpe", "sentencepiece"]


def spm_model():
    return fam.spm_data() / "spm.model"


def _translation_view(tmp_path):
    """The slice as `translation` reads it, with the dictionaries translation_multi_simple_epoch builds (its
    language tokens appended), so that one model loads under both tasks."""
    view = tmp_path / "view"
    view.mkdir()
    src = fam.spm_data() / "slice"
    for path in src.glob("*.de-en.*"):
        (view / path.name).symlink_to(path)
    for lang in ("de", "en"):
        text = (src / f"dict.{lang}.txt").read_text(encoding="utf-8")
        (view / f"dict.{lang}.txt").write_text(text + "__de__ 1\n__en__ 1\n", encoding="utf-8")
    return view


def test_single_pair_model_gives_the_same_importance_under_both_tasks(tmp_path):
    model = fam.single_pair_multi()
    common = ["--path", model, "--gen-subset", "test", "-s", "de", "-t", "en", "--max-tokens", "400"]
    run(["fairseq-headprune", "score", _translation_view(tmp_path), "--task", "translation", *common,
         "--results-dir", tmp_path / "translation"])
    run(["fairseq-headprune", "score", fam.spm_data() / "slice", "--task", "translation_multi_simple_epoch",
         "--lang-pairs", "de-en", *common, "--results-dir", tmp_path / "multi"])
    a, b = (json.loads((tmp_path / name / "importance.json").read_text()) for name in ("translation", "multi"))
    assert a["meta"]["unnormalized"] == b["meta"]["unnormalized"]  # the same computation: bit for bit
    assert a["meta"]["target_tokens"] == b["meta"]["target_tokens"] > 0
    for t in ("enc-self", "enc-dec", "dec-self"):
        assert a[t] == b[t]
