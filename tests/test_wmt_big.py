"""The official fairseq WMT14 En-Fr Transformer-big (Ott et al. 2018), as users who have it load it.

Its release predates hydra configs: the checkpoint holds `args` (an argparse Namespace with
arch=transformer_vaswani_wmt_en_fr_big, a joined dictionary, shared embeddings) and no `cfg`. The test saves a
checkpoint of that architecture in that format, with its dimensions overridden small, and runs the tools on it.
"""
import hashlib
import json

import torch

from conftest import cached_build, copy_cached, run, run_fairseq, stock_key, stock_run, train
from fairseq_headprune.fairseq_io.loading import PACKAGE_DIR


def test_old_format_transformer_big_checkpoint(tiny_data, tmp_path):
    small = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
             "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
             "--encoder-attention-heads", "16", "--decoder-attention-heads", "16"]
    arch = ["--arch", "transformer_vaswani_wmt_en_fr_big", "--share-all-embeddings", *small]
    # a stock training run: built once per machine (conftest.cached_build), like the other tiny models
    updates = 3
    cached = cached_build("wmt-big", stock_key() + hashlib.sha256(repr((arch, updates)).encode()).hexdigest()[:16],
                          lambda out: train(tiny_data, out, updates=updates, arch=arch))
    ckpt = copy_cached(cached, tmp_path / "train") / "checkpoint_last.pt"
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    model_args = state["cfg"]["model"]
    assert model_args.arch == "transformer_vaswani_wmt_en_fr_big" and model_args.encoder_attention_heads == 16
    released = {"args": model_args, "model": state["model"], "optimizer_history": state["optimizer_history"],
                "extra_state": state["extra_state"], "last_optimizer_state": None}
    path = tmp_path / "model.pt"
    torch.save(released, path)

    # in this process (conftest.run_fairseq); stock fairseq-generate (no user module) recorded once per machine.
    # A short length cap keeps the 3-update model's decodes cheap; every sentence still gets its hypothesis.
    short = ["--gen-subset", "test", "--max-tokens", "3000", "--beam", "2", "--max-len-a", "0", "--max-len-b", "12"]
    masked = run_fairseq(["fairseq-generate", tiny_data, "--path", path, "--user-dir", PACKAGE_DIR,
                          "--task", "translation_headprune", "--mask-heads", "enc-dec:2:1-16", *short]).stdout
    stock = stock_run(["fairseq-generate", tiny_data, "--path", path, *short]).stdout
    assert masked.count("\nH-") == stock.count("\nH-") == 200
    bad = run_fairseq(["fairseq-generate", tiny_data, "--path", path, "--user-dir", PACKAGE_DIR,
                       "--task", "translation_headprune", "--mask-heads", "enc-dec:2:17"], check=False)
    assert bad.returncode == 2 and "heads are 1..16" in bad.stderr.strip().splitlines()[-1]

    run(["fairseq-headprune", "score", tiny_data, "--path", path, "--results-dir", tmp_path, "--gen-subset", "test"])
    importance = json.loads((tmp_path / "importance.json").read_text())
    assert [len(importance[t]) for t in ("enc-self", "enc-dec", "dec-self")] == [2, 2, 2]
    assert all(len(layer) == 16 for t in ("enc-self", "enc-dec", "dec-self") for layer in importance[t])
