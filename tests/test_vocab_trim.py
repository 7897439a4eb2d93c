"""shrink --keep-vocab: the vocabulary trimmed to what a deployment needs, on a tiny bilingual model (separate source
and target embeddings, the output layer tied to the decoder's) and the tiny multilingual one (one shared table,
language tokens): stock fairseq loads the trimmed checkpoint with the dictionaries written beside it, export-ct2
writes the trimmed vocabularies, and every hypothesis that changes (fairseq and CTranslate2 float32) changes through
a dropped token.

A hypothesis may change when a source token was dropped (it becomes <unk>), when the untrimmed hypothesis holds a
dropped token (the trimmed model cannot produce it), or, at beam > 1 only, when the softmax normalised over the kept
tokens gives each prefix back a different share of the dropped tokens' probability and near-equal beams reorder.
The test proves all three at once: at beams 1 and 5 the trimmed model's hypotheses are those of the untrimmed model
forbidden the dropped tokens (an output bias of -1e9 on each, dropped source tokens read as <unk>); at beam 1 every
change has a dropped token in its source or untrimmed hypothesis. The counts are printed (pytest -s).
"""
from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path
from typing import Dict, List, Sequence, Set

import ctranslate2
import pytest
import torch

import families as fam
from conftest import _cached_data, cached_build, copy_cached, run, run_fairseq, stock_key, train
from fairseq_headprune.fairseq_io.loading import PACKAGE_DIR
from fairseq_headprune.prune.vocab_trim import hypothesis_changes

# the bilingual model: separate source and target embeddings, the output layer tied to the decoder's; trained
# longer than conftest's stock model, whose hypotheses are two sentences repeated (nothing to compare)
SEPARATE = ["--arch", "transformer", "--share-decoder-input-output-embed",
            "--encoder-layers", "2", "--encoder-attention-heads", "4", "--decoder-layers", "2",
            "--decoder-attention-heads", "4", "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
            "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128"]
UPDATES = 500
PART = 300  # training pairs whose tokens are kept
FLOOR = 100
MULTI = [*fam.MULTI_TASK[:2], "--lang-pairs", "de-en", "--encoder-langtok", "src", "--decoder-langtok",
         "-s", "de", "-t", "en"]


@pytest.fixture(scope="module")
def bilingual(tmp_path_factory) -> Path:
    key = stock_key() + hashlib.sha256(repr((SEPARATE, UPDATES)).encode()).hexdigest()[:16]
    cached = cached_build("vocab-bilingual", key, lambda out: train(_cached_data(), out, updates=UPDATES,
                                                                    arch=SEPARATE))
    return copy_cached(cached, tmp_path_factory.mktemp("bilingual")) / "checkpoint_last.pt"


def _part(source: Path, out: Path, n: int = PART) -> Path:
    out.write_text("".join(source.read_text(encoding="utf-8").splitlines(keepends=True)[:n]), encoding="utf-8")
    return out


def _symbols(dict_file: Path) -> List[str]:
    return [line.split()[0] for line in dict_file.read_text(encoding="utf-8").splitlines()]


def _hypotheses(stdout: str) -> Dict[int, List[str]]:
    out = {}
    for line in stdout.splitlines():
        if line.startswith("H-"):
            head, _score, *text = line.split("\t")
            out[int(head[2:])] = text[0].split() if text else []
    return out


def _generate(data, checkpoint, beam: int, *extra) -> Dict[int, List[str]]:
    """Stock fairseq-generate (no --user-dir unless `extra` gives it): each sentence's best hypothesis."""
    proc = run_fairseq(["fairseq-generate", data, "--path", checkpoint, "--gen-subset", "test", "--beam", beam,
                        "--max-tokens", "2000", *extra])
    return _hypotheses(proc.stdout)


