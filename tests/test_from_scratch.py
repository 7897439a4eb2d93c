"""Voita et al.'s last column: a pruned head configuration trained from random initialisation. The
`headprune_transformer` architecture takes --kept-heads at build time, so fairseq-train builds the uneven (even
empty) layers before any weight exists, and the checkpoint reloads in that shape."""
import json

from conftest import ROOT, run, run_fairseq

SMALL = ["--share-all-embeddings", "--encoder-layers", "2", "--decoder-layers", "2", "--encoder-attention-heads", "4",
         "--decoder-attention-heads", "4", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
         "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64"]


def test_a_pruned_configuration_trains_from_scratch_and_reloads(tiny_data, tmp_path):
    import torch

    kept = {"enc-self": {"1": [1, 2], "2": []}, "enc-dec": {"2": [3]}, "dec-self": {"1": [4]}}
    run_fairseq(["fairseq-train", tiny_data, "--user-dir", ROOT / "fairseq_headprune",
                 "--task", "translation_headprune", "--arch", "headprune_transformer", *SMALL,
                 "--kept-heads", json.dumps(kept), "--optimizer", "adam", "--lr", "3e-3", "--max-update", "3",
                 "--max-tokens", "1500", "--criterion", "cross_entropy", "--save-dir", tmp_path,
                 "--no-epoch-checkpoints", "--disable-validation", "--num-workers", "0", "--seed", "1"])
    state = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    weights = state["model"]
    assert weights["encoder.layers.0.self_attn.q_proj.weight"].shape == (2 * 8, 32)  # 2 heads of 8 dims
    assert weights["encoder.layers.1.self_attn.q_proj.weight"].shape == (0, 32)  # an empty layer trains too
    assert weights["decoder.layers.1.encoder_attn.k_proj.weight"].shape == (8, 32)
    assert weights["decoder.layers.0.self_attn.out_proj.weight"].shape == (32, 8)
    assert weights["decoder.layers.1.self_attn.q_proj.weight"].shape == (32, 32)  # not listed: all 4 heads
    assert torch.isfinite(weights["encoder.layers.0.self_attn.q_proj.weight"]).all()
    proc = run(["fairseq-headprune", "score", tiny_data, "--path", tmp_path / "checkpoint_last.pt",
                "--results-dir", tmp_path / "r", "--gen-subset", "valid"])
    ids = json.loads((tmp_path / "r" / "importance.json").read_text())["meta"]["head_ids"]
    assert ids["enc-self"] == [[1, 2], []] and ids["enc-dec"][1] == [3] and ids["dec-self"][0] == [4]
    assert proc.returncode == 0


def _table_inputs(tmp_path):
    """A copy of the committed L0 sweep and from-scratch runs, for recipes/voita_from_scratch_table.py."""
    import shutil

    results = tmp_path / "voita"
    results.mkdir()
    shutil.copy(ROOT / "results/voita/compare.jsonl", results / "compare.jsonl")
    shutil.copytree(ROOT / "results/voita/from-scratch", results / "from-scratch")
    return results


def _table(results, check=True):
    return run(["python", ROOT / "recipes/voita_from_scratch_table.py", results,
                ROOT / "results/de-en/convergence/valid-loss.txt"], check=check)


def test_the_committed_from_scratch_table_is_what_its_files_give(tmp_path):
    """The committed table.md is recomputed from the runs' own files: BLEU, epochs, and the L0 run each
    configuration was paired with by its heads."""
    results = _table_inputs(tmp_path)
    _table(results)
    assert (results / "from-scratch/table.md").read_text() == \
        (ROOT / "results/voita/from-scratch/table.md").read_text()
    assert "| half | 75 (6 / 45 / 24) | 0.01 |" in (results / "from-scratch/table.md").read_text()


def test_a_configuration_no_l0_run_kept_is_refused(tmp_path):
    """One head more than the λ = 0.01 run kept: no pruned model to set it beside, one line and exit code 2."""
    results = _table_inputs(tmp_path)
    kept = json.loads((results / "from-scratch/half/kept-heads.json").read_text())
    kept["enc-self"]["1"].append(8)
    (results / "from-scratch/half/kept-heads.json").write_text(json.dumps(kept))
    proc = _table(results, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "voita_from_scratch_table: error: half's heads match 0 L0 runs, not one"]
