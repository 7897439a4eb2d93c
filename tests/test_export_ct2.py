"""export-ct2: CTranslate2 models of stock, uneven-head (padded), emptied and per-stack checkpoints translate as
fairseq does; what CTranslate2 cannot express and bad options are one line and exit code 2."""
from __future__ import annotations

from pathlib import Path

import ctranslate2
import torch

from conftest import run
from helpers import beam_hypotheses, load_stock, sample_batch


def _export(data, checkpoint, out, *extra, check=True):
    return run(["fairseq-headprune", "export-ct2", data, "--path", checkpoint, "--out", out, "--gen-subset", "test",
                "--beam", "4", "--max-len-b", "60", "--max-tokens", "800", "--check-sentences", "24", *extra],
               check=check)


def _ct2_tokens(folder: Path, task, batch, beam: int = 4):
    """CTranslate2's best hypotheses for a fairseq batch, as fairseq token ids ending in EOS (independent of the
    export module's own check)."""
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    sources = [[src_dict[t] for t in row if t not in (src_dict.pad(), src_dict.eos())]
               for row in batch["net_input"]["src_tokens"].tolist()]
    translator = ctranslate2.Translator(str(folder), device="cpu", intra_threads=1)
    results = translator.translate_batch(sources, beam_size=beam, length_penalty=1.0, max_decoding_length=60,
                                         min_decoding_length=1, max_input_length=0)
    return [[tgt_dict.index(t) for t in r.hypotheses[0]] + [tgt_dict.eos()] for r in results]


def _same_translations(folder, checkpoint, data, n: int = 12):
    model, task = load_stock(checkpoint, data) if "pruned" not in Path(checkpoint).name else _load_pruned(
        checkpoint, data)
    batch = sample_batch(task, n=n)
    ours = [t for t, _ in beam_hypotheses(model, task, batch)]
    assert _ct2_tokens(folder, task, batch) == ours


def _load_pruned(checkpoint, data):
    from fairseq import checkpoint_utils, utils
    from argparse import Namespace

    from fairseq_headprune.fairseq_io.loading import PACKAGE_DIR, trust_fairseq_checkpoints

    trust_fairseq_checkpoints()
    utils.import_user_module(Namespace(user_dir=PACKAGE_DIR))
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)],
                                                                       arg_overrides={"data": str(data)})
    task.load_dataset("test")
    return models[0].eval(), task


def _pruned(stock_checkpoint, data, path, heads):
    from fairseq_headprune.core.heads import parse_head_spec
    from fairseq_headprune.core.masking import install_head_masks
    from fairseq_headprune.core.surgery import prune_model
    from fairseq_headprune.fairseq_io.pruned_checkpoint import save_pruned_checkpoint

    model, _ = load_stock(stock_checkpoint, data)
    install_head_masks(model)
    prune_model(model, parse_head_spec(heads))
    save_pruned_checkpoint(model, stock_checkpoint, path)
    return path


def test_stock_model_exports_and_translates_as_fairseq(stock_checkpoint, tiny_data, tmp_path):
    out = tmp_path / "ct2"
    proc = _export(tiny_data, stock_checkpoint, out)
    assert "encoder 8, decoder 4" in proc.stdout
    assert "float32 check on 24 sentences of 'test': 0 hypotheses differ" in proc.stdout, proc.stdout
    assert (out / "model.bin").exists() and (out / "config.json").exists()
    _same_translations(out, stock_checkpoint, tiny_data)
    # int8: written, and both BLEUs said
    proc = _export(tiny_data, stock_checkpoint, tmp_path / "int8", "--quantization", "int8")
    assert "int8:" in proc.stdout and "CTranslate2 int8" in proc.stdout
    assert (tmp_path / "int8" / "model.bin").stat().st_size < (out / "model.bin").stat().st_size


def test_uneven_heads_and_an_emptied_sublayer_are_padded_exactly(stock_checkpoint, tiny_data, tmp_path):
    # encoder layer 1 keeps one head, decoder self-attention layer 2 none, encoder-decoder layer 3 one
    ckpt = _pruned(stock_checkpoint, tiny_data, tmp_path / "uneven-pruned.pt",
                   "enc-self:1:1-2+4-8,dec-self:2:1-4,enc-dec:3:2-4,enc-self:3:5")
    out = tmp_path / "ct2"
    proc = _export(tiny_data, ckpt, out)
    assert "encoder 8, decoder 4" in proc.stdout  # padded to each stack's largest layer
    assert ": 0 hypotheses differ" in proc.stdout, proc.stdout
    _same_translations(out, ckpt, tiny_data)


def test_a_per_stack_shape_exports_with_fewer_heads(stock_checkpoint, tiny_data, tmp_path):
    heads = ",".join([f"enc-self:{layer}:1-4" for layer in range(1, 5)]
                     + [f"{t}:{layer}:2+4" for t in ("dec-self", "enc-dec") for layer in range(1, 4)])
    ckpt = _pruned(stock_checkpoint, tiny_data, tmp_path / "stack-pruned.pt", heads)
    out = tmp_path / "ct2"
    proc = _export(tiny_data, ckpt, out)
    assert "encoder 4, decoder 2" in proc.stdout and ": 0 hypotheses differ" in proc.stdout, proc.stdout
    _same_translations(out, ckpt, tiny_data)


