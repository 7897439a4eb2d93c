"""The deployable folder `export-ct2` writes and `fairseq-headprune translate`: raw sentences in, fairseq-generate's
detokenised hypotheses out (float32), from a copy of the folder in another directory, for Moses + subword-nmt (the
tiny model and the bundled De-En model) and SentencePiece (under translation and under the multilingual task); the
folder's README snippet run as written gives the same; bad folders and options are one line. Every input line
gives one output line, in order, streamed in bounded memory: a source longer than the model's positions is
truncated, bytes that are not UTF-8 are read as U+FFFD (each with a warning naming the line, exit code 3), an empty
line is answered empty; a folder whose vmap.txt does not fit its model is refused."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import ctranslate2
import pytest

import families as fam
from conftest import ENV, ROOT, SLICE, run, run_fairseq

from fairseq_headprune.prune.translate import UNTRANSLATED_EXIT, RawTranslator, TranslateOptions, length_groups
from fairseq_headprune.prune.translate import run as translate_stream

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
    return run(["fairseq-headprune", "translate", folder, *extra], check=check,
               input="\n".join(lines) + "\n")


def readme_snippet(folder, lines, tmp_path):
    """The folder's README snippet (its ```python block), as written, run alone in a fresh interpreter on `lines`:
    (the snippet, its output lines)."""
    snippet = re.search(r"```python\n(.*?)```", (folder / "README.md").read_text(), re.S).group(1)
    script = tmp_path / "snippet.py"
    script.write_text(snippet, encoding="utf-8")
    alone = subprocess.run([sys.executable, script, folder], input="\n".join(lines) + "\n", capture_output=True,
                           text=True, env=ENV, check=True)
    return snippet, alone.stdout.splitlines()


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
    snippet, alone = readme_snippet(folder, source, tmp_path)
    assert "fairseq" not in "".join(line for line in snippet.splitlines() if "import" in line)
    assert alone == reference

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
    # an empty line (or one of spaces) is answered empty, not sent to the model with its language token alone
    out, warnings, _ = in_process(folder, [b"", *(x.encode() for x in source[:3]), b"  \t", b""])
    assert out == ["", *got[:3], "", ""] and not warnings
    assert readme_snippet(folder, source, tmp_path)[1] == reference


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


# --------------------------------------------------------------------------------------------- every line answered

MOSES_BPE = ["--tokenizer", "moses", "--moses-no-escape", "-s", "de", "-t", "en", "--bpe", "subword_nmt"]
WARNING = re.compile(r"fairseq-headprune translate: warning: line (\d+): (.*)")
# the console script's entry in a process that reports its own peak memory (KiB) as its last stderr line
PEAK_MEMORY = ("import resource, sys\n"
               "from fairseq_headprune import cli\n"
               "try:\n    code = cli.main(['translate', *sys.argv[1:]])\n"
               "except SystemExit as e:\n    code = e.code\n"
               "sys.stderr.write(f'peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\\n')\n"
               "sys.exit(code)\n")


@pytest.fixture(scope="module")
def quick_folder(tiny_data, stock_checkpoint, tmp_path_factory) -> Path:
    """The tiny model exported with its Moses and subword-nmt settings, greedy, at most 4 tokens a hypothesis: cheap
    enough to translate 100k lines."""
    out = tmp_path_factory.mktemp("quick") / "model"
    run(["fairseq-headprune", "export-ct2", tiny_data, "--path", stock_checkpoint, "--out", out, "--gen-subset",
         "test", "--check-sentences", "16", *MOSES_BPE, "--bpe-codes", tiny_data / "code", "--beam", "1",
         "--max-len-b", "4", "--max-tokens", "800"])
    return out


def in_process(folder, raw_lines, **options):
    """translate's library call on byte lines: the outputs, the warnings (number, notes), the counts."""
    out, warnings = [], []
    counts = translate_stream(TranslateOptions(folder=str(folder), compute_type="float32", **options),
                              (line + b"\n" for line in raw_lines), out.append,
                              lambda number, notes: warnings.append((number, notes)))
    return out, warnings, counts


def translate_file(folder, path: Path, *extra):
    """The console script's translate of a file through stdin: exit code, stdout bytes, warnings, peak KiB."""
    with open(path, "rb") as stdin:
        proc = subprocess.run([sys.executable, "-c", PEAK_MEMORY, str(folder), *extra], stdin=stdin,
                              capture_output=True, env=ENV)
    stderr = proc.stderr.decode("utf-8").strip().splitlines()
    peak = int(stderr[-1].split()[1])
    warnings = [(int(m.group(1)), m.group(2)) for m in map(WARNING.match, stderr) if m]
    return proc.returncode, proc.stdout, warnings, stderr[:-1], peak


