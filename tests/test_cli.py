"""The commands users run: fairseq-generate with the user module, and fairseq-headprune score."""
import json
import math

import pytest
import torch

from conftest import run, run_fairseq, stock_run
from fairseq_headprune import cli
from fairseq_headprune.studies.scoring import compute_importance


def hypotheses(stdout: str):
    """fairseq-generate's H lines by sentence id: (score, text)."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("H-"):
            sid, score, text = line.split("\t")
            out[int(sid[2:])] = (float(score), text)
    assert out, "no hypotheses"
    return out


def generate(data, checkpoint, *extra, fresh_process=False):
    """fairseq-generate's output; without the user module it is stock fairseq's, recorded once (conftest.stock_run);
    with it, run in this process (conftest.run_fairseq) unless fresh_process: the console script, which imports
    the module from --user-dir itself."""
    cmd = ["fairseq-generate", data, "--path", checkpoint, "--gen-subset", "test", "--beam", "4",
           "--max-tokens", "3000", *extra]
    if "--user-dir" not in map(str, extra):
        return stock_run(cmd).stdout
    return (run(cmd) if fresh_process else run_fairseq(cmd)).stdout


def same_hypotheses(a, b):
    assert a.keys() == b.keys()
    assert [a[i][1] for i in sorted(a)] == [b[i][1] for i in sorted(b)]
    assert [a[i][0] for i in sorted(a)] == pytest.approx([b[i][0] for i in sorted(b)], abs=1e-4)


@pytest.fixture(scope="module")
def zeroed_checkpoint(stock_checkpoint, tmp_path_factory):
    """The stock checkpoint with the out_proj columns of enc-self:2:3, enc-dec:3:2 and dec-self:1:4 set to zero."""
    state = torch.load(stock_checkpoint, map_location="cpu", weights_only=False)
    head_dim = 32 // 8
    for name, head, dim in [("encoder.layers.1.self_attn", 3, head_dim), ("decoder.layers.2.encoder_attn", 2, 32 // 4),
                            ("decoder.layers.0.self_attn", 4, 32 // 4)]:
        state["model"][f"{name}.out_proj.weight"][:, (head - 1) * dim : head * dim] = 0
    path = tmp_path_factory.mktemp("zeroed") / "checkpoint.pt"
    torch.save(state, path)
    return path


def test_generate_unmasked_equals_stock_fairseq_generate(tiny_data, stock_checkpoint):
    stock = hypotheses(generate(tiny_data, stock_checkpoint))
    ours = hypotheses(generate(tiny_data, stock_checkpoint, "--user-dir", cli.PACKAGE_DIR,
                               "--task", "translation_headprune", fresh_process=True))
    assert stock == ours  # bit-identical: no active mask means fairseq's own code path


def test_generate_mask_heads_equals_stock_model_with_zeroed_columns(tiny_data, stock_checkpoint, zeroed_checkpoint,
                                                                    tmp_path):
    expected = hypotheses(generate(tiny_data, zeroed_checkpoint))
    spec = "enc-self:2:3,enc-dec:3:2,dec-self:1:4"
    ours = hypotheses(generate(tiny_data, stock_checkpoint, "--user-dir", cli.PACKAGE_DIR,
                               "--task", "translation_headprune", "--mask-heads", spec))
    same_hypotheses(ours, expected)
    assert ours != hypotheses(generate(tiny_data, stock_checkpoint)), "the masks must change something"
    spec_file = tmp_path / "heads.json"
    spec_file.write_text(json.dumps({"enc-self": {"2": [3]}, "enc-dec": {"3": [2]}, "dec-self": {"1": "4"}}))
    from_file = hypotheses(generate(tiny_data, stock_checkpoint, "--user-dir", cli.PACKAGE_DIR,
                                    "--task", "translation_headprune", "--mask-heads", f"@{spec_file}"))
    assert from_file == ours


@pytest.mark.parametrize("spec, message", [
    ("enc-dec:4:1", "enc-dec layer 4 does not exist: layers are 1..3 (the model has enc-self 4 layers x 8 heads"),
    ("nonsense", "bad head spec item 'nonsense'"),
])
def test_generate_bad_mask_spec_is_one_line_exit_2(tiny_data, stock_checkpoint, spec, message):
    # the first in the console script (its exit hook makes the UserError one line), the other in this process
    runner = run if spec == "enc-dec:4:1" else run_fairseq
    proc = runner(["fairseq-generate", tiny_data, "--path", stock_checkpoint, "--user-dir", cli.PACKAGE_DIR,
                   "--task", "translation_headprune", "--mask-heads", spec], check=False)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: --mask-heads: {message}")


def test_score_writes_normalised_importance(tiny_data, stock_checkpoint, tmp_path):
    proc = run(["fairseq-headprune", "score", tiny_data, "--path", stock_checkpoint, "--results-dir", tmp_path,
                "--gen-subset", "valid", "--max-tokens", "2000"], in_process=False)  # the installed console script
    assert "head importance" in proc.stdout and "enc-dec" in proc.stdout
    result = json.loads((tmp_path / "importance.json").read_text())
    assert [len(result["enc-self"]), len(result["enc-dec"]), len(result["dec-self"])] == [4, 3, 3]
    assert {len(layer) for layer in result["enc-self"]} == {8}
    assert {len(layer) for t in ("enc-dec", "dec-self") for layer in result[t]} == {4}
    for t in ("enc-self", "enc-dec", "dec-self"):
        for layer in result[t]:
            assert math.sqrt(sum(v * v for v in layer)) == pytest.approx(1.0)
    meta = result["meta"]
    assert meta["sentences"] == 200 and meta["subset"] == "valid" and meta["normalized_by_layer"]
    # the raw scores are the in-process computation's
    cfg, _ = cli.parse("score", __import__("fairseq_headprune.cli.score", fromlist=["x"]),
                       [str(tiny_data), "--path", str(stock_checkpoint), "--results-dir", str(tmp_path),
                        "--gen-subset", "valid", "--max-tokens", "2000"])
    from fairseq_headprune.fairseq_io.loading import load

    raw, _ = compute_importance(load(cfg), "valid")
    assert meta["unnormalized"]["enc-dec"][2] == pytest.approx(raw[("enc-dec", 3)].tolist(), rel=1e-6)


def test_score_no_normalize(tiny_data, stock_checkpoint, tmp_path):
    run(["fairseq-headprune", "score", tiny_data, "--path", stock_checkpoint, "--results-dir", tmp_path,
         "--no-normalize-by-layer", "--gen-subset", "test", "--batch-size", "50"])
    result = json.loads((tmp_path / "importance.json").read_text())
    assert result["enc-self"] == result["meta"]["unnormalized"]["enc-self"]
    assert not result["meta"]["normalized_by_layer"]


@pytest.fixture(scope="module")
def foreign_checkpoint(stock_checkpoint, tmp_path_factory):
    """A checkpoint whose architecture comes from a --user-dir that is not loaded."""
    state = torch.load(stock_checkpoint, map_location="cpu", weights_only=False)
    model_cfg = state["cfg"]["model"]  # an argparse Namespace in checkpoints of fairseq-train 0.12
    model_cfg.arch = model_cfg._name = "someone_elses_transformer"
    path = tmp_path_factory.mktemp("foreign") / "checkpoint.pt"
    torch.save(state, path)
    return path


@pytest.mark.parametrize("case, message", [
    ("missing checkpoint", "checkpoint not found"),
    ("missing data", "data directory not found"),
    ("missing subset", "no 'nosuchsubset' subset"),
    ("foreign architecture", "uses architecture 'someone_elses_transformer', which no loaded module registers"),
    ("unknown command", "unknown command 'scroe' (did you mean score?)"),
])
def test_score_bad_input_is_one_line_exit_2(case, message, tiny_data, stock_checkpoint, foreign_checkpoint, tmp_path):
    args = {"missing checkpoint": ["score", tiny_data, "--path", tmp_path / "none.pt"],
            "missing data": ["score", tmp_path / "nodata", "--path", stock_checkpoint],
            "missing subset": ["score", tiny_data, "--path", stock_checkpoint, "--gen-subset", "nosuchsubset"],
            "foreign architecture": ["score", tiny_data, "--path", foreign_checkpoint],
            "unknown command": ["scroe", tiny_data]}[case]
    proc = run(["fairseq-headprune", *args, "--results-dir", tmp_path], check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert message in lines[-1]
    assert len([line for line in lines if "error:" in line]) == 1
    if case == "unknown command":  # one line, not the usage
        assert len(lines) == 1, lines


def test_fairseq_train_finds_registered_architecture_task_and_criterion(tiny_data, tmp_path):
    """`fairseq-train --user-dir fairseq_headprune` with every registered name, including the head_importance
    criterion, whose per-sentence ξ leaves must not disturb training."""
    from conftest import train

    arch = ["--arch", "headprune_transformer_iwslt_de_en_8head", "--share-all-embeddings",
            "--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
            "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64"]
    ckpt = train(tiny_data, tmp_path, updates=3, arch=[*arch, "--user-dir", cli.PACKAGE_DIR,
                                                       "--task", "translation_headprune"])
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    model_cfg = state["cfg"]["model"]
    assert model_cfg.arch == "headprune_transformer_iwslt_de_en_8head"
    assert model_cfg.encoder_attention_heads == 8 and model_cfg.encoder_normalize_before
    out = run_fairseq(["fairseq-train", tiny_data, *arch, "--user-dir", cli.PACKAGE_DIR, "--task",
                       "translation_headprune", "--criterion", "head_importance", "--optimizer", "adam", "--lr", "1e-3",
                       "--max-tokens", "1500", "--max-update", "2", "--save-dir", tmp_path / "crit", "--no-save",
                       "--disable-validation", "--log-format", "simple", "--log-interval", "1"])
    assert "num_updates=2" in out.stdout + out.stderr or "done training" in (out.stdout + out.stderr)


def exit_code(argv) -> int:
    """cli.main's exit code (argparse's own help, for the commands without fairseq's options, exits itself)."""
    try:
        return cli.main(argv)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("command", [c for c in cli.COMMANDS])