def _changes(sources: List[List[str]], full: Dict[int, List[str]], trimmed: Dict[int, List[str]],
             source_kept: Set[str], target_kept: Set[str]) -> Dict[str, list]:
    """The sentences whose hypotheses differ, by what dropped token explains it: one in the source (read as <unk>),
    one in the untrimmed hypothesis (which the trimmed model cannot produce), or neither (the beams reordered by
    the softmax normalised over the kept tokens; _forbidding reproduces those)."""
    assert sorted(full) == sorted(trimmed) == list(range(len(sources)))
    in_source = {i for i in full if any(t not in source_kept for t in sources[i])}
    in_hypothesis = {i for i in full if any(t not in target_kept for t in full[i])} - in_source
    changed = [i for i in full if full[i] != trimmed[i]]
    return {"changed": changed, "source": [i for i in changed if i in in_source],
            "hypothesis": [i for i in changed if i in in_hypothesis],
            "reordered": [i for i in changed if i not in in_source | in_hypothesis]}


def _report(name: str, engine: str, beam: int, changes: Dict[str, list], total: int) -> str:
    line = (f"{name}, {engine}, beam {beam}: {len(changes['changed'])} of {total} hypotheses changed: "
            f"{len(changes['source'])} with a dropped source token, {len(changes['hypothesis'])} whose untrimmed "
            f"hypothesis holds a dropped token, {len(changes['reordered'])} beams reordered by the softmax over the "
            "kept tokens")
    print(line)
    return line


def _check_changes(name: str, engine: str, sources, full: Dict[int, Dict], trimmed: Dict[int, Dict],
                   forbidden: Dict[int, Dict], kept) -> None:
    """The trimmed model's hypotheses are the untrimmed model's forbidden the dropped tokens (at every beam), and at
    beam 1 every change has a dropped token in the source or the untrimmed hypothesis."""
    for beam in full:
        changes = _changes(sources, full[beam], trimmed[beam], *kept)
        line = _report(name, engine, beam, changes, len(sources))
        differing = [i for i in trimmed[beam] if trimmed[beam][i] != forbidden[beam][i]]
        assert not differing, f"{line}; {len(differing)} differ from the untrimmed model forbidden the dropped tokens"
        if beam == 1:
            assert not changes["reordered"], line
        assert len(changes["changed"]) < len(sources) / 3, line


def _loaded(data, checkpoint, *extra):
    """The model and task as fairseq-generate loads them (this package's loader)."""
    from fairseq_headprune import cli
    from fairseq_headprune.cli import export_ct2 as command
    from fairseq_headprune.fairseq_io.loading import load

    argv = [data, "--path", checkpoint, "--out", "unused", "--gen-subset", "test", "--max-tokens", "2000", *extra]
    cfg, _ = cli.parse("export-ct2", command, [str(a) for a in argv])
    return load(cfg)


def _forbidding(loaded, source_kept: Set[str], target_kept: Set[str]):
    """The untrimmed model forbidden the dropped tokens: a -1e9 output bias on each, and the source map sending a
    dropped source token to <unk> (what the trimmed dictionaries do)."""
    src, tgt = loaded.task.source_dictionary, loaded.task.target_dictionary
    model = copy.deepcopy(loaded.model)
    projection = model.decoder.output_projection
    biased = torch.nn.Linear(projection.in_features, projection.out_features)
    biased.weight = projection.weight
    biased.bias = torch.nn.Parameter(torch.tensor([0.0 if i < tgt.nspecial or tgt[i] in target_kept else -1e9
                                                   for i in range(len(tgt))]))
    model.decoder.output_projection = biased
    source_map = torch.tensor([i if i < src.nspecial or src[i] in source_kept else src.unk() for i in range(len(src))])
    return model, source_map


def _decode(loaded, model, beam: int, source_map=None) -> Dict[int, List[str]]:
    """Each test sentence's best hypothesis as fairseq-generate prints it (its symbols stripped), in this process."""
    from fairseq_headprune.fairseq_io.loading import batches

    generation = copy.deepcopy(loaded.cfg.generation)
    generation.beam = beam
    generator = loaded.task.build_generator([model], generation)
    strip = set(generator.symbols_to_strip_from_output) | {loaded.task.target_dictionary.eos()}
    out = {}
    for sample in batches(loaded, "test")[1]:
        if source_map is not None:
            net = {**sample["net_input"], "src_tokens": source_map[sample["net_input"]["src_tokens"]]}
            sample = {**sample, "net_input": net}
        with torch.no_grad():
            for sid, nbest in zip(sample["id"].tolist(), loaded.task.inference_step(generator, [model], sample)):
                out[sid] = [loaded.task.target_dictionary[t] for t in nbest[0]["tokens"].tolist() if t not in strip]
    return out


