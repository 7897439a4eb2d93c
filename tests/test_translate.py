"""The deployable folder `export-ct2` writes and `fairseq-headprune translate`: raw sentences in, fairseq-generate's
detokenised hypotheses out (float32), from a copy of the folder in another directory, for Moses + subword-nmt (the
tiny model and the bundled De-En model) and SentencePiece (under translation and under the multilingual task); the
folder's README snippet run as written gives the same; bad folders and options are one line."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import families as fam
from conftest import ENV, ROOT, SLICE, run, run_fairseq

BUNDLED = ROOT / "checkpoints" / "de-en"
TEST2016 = ROOT / "data" / "multi30k-test2016"


def raw_lines(path: Path, n: int):
    return path.read_text(encoding="utf-8").splitlines()[:n]


def generated(data, checkpoint, *options):
    """fairseq-generate's D- lines (detokenised hypotheses) in sentence order."""
    out = run_fairseq(["fairseq-generate", data, "--path", checkpoint, *options]).stdout
    rows = {int(f[0][2:]): f[2] for f in (line.split("\t") for line in out.splitlines()) if f[0].startswith("D-")}
    return [rows[i] for i in range(len(rows))]


def translated(folder, lines, *extra, check=True):
    return run(["fairseq-headprune", "translate", folder, *extra], check=check, in_process=False,
               input="\n".join(lines) + "\n")


def exported_copy(data, checkpoint, tmp_path, *options, check_sentences=16):
    """export-ct2 into tmp_path/made/ct2, then the folder moved to tmp_path/elsewhere/model (the original gone)."""
    made = tmp_path / "made" / "ct2"
    made.parent.mkdir()
    run(["fairseq-headprune", "export-ct2", data, "--path", checkpoint, "--out", made, "--gen-subset", "test",
         "--check-sentences", str(check_sentences), *options])
    moved = tmp_path / "elsewhere" / "model"
    moved.parent.mkdir()
    shutil.move(str(made), moved)
    shutil.rmtree(tmp_path / "made")
    return moved


def test_moses_subword_nmt_model_translates_raw_text_as_fairseq_generate(tiny_slice, tiny_data, stock_checkpoint,
                                                                          tmp_path):
    # the tiny data is Moses-tokenised without escapes (conftest._prepare): fairseq applies the same with
    # --moses-no-escape
    text = ["--tokenizer", "moses", "--moses-no-escape", "-s", "de", "-t", "en", "--bpe", "subword_nmt",
            "--bpe-codes", tiny_data / "code", "--beam", "4", "--max-len-b", "60", "--max-tokens", "800"]
    folder = exported_copy(tiny_slice, stock_checkpoint, tmp_path, *text, check_sentences=48)
    assert {p.name for p in folder.iterdir()} >= {"config.json", "model.bin", "translate.json", "bpe.codes",
                                                  "README.md"}
    assert str(tmp_path) not in (folder / "translate.json").read_text()  # file names inside the folder only
    reference = generated(tiny_slice, stock_checkpoint, "--gen-subset", "test", *text)
    source = raw_lines(SLICE / "test.de", 48)
    got = translated(folder, source, "--compute-type", "float32", "--batch-size", "7")
    assert got.stdout.splitlines() == reference

    # the README's snippet, as written, with ctranslate2, sacremoses and subword-nmt alone
    snippet = re.search(r"```python\n(.*?)```", (folder / "README.md").read_text(), re.S).group(1)
    assert "fairseq" not in "".join(line for line in snippet.splitlines() if "import" in line)
    script = tmp_path / "snippet.py"
    script.write_text(snippet, encoding="utf-8")
    alone = subprocess.run([sys.executable, script, folder], input="\n".join(source) + "\n", capture_output=True,
                           text=True, env=ENV, check=True)
    assert alone.stdout.splitlines() == reference

    # --beam overrides the beam the folder was checked with, as fairseq-generate's --beam does
    beam1 = generated(tiny_slice, stock_checkpoint, "--gen-subset", "test", *text[:-6], "--beam", "1",
                      "--max-len-b", "60", "--max-tokens", "800")
    assert translated(folder, source, "--compute-type", "float32", "--beam", "1").stdout.splitlines() == beam1


