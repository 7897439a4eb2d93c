"""fastBPE (`--bpe fastbpe`, the WMT'19 releases' subword model), from raw text to the deployed folder: a tiny model
trained on Moses-tokenised text segmented with fastBPE codes (learned by `fastbpe learnbpe`, the command line of
fastBPE's sdist that `make setup` builds into the venv; applied by the `fastBPE` module as fairseq applies them).
data_prep/encode-for-model.sh in fastBPE mode binarises raw text byte for byte as Moses, fastBPE and
fairseq-preprocess do; the folder export-ct2 writes carries the codes, and `translate` (and the folder's README
snippet) turn raw lines into fairseq-interactive's detokenised output; codes fastBPE cannot read are one line."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

from conftest import BIN, ENV, ROOT, SLICE, build_key, cached_build, run, train
from test_translate import exported_copy, in_process, raw_lines, readme_snippet, translated

from fairseq_headprune.errors import UserError

SCRIPT = ROOT / "data_prep" / "encode-for-model.sh"
LEARNER = BIN / "fastbpe"  # fastBPE's main.cc, compiled by make setup
MERGES = 400
UPDATES = 300
SENTENCES = 32
TEXT = ["-s", "de", "-t", "en", "--tokenizer", "moses", "--bpe", "fastbpe", "--bpe-codes"]
DECODING = ["--beam", "4", "--max-len-b", "60", "--max-tokens", "800"]


def _fastbpe_build(out: Path) -> None:
    """The raw slice Moses-tokenised as fairseq's --tokenizer moses does by default (aggressive dash splits,
    escaped), fastBPE codes learned on both sides' training text, applied by the fastBPE module, binarised with one
    joined dictionary; a tiny model trained on it (out/model)."""
    import fastBPE
    from sacremoses import MosesTokenizer

    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            tok = MosesTokenizer(lang=lang)
            lines = (SLICE / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            tokenized = [tok.tokenize(x, aggressive_dash_splits=True, return_str=True, escape=True) for x in lines]
            (out / f"{split}.tok.{lang}").write_text("\n".join(tokenized) + "\n", encoding="utf-8")
    codes = run([LEARNER, "learnbpe", MERGES, out / "train.tok.de", out / "train.tok.en"]).stdout
    (out / "bpecodes").write_text(codes, encoding="utf-8")
    bpe = fastBPE.fastBPE(str(out / "bpecodes"))
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            lines = (out / f"{split}.tok.{lang}").read_text(encoding="utf-8").splitlines()
            (out / f"{split}.bpe.{lang}").write_text("\n".join(bpe.apply(lines)) + "\n", encoding="utf-8")
    run(["fairseq-preprocess", "--source-lang", "de", "--target-lang", "en", "--joined-dictionary",
         "--trainpref", out / "train.bpe", "--validpref", out / "valid.bpe", "--testpref", out / "test.bpe",
         "--destdir", out, "--workers", "1"])
    train(out, out / "model", updates=UPDATES)


@pytest.fixture(scope="module")
def fastbpe_model() -> Path:
    """The cached build of _fastbpe_build (data in the folder, the checkpoint in its model/)."""
    assert LEARNER.is_file(), f"{LEARNER} (fastBPE's learner) is missing: make setup builds it"
    learner = hashlib.sha256(LEARNER.read_bytes()).hexdigest()[:8]
    key = build_key(_fastbpe_build, train) + learner + metadata.version("fastBPE") + str((MERGES, UPDATES))
    return cached_build("fastbpe", hashlib.sha256(key.encode()).hexdigest()[:16], _fastbpe_build)


def encode(model_dir, out, *extra_env):
    return subprocess.run(["bash", str(SCRIPT), str(model_dir), "de", "en", str(SLICE / "test"), str(out)],
                          capture_output=True, text=True, env={**ENV, **dict(extra_env)})


def test_the_learned_codes_segment_words(fastbpe_model):
    codes = (fastbpe_model / "bpecodes").read_text(encoding="utf-8").splitlines()
    assert len(codes) == MERGES and all(len(line.split(" ")) == 3 for line in codes)
    assert "@@ " in (fastbpe_model / "train.bpe.de").read_text(encoding="utf-8")


def test_encode_for_model_binarises_raw_text_as_moses_fastbpe_and_preprocess(fastbpe_model, tmp_path):
    """A WMT'19-like release folder (bpecodes, dict.de.txt, dict.en.txt) and the raw test text: the pieces and the
    binarised files are those the model's own data holds."""
    release = tmp_path / "release"
    release.mkdir()
    for name in ("bpecodes", "dict.de.txt", "dict.en.txt"):
        shutil.copy(fastbpe_model / name, release / name)
    proc = encode(release, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert "Loading codes" not in proc.stderr  # fastBPE's own loading messages are not passed on
    for lang in ("de", "en"):
        assert (tmp_path / "out" / "prep" / f"test.bpe.{lang}").read_text() == \
            (fastbpe_model / f"test.bpe.{lang}").read_text()
        for ext in ("bin", "idx"):
            name = f"test.de-en.{lang}.{ext}"
            assert (tmp_path / "out" / name).read_bytes() == (fastbpe_model / name).read_bytes(), name
        assert (tmp_path / "out" / f"test.raw.{lang}").read_text() == (SLICE / f"test.{lang}").read_text()


def test_encode_for_model_refuses_codes_it_cannot_read_in_one_line(fastbpe_model, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    for lang in ("de", "en"):
        shutil.copy(fastbpe_model / f"dict.{lang}.txt", folder / f"dict.{lang}.txt")
    (folder / "bpecodes").write_text("#version: 0.2\nd e\n", encoding="utf-8")  # subword-nmt's, as WMT14's
    (folder / "junk.codes").write_text("d e 12\nnot-codes\n", encoding="utf-8")
    cases = [((), "bpecodes is not fastBPE codes (LEFT RIGHT COUNT a line): subword-nmt codes"),
             ((("FASTBPE", str(folder / "junk.codes")),), "junk.codes line 2 is not fastBPE codes"),
             ((("FASTBPE", str(folder / "junk.codes")), ("SPM", str(folder / "x.model"))), "give one")]
    for env, message in cases:
        proc = encode(folder, tmp_path / "out", *env)
        assert proc.returncode == 2 and message in proc.stderr, (env, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def interactive(data, checkpoint, lines, *options):
    """fairseq-interactive's D- lines (detokenised hypotheses) for raw `lines`, in input order."""
    out = run(["fairseq-interactive", data, "--path", checkpoint, "--buffer-size", len(lines), *options],
              input="\n".join(lines) + "\n").stdout
    rows = {int(f[0][2:]): f[2] for f in (line.split("\t") for line in out.splitlines()) if f[0].startswith("D-")}
    return [rows[i] for i in range(len(lines))]


def test_the_exported_folder_translates_raw_text_as_fairseq_interactive(fastbpe_model, tmp_path):
    codes, checkpoint = fastbpe_model / "bpecodes", fastbpe_model / "model" / "checkpoint_last.pt"
    folder = exported_copy(fastbpe_model, checkpoint, tmp_path, *TEXT, codes, *DECODING)
    assert (folder / "fastbpe.codes").read_bytes() == codes.read_bytes()
    settings = json.loads((folder / "translate.json").read_text())
    assert settings["bpe"] == {"_name": "fastbpe", "bpe_codes": "fastbpe.codes"}
    assert settings["tokenizer"]["_name"] == "moses" and str(tmp_path) not in json.dumps(settings)
    assert "fastbpe (fastbpe.codes)" in (folder / "README.md").read_text()

    source = raw_lines(SLICE / "test.de", SENTENCES)
    reference = interactive(fastbpe_model, checkpoint, source, *TEXT, codes, *DECODING)
    assert len(set(reference)) > SENTENCES // 4  # a model whose answers depend on the sentence
    got = translated(folder, source, "--compute-type", "float32", "--batch-size", "7")
    assert got.stdout.splitlines() == reference

    # the README's snippet, as written, with ctranslate2, sacremoses and fastBPE alone
    snippet, alone = readme_snippet(folder, source, tmp_path)
    assert "import fastBPE" in snippet
    assert "fairseq" not in "".join(line for line in snippet.splitlines() if "import" in line)
    assert alone == reference

    # codes the fastBPE module would crash the process on are one line, not a crash
    (folder / "fastbpe.codes").write_text("d e 12\nnot-codes\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"fastbpe\.codes line 2 is not fastBPE codes"):
        in_process(folder, [b"ein Hund"])
