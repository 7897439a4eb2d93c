"""`compress --keep-vocab`: the vocabulary trimmed as a lever of the run, on the tiny model (one table shared by its
stacks): the cost table times the output layer at the share the trim keeps and every prediction counts it, the
export trims the recovered model (checked against it) and ships the trimmed checkpoint with its dictionaries, the
measure and the report read DATA as binarised for the untrimmed model through the trim, and a rerun without the
option ships the whole vocabulary again (the trimmed dictionaries gone from OUT)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from conftest import run
from fairseq_headprune.prune import vocabulary as prune_vocabulary
from test_compress import compress_argv

LINES = 60  # of train's pairs whose tokens are kept: a share of the tiny dictionary, not all of it


def _part(source: Path, out: Path) -> Path:
    out.write_text("".join(source.read_text(encoding="utf-8").splitlines(keepends=True)[:LINES]), encoding="utf-8")
    return out


def _symbols(path: Path):
    return [line.split()[0] for line in path.read_text(encoding="utf-8").splitlines()]


def test_the_trimmed_vocabulary_is_timed_predicted_shipped_and_scored(tiny_data, stock_checkpoint, tmp_path,
                                                                     monkeypatch):
    corpora = [_part(tiny_data / f"train.bpe.{lang}", tmp_path / f"part.{lang}") for lang in ("de", "en")]
    out, cache = tmp_path / "out", tmp_path / "cache"
    argv = compress_argv(tiny_data, stock_checkpoint, out, cache, "--beam", "1", "--shape", "3/2x1",
                         "--budget-epochs", "0", "--recover-args", "", "--keep-vocab", *corpora,
                         target=("--speedup", "1.2"))
    reads, read = [], prune_vocabulary.corpus_of_file
    monkeypatch.setattr(prune_vocabulary, "corpus_of_file", lambda path: reads.append(path) or read(path))
    printed = run(argv).stdout
    assert sorted(reads) == sorted(map(str, corpora))  # each corpus read once: preflight, plan, export alike
    record = json.loads((out / "compress.json").read_text())
    exported = record["stages"]["export"]
    vocabulary = exported["vocabulary"]
    before, after = vocabulary["source"]["before"], vocabulary["source"]["after"]
    assert vocabulary["one_dictionary"] and vocabulary["target"]["after"] == after < before
    share = 100.0 * after / before
    # the cost table's output-layer row is the trim's share, removable; the given shape is predicted with it
    rows = [r for r in record["stages"]["cost-table"]["rows"] if r["field"] == "vocab_percent"]
    assert [(round(r["value"], 6), r["removable"]) for r in rows] == [(round(share, 6), True)]
    assert f"every shape predicted with the output layer trimmed to {share:.1f}% of the target words" in printed
    identity = json.loads((out / "stages" / "cost-table" / "stage.json").read_text())["identity"]
    assert [lv["percents"] for lv in identity["levers"] if lv["field"] == "vocab_percent"] == [[share]]
    # the trim checked against the recovered model, and what ships: OUT/model.pt trimmed, its dictionaries beside
    assert vocabulary["check"]["sentences_checked"] > 0 and vocabulary["check"]["max_logit_diff"] <= 1e-4
    state = torch.load(out / "model.pt", map_location="cpu", weights_only=False)
    assert state["model"]["decoder.output_projection.weight"].shape[0] == after
    assert state["cfg"]["vocabulary_trim"]["kept_ids"] == vocabulary["kept_ids"]
    kept = set(_symbols(out / "dict.de.txt"))
    assert _symbols(out / "dict.de.txt") == _symbols(out / "dict.en.txt") and len(kept) + 4 == after
    corpus = set((tmp_path / "part.de").read_text().split()) | set((tmp_path / "part.en").read_text().split())
    assert corpus <= kept
    shared = json.loads((out / "ct2" / "shared_vocabulary.json").read_text())
    assert len(shared) == after and set(shared[4:]) == kept
    # the measure and the report ran the trimmed model (its FLOPs count the smaller output layer)
    measured, reported = record["stages"]["measure"], record["stages"]["report"]
    assert measured["flop_ratio"] > 1.0 and reported["sentences"] > 0 and "bleu_delta" in reported
    card = (out / "MODEL_CARD.md").read_text()
    assert f"| vocabulary (one table for both sides) | {before:,} | {after:,} |" in card
    assert "The vocabulary was trimmed after the recovery to what the deployment needs (`--keep-vocab`)" in card
    assert "the embeddings and output layer keep the vocabulary below" in card
    memory = vocabulary["memory"]
    mib = [memory[f"ct2_float32_weight_bytes_{side}"] / 2**20 for side in ("after", "before")]
    assert f"Its weights take {mib[0]:.2f} MiB in a float32 CTranslate2 model against {mib[1]:.2f} MiB" in card
    # the check sentences' hypotheses: how many changed, each with its cause
    changes = vocabulary["hypotheses"]
    assert changes["subset"] == "valid" and changes["sentences"] == 16
    assert changes["changed"] == changes["dropped_source_token"] + changes["dropped_target_token"] + changes["search"]
    assert f"Of the first 16 sentences of 'valid', decoded in fairseq by both, {changes['changed']} hypotheses" in card
    # the same command: every stage cached; without --keep-vocab the cost table (its output-layer row at half) and
    # every stage after it run again and the whole vocabulary ships, the trimmed dictionaries gone from OUT
    again = run(argv).stdout
    assert "export: cached" in again and "report: cached" in again
    whole = [a for a in argv if a not in ("--keep-vocab", *map(str, corpora), *corpora)]
    again = run(whole).stdout
    assert "cost-table: done" in again and "export: done" in again and not list(out.glob("dict.*.txt"))
    state = torch.load(out / "model.pt", map_location="cpu", weights_only=False)
    assert state["model"]["decoder.output_projection.weight"].shape[0] == before


def test_keep_vocab_refusals_are_one_line_before_any_work(tiny_data, stock_checkpoint, tmp_path):
    corpus = _part(tiny_data / "train.bpe.de", tmp_path / "part.de")
    wrong = _part(tiny_data / "train.bpe.de", tmp_path / "part.fr")
    cases = [
        (("--keep-vocab", corpus, "--engine", "fairseq"), "--keep-vocab: --engine fairseq times and scores"),
        (("--keep-vocab-floor", "100"), "--keep-vocab-floor is the floor of --keep-vocab"),
        (("--keep-vocab", wrong), "its suffix .fr names no language of the pairs kept"),
        (("--keep-vocab", tmp_path / "missing.de"), "no such file"),
    ]
    for i, (extra, message) in enumerate(cases):
        out = tmp_path / f"out{i}"
        proc = run(compress_argv(tiny_data, stock_checkpoint, out, tmp_path / "cache", *extra), check=False)
        assert proc.returncode == 2, (extra, proc.stderr[-500:])
        assert message in proc.stderr.strip().splitlines()[-1], (extra, proc.stderr[-500:])
        assert not out.exists(), extra