def _ct2(folder: Path, sources: List[List[str]], beam: int, prefix: Sequence[str] = ()) -> Dict[int, List[str]]:
    """CTranslate2's best hypotheses (the source language token, then the target's forced, under `prefix`)."""
    translator = ctranslate2.Translator(str(folder), device="cpu", intra_threads=1)
    results = translator.translate_batch([[*prefix[:1], *s] for s in sources], beam_size=beam, max_input_length=0,
                                         max_decoding_length=200,
                                         target_prefix=[list(prefix[1:])] * len(sources) if prefix[1:] else None)
    return {i: [t for t in r.hypotheses[0] if t not in prefix[1:]] for i, r in enumerate(results)}


def _ct2_forbidding(loaded, model, folder: Path) -> Path:
    """The forbidding model as a float32 CTranslate2 model (its -1e9 bias written as the output layer's)."""
    from fairseq_headprune.engines.ct2_spec import build_spec, write_model

    spec = build_spec(model, loaded.task.source_dictionary, loaded.task.target_dictionary, "relu")
    write_model(spec, str(folder), None)
    return folder


def _ct2_vocabulary(folder: Path) -> Dict[str, List[str]]:
    files = {p.name.split("vocabulary")[0].rstrip("_") or "shared": p for p in folder.glob("*vocabulary.json")}
    return {side: json.loads(p.read_text(encoding="utf-8")) for side, p in files.items()}


def _export(data, checkpoint, out, *extra):
    return run(["fairseq-headprune", "export-ct2", data, "--path", checkpoint, "--out", out, "--gen-subset", "test",
                "--beam", "1", "--max-tokens", "2000", "--check-sentences", "48", *extra])


def _compare_engines(name: str, untrimmed, trimmed, tmp_path: Path, sources, kept, task=(), trimmed_task=(),
                     prefix=()) -> Dict[int, Dict[int, List[str]]]:
    """fairseq (stock fairseq-generate for both models; the forbidding model in this process) and CTranslate2
    float32 (export-ct2 of both; the forbidding model written here), at beams 1 and 5. Returns the trimmed model's
    hypotheses from stock fairseq-generate, by beam."""
    (data, checkpoint), (trimmed_data, trimmed_checkpoint) = untrimmed, trimmed
    loaded = _loaded(data, checkpoint, *task)
    model, source_map = _forbidding(loaded, *kept)
    full = {b: _generate(data, checkpoint, b, *task) for b in (1, 5)}
    generated = {b: _generate(trimmed_data, trimmed_checkpoint, b, *trimmed_task) for b in (1, 5)}
    forbidden = {b: _decode(loaded, model, b, source_map) for b in (1, 5)}
    _check_changes(name, "fairseq", sources, full, generated, forbidden, kept)
    _export(data, checkpoint, tmp_path / "ct2-full", *task)
    _export(trimmed_data, trimmed_checkpoint, tmp_path / "ct2-trim", *trimmed_task)
    _ct2_forbidding(loaded, model, tmp_path / "ct2-forbidding")
    unk = [[t if t in kept[0] else "<unk>" for t in s] for s in sources]
    full = {b: _ct2(tmp_path / "ct2-full", sources, b, prefix) for b in (1, 5)}
    cut = {b: _ct2(tmp_path / "ct2-trim", sources, b, prefix) for b in (1, 5)}
    forbidden = {b: _ct2(tmp_path / "ct2-forbidding", unk, b, prefix) for b in (1, 5)}
    _check_changes(name, "CTranslate2", sources, full, cut, forbidden, kept)
    return generated


# ------------------------------------------------------------------------------------------- bilingual