def test_help_shows_the_commands_own_options_first_in_80_lines(command, capsys):
    """`COMMAND --help`: its own options first, under their sections, in at most 80 lines; fairseq's in one line
    that says how to see them; `--help-fairseq` lists them without the ones the command refuses."""
    assert exit_code([command, "--help"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert len(lines) <= 80 and lines[0].startswith(f"usage: fairseq-headprune {command}"), text
    if not cli.wants_help(__import__(cli.COMMANDS[command][0], fromlist=["_"]), ["--help"]):
        return  # a command without fairseq's options prints argparse's own, short help
    assert lines[-1] == f"fairseq-headprune {command} --help-fairseq lists every fairseq option this command applies."
    own = text.index("fairseq-generate's options")
    assert "--fp16" not in text and "--log-format" not in text and "--beam BEAM" in text[own:]
    assert cli.main([command, "--help-fairseq"]) == 0
    full = capsys.readouterr().out
    assert "--log-format" in full and "--beam BEAM" in full  # applied (inert, decoding) options listed
    assert "--fp16\n" not in full and "--sampling\n" not in full and "--prefix-size" not in full  # refused ones not


def test_compress_help_groups_its_options_and_leaves_out_what_it_refuses(capsys):
    assert cli.main(["compress", "--help"]) == 0
    text = capsys.readouterr().out
    for section in ("target:", "recovery:", "reported sets:", "calibration and refit:", "timing and checks:",
                    "vocabulary:", "the run:"):
        assert f"\n{section}\n" in text, section
    assert text.index("  --speedup SPEEDUP") < text.index("  --budget-epochs") < text.index("  --beam BEAM")
    assert cli.main(["compress", "--help-fairseq"]) == 0
    assert "--disable-validation" not in capsys.readouterr().out
    assert cli.main(["shrink", "--help"]) == 0
    shrink = capsys.readouterr().out
    assert "\nreconstruction:\n" in shrink and "\nwindow fit:\n" in shrink
