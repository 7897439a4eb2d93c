"""The vocabulary map (prune.vocab_map, `export-ct2 --vocab-map`): candidates from co-occurrence, written in
CTranslate2's format, loaded and applied by CTranslate2 with use_vmap=True; a map that costs more BLEU on the check
slice than --vocab-map-max-loss, and map options given without --vocab-map (export-ct2 and compress), are one line
and exit code 2 with nothing written; a folder's map is checked against its vocabularies."""
from __future__ import annotations

import json
import re

import ctranslate2
import pytest

from conftest import run
from helpers import load_stock, sample_batch

from fairseq_headprune.errors import UserError
from fairseq_headprune.prune.vocab_map import (VocabMapBound, VocabMapOptions, check_vmap, cooccurrence,
                                               most_frequent, top_targets, vmap_lines)


def test_candidates_are_the_most_co_occurring_targets_and_the_most_frequent_ones():
    sources = [[0, 1], [0, 2], [0, 1, 1]]
    targets = [[5, 6], [5, 7, 7], [6, 6, 8]]
    counts = cooccurrence(sources, targets, 3, 9).toarray()
    # source 1 occurs in pairs 0 and 2 (counted once per sentence): targets 5 once, 6 three times, 8 once
    assert counts[1].tolist() == [0, 0, 0, 0, 0, 1, 3, 0, 1]
    assert top_targets(cooccurrence(sources, targets, 3, 9), 2) == {0: [5, 6], 1: [5, 6], 2: [5, 7]}
    assert most_frequent(targets, 9, 2) == [5, 6]  # 6 three times; 5 and 7 twice: the lower id
    lines = vmap_lines(sources, targets, ["a", "b", "c"], [f"t{i}" for i in range(9)],
                       VocabMapOptions(vocab_map_per_source=1, vocab_map_frequent=1), skip_source=[2])
    # the most frequent token is every batch's already: each source token's list holds the next ones
    assert lines == ["\tt6", "a\tt5", "b\tt5"]
    assert top_targets(cooccurrence(sources, targets, 3, 9), 1, exclude=[5, 6]) == {0: [7], 1: [8], 2: [7]}


def _translate(folder, task, batch, **kw):
    src_dict = task.source_dictionary
    sources = [[src_dict[t] for t in row if t not in (src_dict.pad(), src_dict.eos())]
               for row in batch["net_input"]["src_tokens"].tolist()]
    translator = ctranslate2.Translator(str(folder), device="cpu", intra_threads=1)
    results = translator.translate_batch(sources, beam_size=4, max_decoding_length=60, **kw)
    return sources, [r.hypotheses[0] for r in results]


def test_export_writes_a_map_ctranslate2_applies(stock_checkpoint, tiny_data, tmp_path):
    common = ["fairseq-headprune", "export-ct2", tiny_data, "--path", stock_checkpoint, "--gen-subset", "test",
              "--beam", "4", "--max-len-b", "60", "--max-tokens", "800", "--check-sentences", "24", "--vocab-map"]
    model, task = load_stock(stock_checkpoint, tiny_data)
    batch = sample_batch(task, n=12)
    # a map letting every target word in changes nothing
    wide = tmp_path / "wide"
    proc = run(common + ["--out", str(wide), "--vocab-map-per-source", "100000", "--vocab-map-frequent", "100000"])
    assert (wide / "vmap.txt").exists()
    assert "vocabulary map:" in proc.stdout and "with it 0 of 24 hypotheses change" in proc.stdout, proc.stdout
    assert _translate(wide, task, batch, use_vmap=True) == _translate(wide, task, batch)
    # a tight one (one candidate per source word, none always) confines every output word to the batch's candidates
    tight = tmp_path / "tight"
    run(common + ["--out", str(tight), "--vocab-map-per-source", "1", "--vocab-map-frequent", "0"])
    rules = dict(line.rstrip("\n").split("\t") for line in (tight / "vmap.txt").read_text().splitlines())
    assert rules.pop("") == ""
    sources, hypotheses = _translate(tight, task, batch, use_vmap=True)
    allowed = {w for s in sources for t in s for w in rules.get(t, "").split()}
    assert allowed and all(w in allowed for h in hypotheses for w in h)
    assert hypotheses != _translate(tight, task, batch)[1]


def test_a_bad_map_size_is_one_line(stock_checkpoint, tiny_data, tmp_path):
    proc = run(["fairseq-headprune", "export-ct2", tiny_data, "--path", stock_checkpoint, "--out",
                str(tmp_path / "x"), "--vocab-map", "--vocab-map-per-source", "0"], check=False)
    assert proc.returncode == 2 and "--vocab-map-per-source must be at least 1" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def _one_line_refusal(proc, command: str, *words: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"fairseq-headprune {command}: error: "), lines
    assert all(w in lines[0] for w in words), (words, lines[0])
    return lines[0]