def test_bilingual_trim_loads_in_stock_fairseq_and_ctranslate2_and_changes_only_what_a_dropped_token_explains(
        bilingual, tiny_data, tmp_path):
    corpora = [_part(tiny_data / f"train.bpe.{lang}", tmp_path / f"part.{lang}") for lang in ("de", "en")]
    model_dir = tmp_path / "trimmed"
    model_dir.mkdir()
    proc = run(["fairseq-headprune", "shrink", tiny_data, "--path", bilingual, "--keep-vocab", *corpora,
                "--keep-vocab-floor", FLOOR, "--out", model_dir / "model.pt", "--max-tokens", "2000"])
    assert "vocabulary: source 520 -> " in proc.stdout and "CTranslate2 float32" in proc.stdout, proc.stdout
    record = json.loads((model_dir / "model.json").read_text())["vocabulary"]
    source_kept, target_kept = (set(_symbols(model_dir / f"dict.{lang}.txt")) for lang in ("de", "en"))
    # the kept tokens: every corpus token of its side, in the original order with the original counts
    for lang, kept, side in (("de", source_kept, "source"), ("en", target_kept, "target")):
        original = (tiny_data / f"dict.{lang}.txt").read_text(encoding="utf-8").splitlines()
        written = (model_dir / f"dict.{lang}.txt").read_text(encoding="utf-8").splitlines()
        assert written == [line for line in original if line.split()[0] in kept]
        corpus = set((tmp_path / f"part.{lang}").read_text(encoding="utf-8").split())
        assert corpus <= kept and record[side]["after"] == len(written) + 4 < record[side]["before"] == 520
        assert record["kept_ids"][side][:4] == [0, 1, 2, 3] and len(record["kept_ids"][side]) == len(written) + 4
    assert not record["one_dictionary"] and record["source"]["after"] != record["target"]["after"]
    assert [c["sha256"] for c in record["corpora"]] == [hashlib.sha256(p.read_bytes()).hexdigest() for p in corpora]
    memory = record["memory"]
    assert memory["parameters_after"] < memory["parameters_before"]
    assert memory["ct2_float32_weight_bytes_after"] < memory["ct2_float32_weight_bytes_before"]
    assert not list(tmp_path.rglob(".ct2-*")) and not list(model_dir.glob("*.bin"))  # sized from the spec alone
    assert record["check"]["sentences_checked"] > 0 and record["check"]["max_logit_diff"] <= 1e-4
    state = torch.load(model_dir / "model.pt", map_location="cpu", weights_only=False)
    assert state["cfg"]["model"].arch == "transformer"  # the source's architecture: stock fairseq builds it
    assert state["cfg"]["vocabulary_trim"]["kept_ids"] == record["kept_ids"]
    assert state["model"]["decoder.output_projection.weight"].shape[0] == record["target"]["after"]
    # the test set binarised against the trimmed dictionaries, decoded by stock fairseq (no --user-dir)
    data = tmp_path / "data"
    run_fairseq(["fairseq-preprocess", "-s", "de", "-t", "en", "--srcdict", model_dir / "dict.de.txt", "--tgtdict",
                 model_dir / "dict.en.txt", "--testpref", tiny_data / "test.bpe", "--destdir", data, "--workers", "1"])
    sources = [line.split() for line in (tiny_data / "test.bpe.de").read_text(encoding="utf-8").splitlines()]
    generated = _compare_engines("bilingual", (tiny_data, bilingual), (data, model_dir / "model.pt"), tmp_path,
                                 sources, (source_kept, target_kept))
    # the weights' bytes are those of the float32 models export-ct2 writes, less the names and shapes of each weight
    for folder, side in (("ct2-full", "before"), ("ct2-trim", "after")):
        written, weights = (tmp_path / folder / "model.bin").stat().st_size, memory[f"ct2_float32_weight_bytes_{side}"]
        assert 0 < written - weights < 16 * 1024, (folder, written, weights)
    # fairseq-interactive with the trimmed model's folder as its data folder, on tokenized text
    lines = (tiny_data / "test.bpe.de").read_text(encoding="utf-8").splitlines(keepends=True)[:3]
    proc = run(["fairseq-interactive", model_dir, "--path", model_dir / "model.pt", "-s", "de", "-t", "en", "--beam",
                "5"], input="".join(lines))
    assert _hypotheses(proc.stdout) == {i: generated[5][i] for i in range(3)}, proc.stdout
    vocabularies = _ct2_vocabulary(tmp_path / "ct2-trim")  # the exported vocabularies are the trimmed dictionaries
    assert len(vocabularies["source"]) == record["source"]["after"] and set(vocabularies["source"][4:]) == source_kept
    assert len(vocabularies["target"]) == record["target"]["after"] and set(vocabularies["target"][4:]) == target_kept
    # the trimmed checkpoint given DATA as binarised for the untrimmed model: read through the trim (DATA's ids
    # mapped, a dropped token as <unk>), it decodes as stock fairseq does on the data binarised for it
    through = _loaded(tiny_data, model_dir / "model.pt")
    assert len(through.task.source_dictionary) == record["source"]["after"]
    decoded = {beam: _decode(through, through.model, beam) for beam in (1, 5)}
    assert decoded == generated
    # what changed and why, as the compress card counts it (prune.vocab_trim.hypothesis_changes), against this
    # test's own count at the loaders' beam (5)
    untrimmed = _loaded(tiny_data, bilingual)
    expected = _changes(sources, _decode(untrimmed, untrimmed.model, 5), decoded[5], source_kept, target_kept)
    specials = {"<s>", "<pad>", "</s>", "<unk>"}
    counted = hypothesis_changes(untrimmed, through, "test", len(sources), source_kept | specials,
                                 target_kept | specials)
    assert counted == {"subset": "test", "sentences": len(sources), "changed": len(expected["changed"]),
                       "dropped_source_token": len(expected["source"]),
                       "dropped_target_token": len(expected["hypothesis"]), "search": len(expected["reordered"])}
    assert counted["changed"] > 0, counted  # (the test's trim drops tokens these sentences use)
    _export(tiny_data, model_dir / "model.pt", tmp_path / "ct2-through")  # its check: fairseq against CTranslate2
    assert _ct2_vocabulary(tmp_path / "ct2-through") == vocabularies


