"""Options declared once (fairseq_headprune/options.py): shrink's parser is generated from ShrinkOptions and its nested
reconstruction and window-fit options, the defaults are the dataclasses' own, and an option that would do nothing
in the combination given is refused in one line before any work."""
import argparse

import pytest

from conftest import run
from fairseq_headprune.prune.reconstruct import ReconstructionOptions
from fairseq_headprune.prune.shrink_options import ShrinkOptions, flat_fields, with_fit
from fairseq_headprune.prune.window_fit import WindowOptions
from fairseq_headprune.compress.options import CompressOptions
from fairseq_headprune.options import add_arguments, from_arguments, given_flags, nested
from fairseq_headprune.studies.deploy import DeployOptions


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser, ShrinkOptions)
    return from_arguments(ShrinkOptions, parser.parse_args(argv))


def test_no_argument_gives_the_dataclass_defaults():
    assert _parse([]) == ShrinkOptions()
    assert ShrinkOptions().reconstruction.refit_ffn is ReconstructionOptions().refit_ffn is True  # one default


def test_a_command_line_fills_nested_options():
    options = _parse(["--remove", "62.5%", "--types", "dec-self,enc-dec", "--shape", "per-stack", "--window-steps",
                      "1000", "--window-lr", "1e-4", "--no-refit-ffn", "--refit", "scales", "--no-rearrange",
                      "--min-heads-per-layer", "0", "--check-sentences", "5"])
    assert options.remove == "62.5%" and options.types == ("enc-dec", "dec-self") and options.shape == "per-stack"
    assert options.reconstruction == ReconstructionOptions(method="scales", refit_ffn=False,
                                                           window=WindowOptions(steps=1000, lr=1e-4))
    assert not options.rearrange and options.min_heads == 0 and options.check_sentences == 5
    assert given_flags(ShrinkOptions, options) == {
        "--remove": "62.5%", "--types": ("enc-dec", "dec-self"), "--shape": "per-stack", "--window-steps": 1000,
        "--window-lr": 1e-4, "--no-refit-ffn": False, "--refit": "scales", "--no-rearrange": False,
        "--min-heads-per-layer": 0, "--check-sentences": 5}


def test_a_holder_gives_a_nested_option_its_own_default_with_its_reason():
    # compress holds the window fit's options with 1000 steps where shrink's own default is 0: one declaration
    parser = argparse.ArgumentParser()
    add_arguments(parser, CompressOptions)
    steps = next(a for a in parser._actions if "--window-steps" in a.option_strings)
    assert steps.help.endswith("(default 1000: compress's, chosen on val in results/recover-de-en; shrink's 0 keeps a "
                               "plain shrink fast)")
    given = from_arguments(CompressOptions, parser.parse_args(["--out", "o"]))
    assert given.window == CompressOptions(out="o").window == WindowOptions(steps=1000)
    assert from_arguments(CompressOptions, parser.parse_args(["--out", "o", "--window-steps", "0"])).window.steps == 0
    assert "--window-steps" not in given_flags(CompressOptions, given)  # its holder's default is not a choice
    assert given_flags(CompressOptions, CompressOptions(out="o", window=WindowOptions()))["--window-steps"] == 0
    assert _parse([]).reconstruction.window == WindowOptions()  # shrink keeps the dataclass's own
    with pytest.raises(TypeError, match="no reason"):
        nested(WindowOptions, defaults={"steps": 5})
    with pytest.raises(TypeError, match="lacks"):
        nested(WindowOptions, defaults={"stepz": 5}, why="a typo")


def test_a_list_option_given_twice_keeps_both_lists():
    """`--compare a=x --compare b=y c=z` compares all three (argparse's default would keep the last list alone)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser, DeployOptions)
    options = from_arguments(DeployOptions, parser.parse_args(
        ["--compare", "a=x.pt", "--compare", "b=y.pt", "c=z.pt"]))
    assert options.compare == ("a=x.pt", "b=y.pt", "c=z.pt")
    assert from_arguments(DeployOptions, parser.parse_args([])).compare == ()


def test_budgets_are_mutually_exclusive_and_choices_checked():
    with pytest.raises(SystemExit):
        _parse(["--remove", "50%", "--keep", "10"])
    with pytest.raises(SystemExit):
        _parse(["--refit", "lasso"])


def test_records_keep_their_flat_names():
    flat = flat_fields(with_fit(ShrinkOptions(remove="50%"), window=WindowOptions(steps=300)))
    assert flat["refit"] == "out-proj" and flat["window_steps"] == 300 and flat["window_lr"] == 3e-4
    assert flat["refit_ffn"] is True and "reconstruction" not in flat and "method" not in flat


@pytest.mark.parametrize("extra, says", [
    (["--window-lr", "1e-3"], "--window-lr sets the window fit's learning rate: it needs --window-steps N"),
    (["--calibration-beam", "4"], "--calibration-beam is the beam of --calibration-targets self"),
    (["--no-rearrange"], "--no-rearrange skips the rearrangement after --search fisher or block"),
    (["--layer-selection", "even"], "--layer-selection chooses the layers --keep-layers keeps"),
])
def test_an_option_that_would_do_nothing_is_refused_before_any_work(tiny_data, stock_checkpoint, tmp_path, extra,
                                                                     says):
    out = tmp_path / "small.pt"
    proc = run(["fairseq-headprune", "shrink", tiny_data, "--path", stock_checkpoint, "--remove", "50%", "--out", out,
                *extra], check=False)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())
