"""The vocabulary map (compress.vocab_map, `export-ct2 --vocab-map`): candidates from co-occurrence, written in
CTranslate2's format, loaded and applied by CTranslate2 with use_vmap=True."""
from __future__ import annotations

import ctranslate2

from conftest import run
from helpers import load_stock, sample_batch

from fairseq_headprune.prune.vocab_map import VocabMapOptions, cooccurrence, most_frequent, top_targets, vmap_lines


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