def test_heads_and_vocabulary_removed_together(bilingual, tiny_data, tmp_path):
    corpora = [_part(tiny_data / f"train.bpe.{lang}", tmp_path / f"part.{lang}") for lang in ("de", "en")]
    model_dir = tmp_path / "trimmed"
    model_dir.mkdir()
    proc = run(["fairseq-headprune", "shrink", tiny_data, "--path", bilingual, "--remove", "25%", "--keep-vocab",
                *corpora, "--out", model_dir / "model.pt", "--max-tokens", "2000", "--calibration-sentences", "40"])
    assert "removed 6 heads" in proc.stdout and "dict.de.txt, dict.en.txt beside it" in proc.stdout, proc.stdout
    record = json.loads((model_dir / "model.json").read_text())
    assert record["heads_kept"] == 18 and record["vocabulary"]["floor"] is None
    assert record["params_after"] == record["vocabulary"]["memory"]["parameters_after"] < record["params_before"]
    assert record["options"]["keep_vocab"] == [str(p) for p in corpora]
    data = tmp_path / "data"
    run_fairseq(["fairseq-preprocess", "-s", "de", "-t", "en", "--srcdict", model_dir / "dict.de.txt", "--tgtdict",
                 model_dir / "dict.en.txt", "--testpref", tiny_data / "test.bpe", "--destdir", data, "--workers", "1"])
    hypotheses = _generate(data, model_dir / "model.pt", 2, "--user-dir", PACKAGE_DIR)
    assert len(hypotheses) == 200


# ------------------------------------------------------------------------------------------- multilingual