def test_map_options_without_vocab_map_are_refused_before_any_work(stock_checkpoint, tiny_data, tmp_path):
    """export-ct2 and compress share VocabMapOptions: a map option without --vocab-map would be ignored (compress
    --speedup weighs the map by default: there, with --no-vocab-map)."""
    cases = [(["--vocab-map-per-source", "5"], "--vocab-map-per-source"),
             (["--vocab-map-frequent", "0"], "--vocab-map-frequent"),
             (["--vocab-map-max-loss", "2"], "--vocab-map-max-loss"),
             (["--force-vocab-map"], "--force-vocab-map")]
    for extra, flag in cases:
        proc = run(["fairseq-headprune", "export-ct2", tiny_data, "--path", stock_checkpoint, "--out",
                    tmp_path / "x", *extra], check=False)
        _one_line_refusal(proc, "export-ct2", flag, "needs --vocab-map")
    for extra, flag in cases[:2]:
        proc = run(["fairseq-headprune", "compress", tiny_data, "--path", stock_checkpoint, "--out", tmp_path / "c",
                    "--speedup", "1.2", "--no-vocab-map", "--cost-cache", tmp_path / "cache", *extra], check=False)
        _one_line_refusal(proc, "compress", flag, "needs --vocab-map")
    assert not any(tmp_path.iterdir())
    with pytest.raises(UserError, match="--vocab-map-max-loss must be at least 0"):
        VocabMapBound(vocab_map_max_loss=-1).check(enabled=True)
    with pytest.raises(UserError, match="--vocab-map-max-loss must be a finite number"):
        VocabMapBound(vocab_map_max_loss=float("nan")).check(enabled=True)


def test_a_map_is_judged_by_what_it_costs_on_the_check_slice():
    change = {"sentences": 100, "differing": 30, "bleu_without": 30.0, "bleu_with": 28.5}
    with pytest.raises(UserError) as refused:
        VocabMapBound().judge(change, "test")
    assert str(refused.value) == (
        "--vocab-map: the map costs 1.50 BLEU on the 100 check sentences of 'test' (30.00 -> 28.50, 30 hypotheses "
        "change), more than --vocab-map-max-loss 1: nothing written (--force-vocab-map writes it anyway)")
    VocabMapBound(vocab_map_max_loss=1.5).judge(change, "test")  # at the bound: kept
    VocabMapBound(force_vocab_map=True).judge(change, "test")
    VocabMapBound().judge({**change, "bleu_with": 31.0}, "test")  # a map that gains
    with pytest.raises(UserError):
        VocabMapBound(vocab_map_max_loss=0).judge({**change, "bleu_with": 29.99}, "test")


def test_a_map_that_costs_more_than_the_bound_is_refused_and_nothing_written(stock_checkpoint, tiny_data,
                                                                              tmp_path):
    """The tight map (one candidate per source word, none always) costs the tiny model BLEU at beam 1 (the tiny
    model scores about 0.1 BLEU, so the bound here is 0: the default 1 is tested on numbers above)."""
    common = ["fairseq-headprune", "export-ct2", tiny_data, "--path", stock_checkpoint, "--gen-subset", "test",
              "--beam", "1", "--max-len-b", "20", "--max-tokens", "800", "--check-sentences", "24", "--vocab-map",
              "--vocab-map-per-source", "1", "--vocab-map-frequent", "0"]
    forced = run(common + ["--out", tmp_path / "forced", "--force-vocab-map", "--vocab-map-max-loss", "0"])
    before, after = map(float, re.search(r"BLEU ([\d.]+) -> ([\d.]+)", forced.stdout).groups())
    assert after < before, forced.stdout  # what the refusal below rests on
    assert (tmp_path / "forced" / "vmap.txt").is_file()
    refused = run(common + ["--out", tmp_path / "refused", "--vocab-map-max-loss", "0"], check=False)
    _one_line_refusal(refused, "export-ct2", f"costs {before - after:.2f} BLEU", "--vocab-map-max-loss 0",
                      "nothing written", "--force-vocab-map")
    assert not (tmp_path / "refused").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ct2-export-")]  # no staging left behind


def test_a_folder_map_is_checked_against_the_model_vocabularies(tmp_path):
    (tmp_path / "source_vocabulary.json").write_text(json.dumps(["<s>", "<blank>", "</s>", "<unk>", "ein", "Hund"]))
    (tmp_path / "target_vocabulary.json").write_text(json.dumps(["<s>", "<blank>", "</s>", "<unk>", "a", "dog"]))
    vmap = tmp_path / "vmap.txt"
    vmap.write_text("\ta\nein\ta dog\nHund\tdog\nein Hund\t\n")
    check_vmap(str(tmp_path), str(vmap))  # fits: an n-gram key and an empty candidate list included
    cases = [(b"\x8f\xff\x00random\tbytes\n", "line 1 is not UTF-8"),
             ("\ta\nein\tcat\n".encode(), "line 2: target word 'cat' is not in the model's target vocabulary"),
             ("Katze\ta\n".encode(), "line 1: source word 'Katze' is not in the model's source vocabulary"),
             ("\ta\nno tab here\n".encode(), "line 2: not SOURCE<TAB>TARGETS"),
             ("\ta\n\nein\ta\n".encode(), "line 2: not SOURCE<TAB>TARGETS"),
             ("ein\ta\tdog\n".encode(), "line 1: not SOURCE<TAB>TARGETS"),
             ("ein\ta  dog\n".encode(), "target word '' is not")]
    for content, message in cases:
        vmap.write_bytes(content)
        with pytest.raises(UserError, match=re.escape(message)):
            check_vmap(str(tmp_path), str(vmap))
    (tmp_path / "source_vocabulary.json").rename(tmp_path / "shared_vocabulary.json")
    (tmp_path / "target_vocabulary.json").unlink()
    vmap.write_text("ein\tein\n")
    check_vmap(str(tmp_path), str(vmap))  # a shared vocabulary serves both sides
