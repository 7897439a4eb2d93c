"""data_prep/: the IWSLT14, WMT14 En-Fr and MTNT pipelines, run on the real data of ../shared/data (small slices,
small BPE merge counts) and checked against what fairseq's own recipes produced where that output is shipped.
"""
from __future__ import annotations

import filecmp
import gzip
import importlib.util
import shutil
import tarfile
from pathlib import Path

import pytest

from conftest import ROOT, run

DATA = ROOT.parent / "shared" / "data"
IWSLT = DATA / "iwslt14"
WMT = DATA / "wmt14_en_fr"
MTNT = DATA / "mtnt"
SCRIPTS = ROOT / "data_prep"
TEST_SETS = ["IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
             "IWSLT14.TED.tst2012"]


def _load_helper():
    spec = importlib.util.spec_from_file_location("data_prep_moses_steps", SCRIPTS / "moses_steps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


H = _load_helper()


@pytest.fixture(autouse=True, scope="module")
def shared_data_present():
    """Every test here reads the real corpora of ../shared/data (CI has them): without them, one line says so."""
    if not DATA.is_dir():
        pytest.fail(f"tests/test_data_prep.py needs the shared corpora (iwslt14/, wmt14_en_fr/, mtnt/, multi30k/, ...) "
                    f"in {DATA}, i.e. ../shared/data beside the repository, as CI provides: not found", pytrace=False)


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def head(src: Path, dst: Path, n: int) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("".join(line + "\n" for line in lines(src)[:n]), encoding="utf-8")
    return dst


def script(name: str, *args, env=None):
    return run(["bash", SCRIPTS / name, *args], check=False, env=env or {})


def ok(name: str, *args, env=None):
    proc = script(name, *args, env=env)
    assert proc.returncode == 0, f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return proc


def fails(name: str, *args, expect: str, env=None):
    """Bad input: exit code 2 and exactly one stderr line "<script>: error: ...", which contains `expect`."""
    proc = script(name, *args, env=env)
    err = proc.stderr.strip().splitlines()
    prog = name.removesuffix(".sh")
    assert proc.returncode == 2, f"{name} {args}: exit {proc.returncode}\n{proc.stderr}"
    assert len(err) == 1 and err[0].startswith(f"{prog}: error: "), proc.stderr
    assert expect in err[0], err[0]
    return err[0]


def dataset(prefix: Path, dict_path: Path):
    """A binarised fairseq split: (its dictionary, its sentences as lists of token ids)."""
    from fairseq.data import Dictionary, data_utils

    d = Dictionary.load(str(dict_path))
    ds = data_utils.load_indexed_dataset(str(prefix), d)
    assert ds is not None, f"no binarised data at {prefix}"
    return d, ds


def assert_binarised(out: Path, pair: str, splits, counts: dict, bpe_dir: Path, train_name: str = "train.bpe"):
    """.bin/.idx for every split and side, a joined dictionary, and each split decodes to its BPE text
    (bpe_dir/SPLIT.bpe.LANG; train_name.LANG for train)."""
    src, tgt = pair.split("-")
    assert (out / f"dict.{src}.txt").read_bytes() == (out / f"dict.{tgt}.txt").read_bytes()  # joined
    for split in splits:
        for lang in (src, tgt):
            for ext in ("bin", "idx"):
                assert (out / f"{split}.{pair}.{lang}.{ext}").stat().st_size > 0
            d, ds = dataset(out / f"{split}.{pair}.{lang}", out / f"dict.{lang}.txt")
            assert len(ds) == counts[split]
            text = lines(bpe_dir / (f"{train_name}.{lang}" if split == "train" else f"{split}.bpe.{lang}"))
            for i in (0, len(ds) // 2, len(ds) - 1):
                expected = " ".join(w if d.index(w) != d.unk() else d.unk_word for w in text[i].split())
                assert d.string(ds[i]) == expected


def assert_bpe_of(bpe_file: Path, tok_file: Path):
    """BPE output is its input with words split by '@@ ' (and nothing else changed)."""
    bpe, tok = lines(bpe_file), lines(tok_file)
    assert len(bpe) == len(tok) and bpe != tok
    assert [x.replace("@@ ", "") for x in bpe] == tok


# ------------------------------------------------------------------------------------------------------ IWSLT14
def test_iwslt14_bpe_only_reproduces_fairseq_bpe_byte_for_byte(tmp_path):
    """fairseq's shipped code file applied to its tokenised valid/test gives its BPE files, byte for byte."""
    out = tmp_path / "iwslt14"
    proc = ok("prepare-iwslt14.sh", "--bpe-only", "--code", IWSLT / "bpe" / "code", IWSLT / "tok", out)
    assert "dictionary built from the valid split" in proc.stderr
    for split in ("valid", "test"):
        for lang in ("de", "en"):
            ours, fairseqs = out / "prep" / f"{split}.bpe.{lang}", IWSLT / "bpe" / f"{split}.{lang}"
            assert filecmp.cmp(ours, fairseqs, shallow=False), f"{ours} differs from {fairseqs}"
            assert ours.read_bytes() == fairseqs.read_bytes()
    assert (out / "code").read_bytes() == (IWSLT / "bpe" / "code").read_bytes()
    assert_binarised(out, "de-en", ["valid", "test"], {"valid": 7283, "test": 6750}, out / "prep")
    assert not list(out.glob("train.*"))


# raw text as in IWSLT's train.tags (cased, untokenised) -> the line fairseq's recipe made of it (file, line number)
IWSLT_LINES = [
    ("en", "It's that pyramid.", "valid.en", 1),
    ("de", "Es ist diese Pyramide.", "valid.de", 1),
    # tokenizer.perl splits the period of a line's last word even after an abbreviation (sacremoses does not)
    ("en", "Wind power produces a bit more, 2.5 watts per square meter, but that's only twice as big as 1.25 watts "
           "per square meter, so that means if you wanted literally to produce total energy consumption in all forms "
           "on average from wind farms, you need wind farms half the area of the U.K.", "valid.en", 233),
    ("en", "After going to sleep at 12:45 a.m.", "valid.en", 4075),
    ("de", "Ich glaube, dass es neue, verborgene Spannungen gibt die sich tatsächlich zwischen Menschen und "
           "Einrichtungen abspielen -- solche Einrichtungen, die Menschen in ihrem täglichen Leben nutzen: Schulen, "
           "Krankenhäuser, Arbeitsplätze, Betriebe, Büros, usw.", "valid.de", 17),
    ("en", "Well actually, I've [been] whistling since the age of four, about four.", "valid.en", 120),
    ("de", "Los geht's.", "valid.de", 838),
    ("en", "And it's not to go out and buy 100 or 1,000, though, I invite you to do that, and 10,000 would be even "
           "better.", "valid.en", 46),
    ("en", "It means that, if you have T.B., you have more chance that you won't be detected, but will just die from "
           "T.B. secondary infections and so on.", "valid.en", 1810),
    ("en", '"Spanish chef accused ..." -- and the French accused him.', "valid.en", 427),
    ("en", 'I asked, "Where were you on 9/11?"', "valid.en", 1981),
    ("de", "Nachdem ich um 0:45 ins Bett gegangen war.", "valid.de", 4075),
    ("en", "In mother's milk.", "valid.en", 2),
    # a talk description: tags stripped, its text kept, its HTML entities not unescaped (fairseq's sed does not)
    ("en", "<description>Why do we argue? To out-reason our opponents, prove them wrong, and, most of all, to win! "
           "...right? Philosopher Daniel H. Cohen shows how our most common form of argument -- a war in which one "
           "person must win and the other must lose -- misses out on the real benefits of engaging in active "
           "disagreement. &lt;em&gt;&lt;/em&gt;</description>", "valid.en", 1686),
]
TAG_LINES = {
    "en": ["<url>http://www.ted.com/talks/lang/eng/al_gore_on_averting_climate_crisis.html</url>",
           "<keywords>talks, alternative energy, cars, climate change, culture, environment</keywords>",
           "<talkid>1</talkid>", "<title>Al Gore: Averting the climate crisis</title>"],
    "de": ["<url>http://www.ted.com/talks/lang/ger/al_gore_on_averting_climate_crisis.html</url>",
           "<keywords>talks, alternative energy, cars, climate change, culture, environment</keywords>",
           "<talkid>1</talkid>", "<title>Al Gore: Den Klimawandel abwenden</title>"],
}


def test_iwslt14_tag_stripping_and_tokenisation_match_fairseq_output():
    for lang, raw, name, n in IWSLT_LINES:
        expected = lines(IWSLT / "tok" / name)[n - 1]
        (text,) = H.strip_train_tags([raw])
        assert H.tokenize_line(text, lang, lowercase=True) == expected, raw
    # the train.tags header: url/keywords/talkid lines go, the title stays without its tags
    assert list(H.strip_train_tags(TAG_LINES["en"] + ["It's that pyramid."])) == \
        ["Al Gore: Averting the climate crisis", "It's that pyramid."]
    # why MosesTokenizerPerl exists: plain sacremoses keeps "U.K." at the end of a line
    from sacremoses import MosesTokenizer
    raw, expected = IWSLT_LINES[2][1], lines(IWSLT / "tok" / "valid.en")[232]
    assert MosesTokenizer(lang="en").tokenize(raw, return_str=True).lower() != expected
    # the IWSLT xml segments are extracted as fairseq's sed does: entities kept, ’ -> '
    segs = list(H.xml_segments(['<seg id="7"> The R&amp;D piece, it’s crazy how little it’s funded. </seg>',
                                "<url>http://x</url>"], unescape=False, curly_apostrophe=True))
    assert [H.tokenize_line(s, "en", lowercase=True) for s in segs] == [lines(IWSLT / "tok" / "test.en")[2714]]


def _xml(name: str, lang: str, segs: list[str]) -> str:
    head_ = ['<?xml version="1.0" encoding="UTF-8"?>', "<mteval>", f'<srcset setid="{name}" srclang="{lang}">',
             '<doc docid="535" genre="lectures">', "<url>http://www.ted.com/talks/x.html</url>",
             "<description>TED Talk Subtitles and Transcript: x</description>", "<talkid>535</talkid>",
             "<title>A talk</title>"]
    return "\n".join(head_ + [f'<seg id="{i}"> {s} </seg>' for i, s in enumerate(segs, 1)]
                     + ["</doc>", "</srcset>", "</mteval>"]) + "\n"


def _raw(name: str, n: int) -> str:
    return next(raw for _, raw, f, m in IWSLT_LINES if (f, m) == (name, n))


# training pairs (as places in fairseq's output) that clean-corpus keeps, and pairs it drops
GOOD_PAIRS = [(("valid.de", 1), ("valid.en", 1)), (("valid.de", 17), ("valid.en", 233)),
              (("valid.de", 4075), ("valid.en", 4075)), (("valid.de", 838), ("valid.en", 2))]
BAD_PAIRS = [("Ja.", "Yes, yes, yes, this is a long answer."),   # length ratio 5
             ("", "Empty German side."), ("wort " * 176, "word " * 176)]   # 176 tokens


def make_iwslt_folder(root: Path, n_train: int = 300, extra_en_line: bool = False) -> Path:
    """A de-en/ folder in WIT3's format: train.tags with talk headers (Multi30k text as the transcripts, plus
    GOOD_PAIRS and BAD_PAIRS) and the five xml dev/test sets."""
    folder = root / "de-en"
    folder.mkdir(parents=True)
    text = {lang: lines(DATA / "multi30k" / f"train.{lang}")[:n_train] for lang in ("de", "en")}
    text["de"] += [_raw(*de) for de, _ in GOOD_PAIRS] + [de for de, _ in BAD_PAIRS]
    text["en"] += [_raw(*en) for _, en in GOOD_PAIRS] + [en for _, en in BAD_PAIRS]
    for lang in ("de", "en"):
        body = []
        for i, line in enumerate(text[lang]):
            if i % 100 == 0:
                body += TAG_LINES[lang]
            body.append(line)
        if extra_en_line and lang == "en":
            body.append("One line too many.")
        (folder / f"train.tags.de-en.{lang}").write_text("\n".join(body) + "\n", encoding="utf-8")
        val = lines(DATA / "multi30k" / f"val.{lang}")
        for k, name in enumerate(TEST_SETS):
            segs = val[10 * k:10 * k + 10]
            if k == 4 and lang == "en":
                segs[-1] = "The R&amp;D piece, it’s crazy how little it’s funded."
            (folder / f"{name}.de-en.{lang}.xml").write_text(_xml(name, lang, segs), encoding="utf-8")
    return folder


def test_iwslt14_full_pipeline_from_tgz(tmp_path):
    folder = make_iwslt_folder(tmp_path / "orig")
    tgz = tmp_path / "de-en.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(folder, arcname="de-en")
    out = tmp_path / "iwslt14"
    ok("prepare-iwslt14.sh", "--merges", 200, tgz, out)
    prep, tmp = out / "prep", out / "prep" / "tmp"

    # train.tags: no url/keywords/talkid line survives, titles keep their text (one title per 100 lines)
    tok = {lang: lines(tmp / f"train.tags.de-en.tok.{lang}") for lang in ("de", "en")}
    assert len(tok["de"]) == len(tok["en"]) == 300 + len(GOOD_PAIRS) + len(BAD_PAIRS) + 4
    assert not [x for x in tok["en"] + tok["de"] if "url" in x or "talkid" in x or "keywords" in x or "&lt;" in x]
    assert tok["en"].count("Al Gore : Averting the climate crisis") == 4
    # clean-corpus (1..175 tokens, ratio 1.5), then lowercase
    expected = [(d, e) for d, e in zip(tok["de"], tok["en"])
                if 1 <= len(d.split()) <= 175 and 1 <= len(e.split()) <= 175
                and len(d.split()) / len(e.split()) <= 1.5 and len(e.split()) / len(d.split()) <= 1.5]
    cleaned = {lang: lines(tmp / f"train.tags.de-en.{lang}") for lang in ("de", "en")}
    assert cleaned["de"] == [" ".join(d.split()).lower() for d, _ in expected]
    assert cleaned["en"] == [" ".join(e.split()).lower() for _, e in expected]
    n_pairs = len(expected)
    assert 280 < n_pairs <= 300 + len(GOOD_PAIRS) + 4
    for de, en in GOOD_PAIRS:
        i = cleaned["de"].index(lines(IWSLT / "tok" / de[0])[de[1] - 1])
        assert cleaned["en"][i] == lines(IWSLT / "tok" / en[0])[en[1] - 1]
    assert "ja ." not in cleaned["de"] and "empty german side ." not in cleaned["en"]
    assert not [x for x in cleaned["en"] if "word word" in x]
    # valid = every 23rd line, train = the rest
    for lang in ("de", "en"):
        assert lines(prep / f"valid.tok.{lang}") == cleaned[lang][22::23]
        assert lines(prep / f"train.tok.{lang}") == [x for i, x in enumerate(cleaned[lang], 1) if i % 23]
    # test = the five sets in fairseq's order, segments tokenised and lowercased
    for lang in ("de", "en"):
        per_set = [lines(tmp / f"{name}.de-en.{lang}") for name in TEST_SETS]
        assert lines(prep / f"test.tok.{lang}") == sum(per_set, [])
        val = lines(DATA / "multi30k" / f"val.{lang}")
        assert per_set[1][0] == H.tokenize_line(val[10], lang, lowercase=True)
    assert lines(prep / "test.tok.en")[-1] == lines(IWSLT / "tok" / "test.en")[2714]   # "r &amp; amp ; d"

    # joint BPE on train.de + train.en, applied everywhere, then binarised with one dictionary
    code = lines(out / "code")
    assert code[0].startswith("#version") and 100 < len(code) <= 201
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            assert_bpe_of(prep / f"{split}.bpe.{lang}", prep / f"{split}.tok.{lang}")
    counts = {"train": n_pairs - n_pairs // 23, "valid": n_pairs // 23, "test": 50}
    assert_binarised(out, "de-en", ["train", "valid", "test"], counts, prep)


def test_iwslt14_bad_input(tmp_path):
    p = "prepare-iwslt14.sh"
    out = tmp_path / "out"
    fails(p, tmp_path / "nowhere" / "de-en.tgz", out, expect="pass --download")
    err = fails(p, "--download", tmp_path / "dl" / "de-en.tgz", out, expect="download of http://127.0.0.1:9/",
                env={"IWSLT14_URL": "http://127.0.0.1:9/de-en.tgz"})
    assert "offline" in err and not (tmp_path / "dl" / "de-en.tgz").exists()
    bad = make_iwslt_folder(tmp_path / "uneven", n_train=30, extra_en_line=True)
    fails(p, bad, out, expect="text lines but")
    (bad / "IWSLT14.TED.tst2011.de-en.de.xml").unlink()
    fails(p, bad, out, expect="IWSLT14.TED.tst2011.de-en.de.xml")
    (tmp_path / "not-a.tgz").write_text("hello\n")
    fails(p, tmp_path / "not-a.tgz", out, expect="cannot extract")
    fails(p, "--merges", "many", bad, out, expect="--merges")
    # BPE-only mode: code file, dictionary, tokenised splits
    tok = tmp_path / "tok"
    head(IWSLT / "tok" / "valid.de", tok / "valid.de", 20)
    head(IWSLT / "tok" / "valid.en", tok / "valid.en", 19)
    fails(p, "--bpe-only", tok, out, expect="--bpe-only needs --code")
    fails(p, "--bpe-only", "--code", tmp_path / "no-code", tok, out, expect="missing BPE code file")
    fails(p, "--bpe-only", "--code", IWSLT / "bpe" / "code", "--dict", tmp_path / "no-dict.txt", tok, out,
          expect="missing dictionary")
    fails(p, "--bpe-only", "--code", IWSLT / "bpe" / "code", tok, out, expect="valid.de has 20 lines but")
    (tok / "valid.en").unlink()
    fails(p, "--bpe-only", "--code", IWSLT / "bpe" / "code", tok, out, expect="missing")


# ------------------------------------------------------------------------------------------------- WMT14 En-Fr
LOCAL_CORPORA = ["europarl_en_fr/europarl-v7.sampleA", "europarl_en_fr/europarl-v7.sampleB.tok",
                 "bible_fr_en/train", "libreoffice_help_en_fr/train"]
N_TRAIN, N_VALID = 300, 200


@pytest.fixture(scope="module")
def wmt_shared(tmp_path_factory) -> Path:
    """The shared data folder's layout with the first lines of the local corpora; newstest2014 full (sgm + raw)."""
    root = tmp_path_factory.mktemp("shared")
    for corpus in LOCAL_CORPORA:
        for lang in ("en", "fr"):
            head(DATA / f"{corpus}.{lang}", root / f"{corpus}.{lang}", N_TRAIN)
    for lang in ("en", "fr"):
        head(WMT / f"newstest2013.tok.{lang}", root / "wmt14_en_fr" / f"newstest2013.tok.{lang}", N_VALID)
    for name in ("newstest2014-fren-src.en.sgm", "newstest2014-fren-ref.fr.sgm", "newstest2014-fren.en",
                 "newstest2014-fren.fr"):
        shutil.copy(WMT / name, root / "wmt14_en_fr" / name)
    return root


@pytest.fixture(scope="module")
def wmt_out(wmt_shared, tmp_path_factory) -> Path:
    """The pipeline on the local corpora (the fallback), newstest2014 from its sgm files, 300 merges."""
    out = tmp_path_factory.mktemp("wmt") / "wmt14_en_fr"
    ok("prepare-wmt14en2fr.sh", "--data", wmt_shared, "--test-format", "sgm", "--merges", 300, out)
    return out


def test_wmt14_sgm_and_raw_newstest2014_are_the_same_text(wmt_out):
    for lang, sgm in (("en", "newstest2014-fren-src.en.sgm"), ("fr", "newstest2014-fren-ref.fr.sgm")):
        raw = lines(WMT / f"newstest2014-fren.{lang}")
        assert len(raw) == 3003
        assert list(H.xml_segments(lines(WMT / sgm))) == raw
        # the script's sgm path: its raw reference is the raw file, byte for byte
        assert (wmt_out / f"test.raw.{lang}").read_bytes() == (WMT / f"newstest2014-fren.{lang}").read_bytes()
    assert H.xml_unescape("R&amp;D &lt;b&gt; &quot;x&quot; it&apos;s &#233;t&#xE9; &amp;lt;") == \
        "R&D <b> \"x\" it's été &lt;"
    assert list(H.xml_segments(['<seg id="1"> AT&amp;T’s 5 &lt; 6 </seg>', "<doc>"])) == ["AT&T’s 5 < 6"]


def test_wmt14_newstest2013_is_detokenised_and_unescaped(wmt_out):
    for lang in ("en", "fr"):
        tok = lines(WMT / f"newstest2013.tok.{lang}")[:N_VALID]
        raw = lines(wmt_out / f"valid.raw.{lang}")
        assert len(raw) == N_VALID
        assert not [x for x in raw if "&apos;" in x or "&quot;" in x or "&amp;" in x or " , " in x]
        assert "d'Obama" in raw[0] or lang == "en"
        # tokenising the detokenised text again gives newstest2013.tok back, except that today's tokenizer.perl
        # splits the final period of "U.S.A." (newstest2013 was tokenised by an older Moses)
        again = [H.tokenize_line(x, lang) for x in raw]
        diff = [(a, b) for a, b in zip(again, tok) if a != b]
        assert len(diff) <= N_VALID // 50
        assert all(a == b[:-1] + " ." for a, b in diff), diff


def test_wmt14_pipeline_outputs(wmt_out, wmt_shared):
    prep = wmt_out / "prep"
    # training text: the four local corpora in order, the Moses-tokenised Europarl sample detokenised
    train_raw = lines(prep / "train.raw.en")
    assert len(train_raw) == len(lines(prep / "train.raw.fr")) == 4 * N_TRAIN
    assert train_raw[:N_TRAIN] == lines(wmt_shared / f"{LOCAL_CORPORA[0]}.en")
    assert train_raw[3 * N_TRAIN:] == lines(wmt_shared / f"{LOCAL_CORPORA[3]}.en")
    assert not [x for x in train_raw[N_TRAIN:2 * N_TRAIN] if "&apos;" in x or "&quot;" in x]
    # the same tokenisation on every set: normalised punctuation, aggressive hyphen splits, XML escapes
    valid_tok = lines(prep / "valid.tok.fr")
    assert valid_tok[0] == "Une stratégie républicaine pour contrer la réélection d&apos; Obama"
    assert "États @-@ Unis" in valid_tok[2]
    assert lines(prep / "test.tok.en")[3] == "A black box in your car ?"
    assert [H.tokenize_line(x, "fr", aggressive=True, normalize=True) for x in lines(wmt_out / "test.raw.fr")[:50]] \
        == lines(prep / "test.tok.fr")[:50]
    # BPE, then clean-corpus on train only (ratio 1.5, 1..250 tokens)
    for split in ("train", "valid", "test"):
        for lang in ("en", "fr"):
            assert_bpe_of(prep / f"{split}.bpe.{lang}", prep / f"{split}.tok.{lang}")
    clean_en, clean_fr = lines(prep / "train.clean.en"), lines(prep / "train.clean.fr")
    assert 0.5 * 4 * N_TRAIN < len(clean_en) < 4 * N_TRAIN
    for e, f in zip(clean_en, clean_fr):
        ne, nf = len(e.split()), len(f.split())
        assert 1 <= ne <= 250 and 1 <= nf <= 250 and ne / nf <= 1.5 and nf / ne <= 1.5
    assert_binarised(wmt_out, "en-fr", ["train", "valid", "test"],
                     {"train": len(clean_en), "valid": N_VALID, "test": 3003}, prep, train_name="train.clean")


def test_wmt14_user_training_folder_gives_the_same_data(wmt_out, wmt_shared, tmp_path):
    """--train DIR (fairseq's layout: other language pairs, gz, dev sets beside), raw newstest2014 and a separate
    newstest2013 folder give the same files as the local fallback with sgm: same training text, test text,
    BPE codes, dictionary and binaries."""
    train = tmp_path / "corpora"
    (train / "training").mkdir(parents=True)
    for i, corpus in enumerate(LOCAL_CORPORA):
        name = f"{i}-{Path(corpus).name}"
        for lang in ("en", "fr"):
            shutil.copy(wmt_shared / f"{corpus}.{lang}", train / "training" / f"{name}.{lang}")
        if i == 2:
            for lang in ("en", "fr"):
                f = train / "training" / f"{name}.{lang}"
                Path(f"{f}.gz").write_bytes(gzip.compress(f.read_bytes()))
                f.unlink()
    head(DATA / "bible_de_en" / "train.en", train / "training" / "europarl-v7.de-en.en", 50)   # no French side
    head(DATA / "bible_de_en" / "train.de", train / "training" / "europarl-v7.de-en.de", 50)
    for lang in ("en", "fr"):                                                                 # never trained on
        head(WMT / f"newstest2014-fren.{lang}", train / "dev" / f"newstest2012.{lang}", 50)
    tests, dev = tmp_path / "test-full", tmp_path / "dev"
    for folder, names in ((tests, ("newstest2014-fren.en", "newstest2014-fren.fr")),
                          (dev, ("newstest2013.tok.en", "newstest2013.tok.fr"))):
        folder.mkdir()
        for name in names:
            shutil.copy(wmt_shared / "wmt14_en_fr" / name, folder / name)
    out = tmp_path / "wmt14_en_fr"
    proc = ok("prepare-wmt14en2fr.sh", "--train", train, "--test-dir", tests, "--valid-dir", dev, "--merges", 300,
              out)
    assert "skipping" in proc.stderr and "not training on test set" in proc.stderr
    for f in sorted(wmt_out.iterdir()):
        if f.is_file() and f.name != "preprocess.log":
            assert f.read_bytes() == (out / f.name).read_bytes(), f.name


def test_wmt14_bad_input(tmp_path, wmt_shared):
    p = "prepare-wmt14en2fr.sh"
    out = tmp_path / "out"
    train = tmp_path / "train"
    head(DATA / "bible_fr_en" / "train.en", train / "bible.en", 10)
    head(DATA / "bible_fr_en" / "train.fr", train / "bible.fr", 9)
    fails(p, "--train", train, "--data", wmt_shared, out, expect="bible.en has 10 lines but")
    fails(p, "--train", tmp_path / "none", out, expect="missing training folder")
    head(DATA / "bible_fr_en" / "train.fr", train / "bible.fr", 10)
    tests = tmp_path / "tests"
    for lang in ("en", "fr"):
        head(WMT / f"newstest2014-fren.{lang}", tests / f"newstest2014-fren.{lang}", 30)
    fails(p, "--train", train, "--test-dir", tests, out, expect="missing newstest2013")
    for lang in ("en", "fr"):
        head(WMT / f"newstest2013.tok.{lang}", tests / f"newstest2013.tok.{lang}", 30)
    fails(p, "--train", train, "--test-dir", tests, "--test-format", "sgm", out,
          expect="newstest2014-fren-src.en.sgm")
    sgm = lines(WMT / "newstest2014-fren-ref.fr.sgm")
    (tests / "newstest2014-fren-ref.fr.sgm").write_text("\n".join(sgm[:-10]) + "\n", encoding="utf-8")
    shutil.copy(WMT / "newstest2014-fren-src.en.sgm", tests)
    fails(p, "--train", train, "--test-dir", tests, "--test-format", "sgm", out, expect="3003 lines but")
    head(WMT / "newstest2014-fren.fr", tests / "newstest2014-fren.fr", 29)
    fails(p, "--train", train, "--test-dir", tests, out, expect="newstest2014-fren.en has 30 lines but")
    fails(p, "--train", train, "--test-dir", tests, "--merges", "0", out, expect="--merges")
    fails(p, "--train", train, "--test-dir", tests, "--test-format", "xml", out, expect="--test-format")


# -------------------------------------------------------------------------------------------------------- MTNT
def test_mtnt_encoded_for_a_model(wmt_out, tmp_path):
    """MTNT with the BPE codes and dictionaries of another folder (the WMT14 one); valid from the split files,
    test from the tsv."""
    mtnt = tmp_path / "mtnt"
    for lang in ("en", "fr"):
        head(MTNT / f"valid.en-fr.{lang}", mtnt / f"valid.en-fr.{lang}", 80)
    head(MTNT / "test.en-fr.tsv", mtnt / "test.en-fr.tsv", 60)
    out = tmp_path / "mtnt-bin"
    ok("prepare-mtnt.sh", wmt_out, out, mtnt)
    assert (out / "valid.raw.en").read_bytes() == (mtnt / "valid.en-fr.en").read_bytes()
    for lang in ("en", "fr"):   # the tsv columns are the published split files
        assert lines(out / f"test.raw.{lang}") == lines(MTNT / f"test.en-fr.{lang}")[:60]
        assert (out / f"dict.{lang}.txt").read_bytes() == (wmt_out / f"dict.{lang}.txt").read_bytes()
    from subword_nmt.apply_bpe import BPE
    with open(wmt_out / "code", encoding="utf-8") as codes:
        bpe = BPE(codes)
    for split in ("valid", "test"):
        for lang in ("en", "fr"):
            tok = lines(out / "prep" / f"{split}.tok.{lang}")
            assert lines(out / "prep" / f"{split}.bpe.{lang}") == [bpe.process_line(x) for x in tok]
    assert_binarised(out, "en-fr", ["valid", "test"], {"valid": 80, "test": 60}, out / "prep")


def test_mtnt_bad_input(tmp_path, wmt_out):
    p = "prepare-mtnt.sh"
    out = tmp_path / "out"
    model = tmp_path / "model"
    model.mkdir()
    for f in ("code", "dict.en.txt"):
        shutil.copy(wmt_out / f, model / f)
    fails(p, model, out, expect="has no dict.fr.txt")
    fails(p, tmp_path / "none", out, expect="missing model folder")
    shutil.copy(wmt_out / "dict.fr.txt", model / "dict.fr.txt")
    mtnt = tmp_path / "mtnt"
    head(MTNT / "valid.en-fr.en", mtnt / "valid.en-fr.en", 12)
    head(MTNT / "valid.en-fr.fr", mtnt / "valid.en-fr.fr", 11)
    fails(p, model, out, mtnt, expect="valid.en-fr.en has 12 lines but")
    fails(p, model, out, tmp_path / "no-mtnt", expect="missing MTNT folder")
    (mtnt / "valid.en-fr.en").unlink()
    (mtnt / "valid.en-fr.fr").unlink()
    (mtnt / "valid.en-fr.tsv").write_text("1\tHello there\n", encoding="utf-8")
    fails(p, model, out, mtnt, expect="2 tab-separated fields")
    fails(p, model, expect="usage")