def test_multilingual_trim_keeps_the_language_tokens_of_the_pair_and_one_shared_table(tmp_path):
    spm = fam.spm_data()
    corpora = [_part(spm / f"train.spm.{lang}", tmp_path / f"part.{lang}") for lang in ("de", "en")]
    model_dir = tmp_path / "trimmed"
    model_dir.mkdir()
    run(["fairseq-headprune", "shrink", spm, "--path", fam.multilingual(), *MULTI, "--keep-vocab", *corpora,
         "--keep-vocab-floor", FLOOR, "--out", model_dir / "model.pt", "--max-tokens", "2000"])
    record = json.loads((model_dir / "model.json").read_text())["vocabulary"]
    assert record["one_dictionary"] and record["shared_embeddings"] and record["languages"] == ["de", "en"]
    assert record["source"] == record["target"] and record["source"]["appended"] == ["__de__", "__en__"]
    assert (model_dir / "langs.txt").read_text() == "de\nen\n"
    assert (model_dir / "dict.de.txt").read_text() == (model_dir / "dict.en.txt").read_text()
    kept = set(_symbols(model_dir / "dict.de.txt")) | {"__de__", "__en__"}
    assert len(kept) + 4 == record["source"]["after"] < record["source"]["before"] == 602
    state = torch.load(model_dir / "model.pt", map_location="cpu", weights_only=False)["model"]
    assert state["encoder.embed_tokens.weight"].shape[0] == record["source"]["after"]
    data = tmp_path / "data"
    run_fairseq(["fairseq-preprocess", "-s", "de", "-t", "en", "--srcdict", model_dir / "dict.de.txt", "--tgtdict",
                 model_dir / "dict.en.txt", "--testpref", spm / "test.spm", "--destdir", data, "--workers", "1"])
    shutil.copy(model_dir / "langs.txt", data / "langs.txt")
    sources = [line.split() for line in (spm / "test.spm.de").read_text(encoding="utf-8").splitlines()]
    generated = _compare_engines("multilingual", (spm, fam.multilingual()), (data, model_dir / "model.pt"),
                                 tmp_path, sources, (kept, kept), MULTI, [*MULTI, "--lang-dict", data / "langs.txt"],
                                 ["__de__", "__en__"])
    vocabularies = _ct2_vocabulary(tmp_path / "ct2-trim")
    assert list(vocabularies) == ["shared"] and len(vocabularies["shared"]) == record["source"]["after"]
    # with DATA as binarised for the untrimmed model: each file's ids mapped as the data manager reads them, the
    # language tokens then added from the trimmed dictionary; it decodes as stock fairseq does on the data
    # binarised for it, and exports the same vocabulary
    through = _loaded(spm, model_dir / "model.pt", *MULTI)
    assert len(through.task.source_dictionary) == record["source"]["after"]
    assert {beam: _decode(through, through.model, beam) for beam in (1, 5)} == generated
    _export(spm, model_dir / "model.pt", tmp_path / "ct2-through", *MULTI)
    assert _ct2_vocabulary(tmp_path / "ct2-through") == vocabularies
    assert vocabularies["shared"][-2:] == ["__de__", "__en__"]


# ------------------------------------------------------------------------------------------- the pure functions


def test_rows_are_selected_and_sharing_kept(stock_checkpoint, tiny_data):
    from fairseq_headprune.core.surgery import trim_vocabulary, vocabulary_modules
    from helpers import load_stock, sample_batch, teacher_forced_logits

    model, task = load_stock(stock_checkpoint, tiny_data)  # --share-all-embeddings
    ids = list(range(4)) + list(range(10, 300, 3))
    with pytest.raises(ValueError, match="one list of ids"):
        vocabulary_modules(model, ids, ids[:-1])
    with pytest.raises(ValueError, match="begin with the special symbols"):
        vocabulary_modules(model, ids[1:], ids[1:])
    source, target, projection = vocabulary_modules(model, ids, ids)
    assert source is target and projection.weight is target.weight and target.padding_idx == 1
    assert model.encoder.embed_tokens.num_embeddings == 520  # untouched
    batch = sample_batch(task, n=6)
    keep = torch.tensor(ids)
    inverse = torch.full((520,), 3, dtype=torch.long)  # dropped ids read as <unk> in both
    inverse[keep] = torch.arange(len(ids))
    net = batch["net_input"]
    for name in ("src_tokens", "prev_output_tokens"):
        net[name] = keep[inverse[net[name]]]  # the batch holds kept tokens only
    before = teacher_forced_logits(model, batch)[..., keep]
    trimmed = trim_vocabulary(copy.deepcopy(model), ids, ids)
    mapped = {**batch, "net_input": {**net, "src_tokens": inverse[net["src_tokens"]],
                                     "prev_output_tokens": inverse[net["prev_output_tokens"]]}}
    torch.testing.assert_close(teacher_forced_logits(trimmed, mapped), before, rtol=0, atol=1e-5)