def test_a_long_stream_with_bad_lines_gives_one_line_each_in_bounded_memory(quick_folder, tmp_path):
    """20k lines, the bad ones among the first thousand: a 2,000-word line, bytes that are not UTF-8, empty lines.
    Each line padded with 1,900 trailing spaces (read and stripped, as fairseq-interactive strips them) so the input
    is some 38 MB: a translate that held it would peak that much above its own run over the first thousand lines,
    which holds every kind of line and batch. The padding, not the line count, makes the input large: each line
    costs a translation, each space only its read."""
    n = 20_000
    sentences = [x.encode() for x in (SLICE / "test.de").read_text(encoding="utf-8").splitlines()[:8]]
    bad = {11: b"", 21: " ".join(["Hund"] * 2000).encode(), 31: b"ein \xff\xfe Hund", 41: b"  \t ",
           500: b"zwei M\xe4nner", n: b""}
    with open(tmp_path / "in.de", "wb") as f:
        for number in range(1, n + 1):
            f.write(bad.get(number, sentences[number % 8] + b" " * 1900) + b"\n")
    with open(tmp_path / "in.de", "rb") as f, open(tmp_path / "head.de", "wb") as head:
        head.writelines(line for _, line in zip(range(1000), f))

    code, out, warnings, stderr, peak = translate_file(quick_folder, tmp_path / "in.de", "--batch-size", "64")
    lines = out.split(b"\n")
    assert code == UNTRANSLATED_EXIT and lines[-1] == b"" and len(lines) - 1 == n, (code, stderr[-3:])
    assert [number for number, _ in warnings] == [21, 31, 500], warnings
    assert "truncated to the first 1023" in warnings[0][1] and "not UTF-8" in warnings[1][1]
    assert stderr[-1] == f"fairseq-headprune translate: 3 of {n} lines not translated as given (named above): exit " \
                         f"code {UNTRANSLATED_EXIT}"
    assert all(lines[i - 1] == b"" for i in (11, 41, n)) and all(lines[i - 1] for i in (21, 31, 500))
    assert sum(1 for line in lines[:-1] if not line) == 3
    assert lines[1:9] == lines[9 * 8 + 1:9 * 8 + 9]  # in order: the 8 sentences recur every 8 lines
    _, head_out, _, _, head_peak = translate_file(quick_folder, tmp_path / "head.de", "--batch-size", "64")
    assert head_out.split(b"\n")[:960] == lines[:960] and head_out.count(b"\n") == 1000  # the same batches
    assert peak - head_peak < 16 * 1024, (peak, head_peak)  # KiB: the 37 MB input is never held


def test_a_source_longer_than_the_positions_is_truncated_as_ctranslate2_would(quick_folder):
    """2,000 words (one subword each) against the model's 1024 positions: the first 1023 and EOS, what
    CTranslate2's own max_input_length=1024 keeps, and one warning naming the line."""
    long_line, kept = " ".join(["Hund"] * 2000), " ".join(["Hund"] * 1023)
    out, warnings, counts = in_process(quick_folder, [b"ein Hund", long_line.encode(), kept.encode()])
    assert counts == (3, 1) and [n for n, _ in warnings] == [2]
    assert warnings[0][1] == ("2000 source tokens, more than the model's 1024 positions hold with EOS: truncated "
                              "to the first 1023",)
    assert out[1] == out[2]
    alone = ctranslate2.Translator(str(quick_folder), device="cpu", intra_threads=1).translate_batch(
        [["Hund"] * 2000], max_input_length=1024, beam_size=1, max_decoding_length=4)
    assert out[1] == RawTranslator(str(quick_folder)).decode(alone[0].hypotheses[0])


def test_bytes_that_are_not_utf8_are_read_as_replacement_characters(quick_folder):
    out, warnings, counts = in_process(quick_folder, [b"ein Hund", b"ein \xff Hund \xc3", b"zwei M\xc3\xa4nner"])
    assert counts == (3, 1) and warnings == [(2, ("bytes that are not UTF-8, read as U+FFFD",))]
    same, none, _ = in_process(quick_folder, ["ein \ufffd Hund \ufffd".encode()])
    assert out[1] == same[0] and not none


def test_the_input_is_read_a_batch_at_a_time(quick_folder):
    read = []

    def lines():
        for i in range(200):
            read.append(i)
            yield b"ein Hund\n"

    def write(text):
        written.append(len(read))

    written = []
    translate_stream(TranslateOptions(folder=str(quick_folder), batch_size=16), lines(), write, print)
    assert len(written) == 200 and all(seen <= i + 16 for i, seen in enumerate(written, 1)), written


def test_a_batch_with_a_long_source_is_split_by_attention_area():
    assert length_groups([10] * 32) == [list(range(32))]  # the whole batch fits: one call, in order
    assert length_groups([1024, 10, 10, 1000, 20]) == [[0, 3], [1, 2, 4]]
    assert length_groups([1024] * 3) == [[0, 1], [2]]
    assert [len(g) for g in length_groups([300] * 64)] == [23, 23, 18]  # 23 x 300^2 within 2^21


def test_exit_codes_are_in_the_help():
    proc = run(["fairseq-headprune", "translate", "--help"])
    text = " ".join(proc.stdout.split())
    assert "exit codes: 0 every line translated; 2 nothing translated" in text
    assert f"{UNTRANSLATED_EXIT} every line answered, but some not as given" in text


def test_a_folder_whose_map_does_not_fit_its_model_is_refused(quick_folder, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(quick_folder, folder)
    cases = [(b"\x8f\xff\x00\x13 random\n\x00", "line 1 is not UTF-8"),
             ("\tA\nHund\tdog unknownword\n".encode(), "line 2: target word 'unknownword' is not in")]
    for content, message in cases:
        (folder / "vmap.txt").write_bytes(content)
        got = run(["fairseq-headprune", "translate", folder], check=False)
        lines = got.stderr.strip().splitlines()
        assert got.returncode == 2 and len(lines) == 1 and "vmap.txt does not fit this model" in lines[0], lines
        assert message in lines[0] and lines[0].startswith("fairseq-headprune translate: error: ")
    (folder / "vmap.txt").write_text("\tA man\nHund\tdog\n", encoding="utf-8")
    assert in_process(folder, [b"ein Hund"])[2] == (1, 0)  # a map that fits
    (folder / "vmap.txt").unlink()
    settings = (folder / "translate.json").read_text().replace('"num_hypotheses": 1', '"num_hypotheses": 1, '
                                                                                       '"use_vmap": true')
    (folder / "translate.json").write_text(settings)
    got = run(["fairseq-headprune", "translate", folder], check=False)
    assert got.returncode == 2 and "lacks vmap.txt" in got.stderr