def test_pre_norm_and_separate_embeddings(stock_checkpoint, tiny_data, tmp_path):
    """The tiny model's weights rewired as pre-norm with a final norm per stack and its own output projection."""
    state = torch.load(stock_checkpoint, map_location="cpu", weights_only=False)
    model_cfg = state["cfg"]["model"]
    for name in ("encoder_normalize_before", "decoder_normalize_before"):
        setattr(model_cfg, name, True)
    model_cfg.share_all_embeddings = model_cfg.share_decoder_input_output_embed = False
    generator = torch.Generator().manual_seed(0)
    for stack in ("encoder", "decoder"):
        state["model"][f"{stack}.layer_norm.weight"] = 1 + 0.1 * torch.randn(32, generator=generator)
        state["model"][f"{stack}.layer_norm.bias"] = 0.1 * torch.randn(32, generator=generator)
    state["model"]["decoder.output_projection.weight"] = state["model"]["decoder.embed_tokens.weight"] * 1.3
    ckpt = tmp_path / "prenorm.pt"
    torch.save(state, ckpt)
    out = tmp_path / "ct2"
    proc = _export(tiny_data, ckpt, out)
    assert ": 0 hypotheses differ" in proc.stdout, proc.stdout
    _same_translations(out, ckpt, tiny_data)


def test_bad_input_is_one_line_and_exit_code_2(stock_checkpoint, tiny_data, tmp_path):
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep").write_text("x")
    state = torch.load(stock_checkpoint, map_location="cpu", weights_only=False)
    state["cfg"]["model"].activation_fn = "tanh"
    torch.save(state, tmp_path / "tanh.pt")
    cases = [
        (stock_checkpoint, tmp_path / "a", ["--quantization", "int3"], "is not one CTranslate2 knows"),
        (stock_checkpoint, existing, [], "exists; pass --force"),
        (stock_checkpoint, tmp_path / "a", ["--sampling"], "--sampling"),
        (stock_checkpoint, tmp_path / "a", ["--unkpen", "1"], "--unkpen 1.0"),
        (tmp_path / "tanh.pt", tmp_path / "a", [], "cannot express this model: activation tanh"),
        (stock_checkpoint, tmp_path / "a", ["--check-sentences", "0"], "at least 1"),
        (stock_checkpoint, tmp_path / "a", ["--vocab-map-frequent", "3"], "--vocab-map-frequent is an option of the "
                                                                          "vocabulary map: it needs --vocab-map"),
        (stock_checkpoint, tmp_path / "a", ["--vocab-map", "--vocab-map-max-loss", "-1"],
         "--vocab-map-max-loss must be at least 0"),
    ]
    for ckpt, out, extra, message in cases:
        proc = _export(tiny_data, ckpt, out, *extra, check=False)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (extra, proc.stderr)
        assert len(lines) == 1 and lines[0].startswith("fairseq-headprune export-ct2: error:"), (extra, proc.stderr)
        assert message in lines[0], (extra, lines[0])
    assert not (tmp_path / "a").exists() and (existing / "keep").exists()
    # --force never replaces a folder of other files (tests/test_reliability.py: what it does replace)
    proc = _export(tiny_data, stock_checkpoint, existing, "--force", check=False)
    assert proc.returncode == 2 and "not a CTranslate2 model folder" in proc.stderr
    assert (existing / "keep").read_text() == "x" and not (existing / "model.bin").exists()


def _shrink(data, ckpt, out, *budget):
    return run(["fairseq-headprune", "shrink", data, "--path", ckpt, "--beam", "2", "--max-tokens", "500",
                "--calibration-sentences", "30", "--refit", "none", "--no-refit-ffn", "--shape", "per-stack",
                *budget, "--out", out], check=False)


def test_shrink_per_stack_keeps_the_promised_counts_under_every_budget(stock_checkpoint, tiny_data, tmp_path):
    """4 x 8 encoder heads, 3 x (4 + 4) decoder heads: every budget form gives one count per stack, exactly the
    promised number of heads (or FLOPs), and the CTranslate2 export has nothing to pad."""
    import json

    from fairseq_headprune.core.heads import HeadLayout

    for name, budget, removed in (("remove", ["--remove", "50%"], 28), ("keep", ["--keep", "30"], 26),
                                  ("flops", ["--flops", "75%"], None)):
        out = tmp_path / f"{name}-pruned.pt"
        proc = _shrink(tiny_data, stock_checkpoint, out, *budget)
        assert proc.returncode == 0, proc.stderr
        model, _ = _load_pruned(out, tiny_data)
        heads = HeadLayout.of(model).heads
        enc = {len(ids) for (t, _), ids in heads.items() if t == "enc-self"}
        dec = {len(ids) for (t, _), ids in heads.items() if t != "enc-self"}
        assert len(enc) == 1 and len(dec) == 1, (name, heads)
        kept = sum(len(ids) for ids in heads.values())
        record = json.loads(out.with_suffix(".json").read_text())
        if removed is not None:
            assert kept == 56 - removed, (name, kept)
        else:
            assert kept < 56 and record["selection"]["flops"]["share"] <= 0.75
        proc = _export(tiny_data, out, tmp_path / f"{name}-ct2")
        assert f"encoder {enc.pop()}, decoder {dec.pop()}" in proc.stdout and ": 0 hypotheses differ" in proc.stdout
    # a head budget no per-stack shape meets exactly, and a split stack: one line before any work
    for extra, message in ((["--remove", "5"], "cannot remove exactly 5 heads"),
                           (["--remove", "4", "--types", "enc-dec"], "must name all of dec-self, enc-dec")):
        proc = _shrink(tiny_data, stock_checkpoint, tmp_path / "x.pt", *extra)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr


def test_quantizing_an_export_leaves_the_fairseq_model_as_it_was(stock_checkpoint, tiny_data, tmp_path):
    # the spec's int8 optimisation rewrites its arrays in place: they must not be views of the model's weights
    from fairseq_headprune.engines.ct2_spec import build_spec, write_model

    model, task = load_stock(stock_checkpoint, tiny_data)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    write_model(build_spec(model, task.source_dictionary, task.target_dictionary, "relu"), str(tmp_path / "m"), "int8")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