def _dictionary(symbols_counts):
    from fairseq.data import Dictionary

    d = Dictionary()
    for symbol, count in symbols_counts:
        d.add_symbol(symbol, n=count)
    return d


def test_the_floor_adds_the_most_frequent_and_a_pair_keeps_its_language_tokens(tmp_path):
    from fairseq.data import Dictionary

    from fairseq_headprune.prune.vocabulary import TaskVocabulary, plan_side

    d = _dictionary([("a", 50), ("b", 40), ("c", 40), ("d", 30), ("e", 5)])
    augment = {"lang_tok_style": "multilingual", "langtoks_specs": ["main"], "extra_data": None}
    full = TaskVocabulary(("de",), ("en",), ("de", "en", "fr"), ("de", "en", "fr"), augment)
    full.appended(d, full.languages)  # as the task loaded it: __de__ __en__ __fr__ appended
    layout = TaskVocabulary(("de",), ("en",), ("de", "en", "fr"), ("de", "en"), augment)
    side = plan_side(d, layout, frozenset({"e", "zz"}), floor=9)
    # specials 4 + __de__ __en__ 2 + e: 7; the floor adds a (50) and b (40, before c by dictionary order)
    assert side.dictionary.symbols == ["<s>", "<pad>", "</s>", "<unk>", "a", "b", "e", "__de__", "__en__"]
    assert side.old_ids == [0, 1, 2, 3, 4, 5, 8, 9, 10]
    assert side.summary["from_corpora"] == 1 and side.summary["from_floor"] == 2
    assert side.summary["corpus_types_not_in_dictionary"] == 1 and side.summary["appended"] == ["__de__", "__en__"]
    assert side.text == "a 50\nb 40\ne 5\n"
    (tmp_path / "dict.de.txt").write_text(side.text)
    reloaded = Dictionary.load(str(tmp_path / "dict.de.txt"))  # what the task builds from the written file
    layout.appended(reloaded, ["de", "en"])
    assert reloaded.symbols == side.dictionary.symbols and reloaded.count == side.dictionary.count
    no_floor = plan_side(d, layout, frozenset({"e"}), floor=None)
    assert no_floor.dictionary.symbols[4:] == ["e", "__de__", "__en__"]


def test_tasks_and_models_that_cannot_be_trimmed_are_named():
    from fairseq.tasks.translation_from_pretrained_bart import TranslationFromPretrainedBARTTask

    from fairseq_headprune.errors import UserError
    from fairseq_headprune.prune.vocab_trim import refuse_untrimmable
    from fairseq_headprune.prune.vocabulary import task_vocabulary

    with pytest.raises(UserError, match="mBART"):
        task_vocabulary(object.__new__(TranslationFromPretrainedBARTTask))
    with pytest.raises(UserError, match="not translation"):
        task_vocabulary(object())

    class Decoder(torch.nn.Module):
        embed_tokens = torch.nn.Embedding(8, 2)
        adaptive_softmax = object()
        output_projection = None

    class Model(torch.nn.Module):
        encoder = Decoder()
        decoder = Decoder()

    with pytest.raises(UserError, match="adaptive softmax"):
        refuse_untrimmable(Model())


# ------------------------------------------------------------------------------------------- refusals


