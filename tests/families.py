"""Tiny models of the fairseq families people hold, built once per machine like conftest's (cached_build).

- `multilingual`: `translation_multi_simple_epoch` with `--encoder-langtok src --decoder-langtok`, two language pairs
  (de-en, en-de) in one model, sentencepiece as M2M-100 and NLLB;
- `mbart`: `translation_from_pretrained_bart` with `--arch mbart_base` (layernorm_embedding, language-token EOS,
  mBART's language names de_DE / en_XX), sentencepiece;
- `wmt19`: `transformer_wmt_en_de_big` (post-norm, FFN 4x d, 16 heads) scaled tiny, Moses + subword-nmt as the
  WMT'19 releases;
- `single_pair_multi`: one pair under `translation_multi_simple_epoch` without language tokens, for the check that
  a model scored under it and under `translation` gives the same I_h.

The sentencepiece model is trained here on the tests' Multi30k slice (600 pieces). Each model trains for seconds.
"""
import hashlib
import shutil
from pathlib import Path

from conftest import SLICE, _cached_data, build_key, cached_build, package_key, run, stock_key, train
from fairseq_headprune.fairseq_io.loading import PACKAGE_DIR

SMALL = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
         "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
         "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"]
PAIRS = "de-en,en-de"
MULTI_TASK = ["--task", "translation_multi_simple_epoch", "--lang-pairs", PAIRS, "--encoder-langtok", "src",
              "--decoder-langtok"]
MBART_LANGS = {"de": "de_DE", "en": "en_XX"}
MBART_TASK = ["--task", "translation_from_pretrained_bart", "--langs", "de_DE,en_XX", "-s", "de_DE", "-t", "en_XX"]
WMT19_ARCH = ["--arch", "transformer_wmt_en_de_big", "--share-all-embeddings", "--encoder-layers", "2",
              "--decoder-layers", "2", "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
              "--encoder-ffn-embed-dim", "256", "--decoder-ffn-embed-dim", "256",
              "--encoder-attention-heads", "16", "--decoder-attention-heads", "16"]
SLICE_SENTENCES = 16  # the families' test and valid slices: every command decodes these only


def _spm_data(out: Path) -> None:
    """Sentencepiece on the raw slice; de-en and en-de binarised with one joined dictionary; a slice of test and
    valid (de-en) in out/slice; the mBART view (language names de_DE, en_XX) of both in out/mbart, out/mbart-slice."""
    import sentencepiece as spm

    out.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(
        input=",".join(str(SLICE / f"train.{lang}") for lang in ("de", "en")), model_prefix=str(out / "spm"),
        vocab_size=600, model_type="bpe", character_coverage=1.0, num_threads=1, seed_sentencepiece_size=20000,
        minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            lines = (SLICE / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            pieces = [" ".join(sp.encode(line, out_type=str)) for line in lines]
            (out / f"{split}.spm.{lang}").write_text("\n".join(pieces) + "\n", encoding="utf-8")
            if split != "train":
                first = "\n".join(pieces[:SLICE_SENTENCES]) + "\n"
                (out / f"{split}-slice.spm.{lang}").write_text(first, encoding="utf-8")
    prefixes = ["--trainpref", out / "train.spm", "--validpref", out / "valid.spm", "--testpref", out / "test.spm"]
    run(["fairseq-preprocess", "-s", "de", "-t", "en", "--joined-dictionary", *prefixes, "--destdir", out,
         "--workers", "1"])
    run(["fairseq-preprocess", "-s", "en", "-t", "de", "--srcdict", out / "dict.en.txt", "--tgtdict",
         out / "dict.de.txt", *prefixes, "--destdir", out, "--workers", "1"])
    run(["fairseq-preprocess", "-s", "de", "-t", "en", "--srcdict", out / "dict.de.txt", "--tgtdict",
         out / "dict.en.txt", "--validpref", out / "valid-slice.spm", "--testpref", out / "test-slice.spm",
         "--destdir", out / "slice", "--workers", "1"])
    for src, dest in ((out, out / "mbart"), (out / "slice", out / "mbart-slice")):
        dest.mkdir()
        for path in src.glob("*.de-en.*"):  # the same binarised files under mBART's language names
            shutil.copy(path, dest / path.name.replace("de-en", "de_DE-en_XX").replace(".de.", ".de_DE.")
                        .replace(".en.", ".en_XX."))
        for lang, name in MBART_LANGS.items():
            shutil.copy(out / f"dict.{lang}.txt", dest / f"dict.{name}.txt")


def spm_data() -> Path:
    """The sentencepiece data folder (cached; shared by the families' tests, which only read it)."""
    return cached_build("spm-data", build_key(_spm_data), _spm_data)


def _train_flags(updates: int):
    return ["--optimizer", "adam", "--lr", "3e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "20",
            "--criterion", "cross_entropy", "--max-tokens", "1500", "--max-update", str(updates), "--dropout", "0.1",
            "--no-epoch-checkpoints", "--no-save-optimizer-state", "--seed", "3", "--num-workers", "0",
            "--log-format", "simple", "--disable-validation"]


def _trained(name: str, data_args, model_args, updates: int, runs_package: bool = False) -> Path:
    key = build_key(_spm_data) + hashlib.sha256(repr((data_args, model_args, updates,
                                                      _train_flags(updates))).encode()).hexdigest()[:16]
    key += package_key() if runs_package else ""

    def build(out: Path) -> None:
        run(["fairseq-train", *[str(a) for a in data_args], *model_args, *_train_flags(updates), "--save-dir", out])

    return cached_build(name, key, build, keep_others=runs_package) / "checkpoint_last.pt"


def multilingual() -> Path:
    return _trained("fam-multi", [spm_data(), *MULTI_TASK], ["--arch", "transformer", "--share-all-embeddings",
                                                             *SMALL], 150)


def single_pair_multi() -> Path:
    return _trained("fam-multi-one", [spm_data(), "--task", "translation_multi_simple_epoch", "--lang-pairs",
                                      "de-en"], ["--arch", "transformer", "--share-all-embeddings", *SMALL], 40)


def mbart() -> Path:
    """fairseq 0.12's own translation_from_pretrained_bart cannot load data (see tasks.any_task.repair): trained
    under its _headprune twin, which is the same task otherwise."""
    task = ["--user-dir", PACKAGE_DIR, "--task", "translation_from_pretrained_bart_headprune", *MBART_TASK[2:]]
    return _trained("fam-mbart", [spm_data() / "mbart", *task],
                    ["--arch", "mbart_base", "--share-all-embeddings", *SMALL], 150, runs_package=True)


def wmt19() -> Path:
    """transformer_wmt_en_de_big scaled tiny, on conftest's Moses + subword-nmt data."""
    updates = 60
    key = stock_key() + hashlib.sha256(repr((WMT19_ARCH, updates)).encode()).hexdigest()[:16]
    return cached_build("fam-wmt19", key, lambda out: train(_cached_data(), out, updates=updates,
                                                            arch=WMT19_ARCH)) / "checkpoint_last.pt"