def test_bundled_model_translates_raw_text_as_fairseq_generate(tmp_path):
    """The bundled De-En model: raw test2016 sentences through translate, and the same sentences Moses-tokenised
    (sacremoses' defaults, as its data was) and segmented, binarised and decoded by fairseq-generate."""
    from sacremoses import MosesTokenizer
    from subword_nmt.apply_bpe import BPE

    n = 24
    source, target = raw_lines(TEST2016 / "test.de", n), raw_lines(TEST2016 / "test.en", n)
    with open(BUNDLED / "code", encoding="utf-8") as codes:
        bpe = BPE(codes)
    for lang, lines in (("de", source), ("en", target)):
        tok = MosesTokenizer(lang=lang)
        pieces = [bpe.process_line(tok.tokenize(x, aggressive_dash_splits=True, return_str=True)) for x in lines]
        (tmp_path / f"test.{lang}").write_text("\n".join(pieces) + "\n", encoding="utf-8")
    data = tmp_path / "bin"
    run_fairseq(["fairseq-preprocess", "-s", "de", "-t", "en", "--srcdict", BUNDLED / "dict.de.txt", "--tgtdict",
                 BUNDLED / "dict.en.txt", "--testpref", tmp_path / "test", "--destdir", data, "--workers", "1"])
    text = ["-s", "de", "-t", "en", "--tokenizer", "moses", "--bpe", "subword_nmt", "--bpe-codes", BUNDLED / "code",
            "--beam", "5", "--max-tokens", "4000"]
    folder = exported_copy(data, BUNDLED / "model.pt", tmp_path, *text, check_sentences=n)
    reference = generated(data, BUNDLED / "model.pt", "--gen-subset", "test", *text)
    assert translated(folder, source, "--compute-type", "float32").stdout.splitlines() == reference


def test_sentencepiece_multilingual_model_translates_raw_text_as_fairseq_generate(tmp_path):
    """SentencePiece under translation_multi_simple_epoch: the encoder's language token before the source, the
    decoder's as CTranslate2's target prefix, stripped from the output as fairseq-generate strips it."""
    data = fam.spm_data() / "slice"
    task = [*fam.MULTI_TASK, "-s", "de", "-t", "en", "--bpe", "sentencepiece", "--sentencepiece-model",
            fam.spm_data() / "spm.model", "--beam", "1", "--max-len-b", "30", "--max-tokens", "3000"]
    folder = exported_copy(data, fam.multilingual(), tmp_path, *task)
    settings = (folder / "translate.json").read_text()
    assert '"__de__"' in settings and '"__en__"' in settings and (folder / "sentencepiece.model").is_file()
    reference = generated(data, fam.multilingual(), "--gen-subset", "test", *task)
    source = raw_lines(SLICE / "test.de", fam.SLICE_SENTENCES)
    got = translated(folder, source, "--compute-type", "float32").stdout.splitlines()
    assert got == reference and not any("__en__" in line for line in got)
    snippet = re.search(r"```python\n(.*?)```", (folder / "README.md").read_text(), re.S).group(1)
    script = tmp_path / "snippet.py"
    script.write_text(snippet, encoding="utf-8")
    alone = subprocess.run([sys.executable, script, folder], input="\n".join(source) + "\n", capture_output=True,
                           text=True, env=ENV, check=True)
    assert alone.stdout.splitlines() == reference


def test_bad_folders_and_options_are_one_line(tmp_path):
    cases = [((tmp_path / "none",), "is not a deployable model folder"),
             ((tmp_path, "--beam", "0"), "--beam must be at least 1"),
             ((tmp_path, "--batch-size", "0"), "--batch-size must be at least 1")]
    for args, expected in cases:
        got = translated(args[0], ["ein Hund"], *args[1:], check=False)
        last = got.stderr.strip().splitlines()[-1]  # (after any logging of fairseq's own imports)
        assert got.returncode == 2 and expected in last and "Traceback" not in got.stderr
        assert last.startswith("fairseq-headprune translate: error: ")
    old = tmp_path / "old"  # a CTranslate2 folder exported before the folder carried its tokenizer
    old.mkdir()
    (old / "model.bin").write_bytes(b"")
    got = translated(old, ["ein Hund"], check=False)
    assert got.returncode == 2 and "export it again" in got.stderr


def test_sentencepiece_model_under_translation_translates_raw_text_as_fairseq_generate(tmp_path):
    """SentencePiece without language tokens: the single-pair model under `translation` (test_families' view of
    its data, the dictionaries with the multilingual task's language tokens appended)."""
    from test_families import _translation_view

    data, model = _translation_view(tmp_path), fam.single_pair_multi()
    task = ["--task", "translation", "-s", "de", "-t", "en", "--bpe", "sentencepiece", "--sentencepiece-model",
            fam.spm_data() / "spm.model", "--beam", "1", "--max-len-b", "30", "--max-tokens", "3000"]
    folder = exported_copy(data, model, tmp_path, *task)
    settings = (folder / "translate.json").read_text()
    assert '"source_prefix": []' in settings and '"target_prefix": []' in settings
    reference = generated(data, model, "--gen-subset", "test", *task)
    source = raw_lines(SLICE / "test.de", fam.SLICE_SENTENCES)
    assert translated(folder, source, "--compute-type", "float32").stdout.splitlines() == reference