def test_bad_input_is_one_line_before_any_work(stock_checkpoint, tiny_data, tmp_path):
    good = _part(tiny_data / "train.bpe.de", tmp_path / "part.de", 50)
    (tmp_path / "empty.de").write_text(" \n\n")
    (tmp_path / "latin1.de").write_bytes("Mädchen\n".encode("latin-1"))
    _part(tiny_data / "train.bpe.de", tmp_path / "part.txt", 50)
    out = tmp_path / "out" / "small.pt"
    out.parent.mkdir()
    cases = [
        (["--keep-vocab", tmp_path / "missing.de"], "no such file"),
        (["--keep-vocab", tmp_path / "empty.de"], "is empty"),
        (["--keep-vocab", tmp_path / "latin1.de"], "line 1 is not UTF-8"),
        (["--keep-vocab", good, "--keep-vocab-floor", "3"], "below the 4 special symbols"),
        (["--keep-vocab", good, "--keep-vocab-floor", "600"], "holds only 520 symbols"),
        (["--keep-vocab-floor", "10", "--remove", "10%"], "needs --keep-vocab"),
        (["--keep-vocab", tmp_path / "part.txt"], "suffix .txt names no language"),
        (["--keep-vocab", good, "--search", "fisher"], "--search acts on heads"),
        (["--keep-vocab", good, "--recover-epochs", "1"], "--recover-epochs trains on DATA"),
        (["--keep-vocab", good, "--out", tiny_data / "small.pt"], "holds dict.de.txt"),
        (["--keep-vocab", good, "--sweep", "50", "--results-dir", tmp_path / "sweep"], "--keep-vocab trims one"),
    ]
    for extra, message in cases:
        argv = ["fairseq-headprune", "shrink", tiny_data, "--path", stock_checkpoint, "--max-tokens", "2000", *extra]
        proc = run(argv + ([] if "--out" in extra or "--sweep" in extra else ["--out", out]), check=False)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, (extra, proc.stderr)
        assert message in lines[0], (extra, lines[0])
    assert not out.exists() and not (tiny_data / "small.pt").exists() and not list(out.parent.glob("dict.*"))
    # a rerun writing the same --out replaces the dictionaries its earlier run wrote there
    for _ in range(2):
        run(["fairseq-headprune", "shrink", tiny_data, "--path", stock_checkpoint, "--keep-vocab", good,
             "--out", out, "--no-check"])
    assert json.loads(out.with_suffix(".json").read_text())["vocabulary"]["check"] is None
    # the trimmed checkpoint with DATA of neither its dictionaries nor its source's: one line saying what to do
    other = shutil.copytree(tiny_data, tmp_path / "other-data")
    for lang in ("de", "en"):
        lines = (other / f"dict.{lang}.txt").read_text(encoding="utf-8").splitlines(keepends=True)
        (other / f"dict.{lang}.txt").write_text("".join(lines[:-1]), encoding="utf-8")
    proc = run(["fairseq-headprune", "export-ct2", other, "--path", out, "--out", tmp_path / "ct2", "--gen-subset",
                "test"], check=False)
    assert proc.returncode == 2 and "binarised for the model it was trimmed from, or against the dict.*.txt " \
        "written beside it" in proc.stderr, proc.stderr
    # with the untrimmed DATA it is read through the trim, but a recovery would train on DATA's ids as they are
    proc = run(["fairseq-headprune", "compress", tiny_data, "--path", out, "--out", tmp_path / "small",
                "--speedup", "1.2", "--beam", "1"], check=False)
    assert proc.returncode == 2 and "the recovery trains on DATA" in proc.stderr.strip().splitlines()[-1], proc.stderr
    assert not (tmp_path / "small").exists()


def test_a_corpus_is_read_once_while_it_stays_as_it_was(tmp_path, monkeypatch):
    from fairseq_headprune.prune import vocabulary

    reads, read = [], vocabulary.corpus_of_file
    monkeypatch.setattr(vocabulary, "corpus_of_file", lambda path: reads.append(path) or read(path))
    corpus = tmp_path / "part.de"
    corpus.write_text("ein Hund\n", encoding="utf-8")
    first = vocabulary.read_corpus(str(corpus))
    assert vocabulary.read_corpus(str(corpus)) is first and len(reads) == 1
    corpus.write_text("eine Katze läuft\n", encoding="utf-8")  # changed: read again
    again = vocabulary.read_corpus(str(corpus))
    assert len(reads) == 2 and again.types == {"eine", "Katze", "läuft"} and again.sha256 != first.sha256


def test_a_record_sized_on_disk_before_is_still_described_as_it_was_measured():
    from fairseq_headprune.prune.vocab_trim import ct2_sizes

    old = {"ct2_float32_bytes_before": 2 * 2**20, "ct2_float32_bytes_after": 2**20}
    assert ct2_sizes(old) == (2.0, 1.0, "on disk")
    assert ct2_sizes({"ct2_float32_weight_bytes_before": 3 * 2**20, "ct2_float32_weight_bytes_after": 2**20}) == (
        3.0, 1.0, "weights")
    assert ct2_sizes({"ct2_float32_weight_bytes_before": None, "ct2_not_measured": "no spec"}) is None
