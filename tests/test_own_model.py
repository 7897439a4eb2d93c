"""Issue 28: a report speaks of its own model only (the bundled model's dynamics are no default for another
checkpoint, a file of another model is marked whose it is, a folder of another checkpoint's results is refused),
and fairseq's own failures on the user's input are one line. The commands themselves: tools/probe_options.py."""
import json
from pathlib import Path

import pytest

from fairseq_headprune.errors import UserError
from fairseq_headprune.fairseq_io.fairseq_errors import user_message
from fairseq_headprune.report import pipeline, sections

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = (ROOT / "results" / "dynamics" / ".model-sha256").read_text().strip()
OTHER = "ab" * 32


def test_the_bundled_dynamics_are_the_default_of_the_bundled_model_only():
    assert pipeline.default_dynamics(BUNDLED) == pipeline.BUNDLED_DYNAMICS
    assert pipeline.default_dynamics(OTHER) is None


def test_a_file_of_another_model_says_whose_it_is(tmp_path):
    dynamics = str(ROOT / "results" / "dynamics" / "dynamics.jsonl")
    assert sections.whose(dynamics, BUNDLED) is None
    assert "another model's training run" in sections.whose(dynamics, OTHER)
    assert BUNDLED[:12] in sections.whose(dynamics, OTHER)
    sweep = tmp_path / "compare.jsonl"
    sweep.write_text(json.dumps({"header": {"checkpoint_sha256": OTHER}}) + "\n")
    assert sections.whose(str(sweep), OTHER) is None
    assert f"checkpoint {OTHER[:12]}" in sections.whose(str(sweep), BUNDLED)
    sweep.write_text(json.dumps({"header": {}}) + "\n")
    assert "names no checkpoint" in sections.whose(str(sweep), BUNDLED)
    assert sections.whose(str(tmp_path / "missing.jsonl"), BUNDLED) is None


def test_a_folder_of_another_checkpoint_is_refused(tmp_path):
    committed = ROOT / "results" / "report-de-en"
    assert pipeline.foreign_results(str(committed), BUNDLED) == []
    pipeline.check_own_folder(str(committed), BUNDLED, "model.pt")
    (tmp_path / "importance.json").write_text(json.dumps({"meta": {"checkpoint_sha256": BUNDLED}}))
    (tmp_path / "ablation-single.jsonl").write_text(json.dumps({"header": {"checkpoint_sha256": BUNDLED}}) + "\n")
    (tmp_path / "report-state.json").write_text(json.dumps({"parts": {"score": {"checkpoint_sha256": BUNDLED}}}))
    assert len(pipeline.foreign_results(str(tmp_path), OTHER)) == 3
    with pytest.raises(UserError, match=f"holds results of checkpoint {BUNDLED[:12]}, not of --path m.pt"):
        pipeline.check_own_folder(str(tmp_path), OTHER, "m.pt")


def test_fairseqs_failures_on_user_input_are_one_line_and_others_are_not():
    message = user_message(AssertionError("Sentences lengths should not exceed max_tokens=5"))
    assert message.startswith("--max-tokens 5 is smaller than a sentence") and "\n" not in message
    assert "--min-len" in user_message(AssertionError("min_len cannot be larger than max_len, please adjust these!"))
    assert "--skip-invalid-size-inputs-valid-test" in user_message(Exception(
        "Size of sample #3 is invalid (=(9, 11)) since max_positions=(4, 1024), skip this example with "
        "--skip-invalid-size-inputs-valid-test"))
    assert user_message(AssertionError("something else")) is None
    assert user_message(ValueError("Sentences lengths should not exceed max_tokens=5")) is None  # not fairseq's


def test_a_min_len_the_shortest_source_cannot_reach_is_refused_before_any_decode():
    from types import SimpleNamespace

    from fairseq_headprune.fairseq_io.loading import refuse_unreachable_min_len

    gen = SimpleNamespace(min_len=8, max_len_a=0, max_len_b=7, match_source_len=False)
    with pytest.raises(UserError, match=r"--min-len 8 .* shortest source of 'test' \(7 tokens"):
        refuse_unreachable_min_len(gen, [4, 30], 1024, "test")  # fairseq would fail, or not, by batching
    refuse_unreachable_min_len(SimpleNamespace(**{**vars(gen), "max_len_b": 8}), [4, 30], 1024, "test")
    with pytest.raises(UserError, match=r"\(6 tokens; the model's positions"):  # capped by max positions - 1
        refuse_unreachable_min_len(SimpleNamespace(**{**vars(gen), "max_len_b": 200}), [4], 7, "test")
    with pytest.raises(UserError, match="match-source-len"):  # hypotheses as long as the source without EOS
        refuse_unreachable_min_len(SimpleNamespace(**{**vars(gen), "match_source_len": True}), [5, 30], 1024, "t")
