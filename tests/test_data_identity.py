"""A run's data identity is its sentences (ids, source tokens, references), never their batching: a sweep resumed
with another --max-tokens or --batch-size is the same run and keeps its rows; a file written when the fingerprint
hashed the padded batches resumes under its own batching and from then on under any."""
import json

from conftest import run
from fairseq_headprune.decoding.evaluate import SubsetEvaluator
from fairseq_headprune.fairseq_io.loading import load


def _evaluator(data, checkpoint, *batching):
    from fairseq_headprune import cli
    from fairseq_headprune.cli import score

    cfg, _ = cli.parse("score", score, [str(data), "--path", str(checkpoint), "--results-dir", "unused",
                                        "--gen-subset", "test", *batching])
    return SubsetEvaluator(load(cfg), "test")


def test_the_fingerprint_is_the_sentences_not_their_batches(tiny_slice, stock_checkpoint):
    a = _evaluator(tiny_slice, stock_checkpoint, "--max-tokens", "3000")
    b = _evaluator(tiny_slice, stock_checkpoint, "--max-tokens", "150", "--batch-size", "3")
    assert len(a.samples) < len(b.samples)  # really another batching
    assert a.data_fingerprint() == b.data_fingerprint()
    other = _evaluator(tiny_slice, stock_checkpoint, "--max-tokens", "3000")
    other.references = other.references[:-1] + ["another reference"]
    assert other.data_fingerprint() != a.data_fingerprint()


def test_a_sweep_resumes_under_other_batching_and_an_old_file_under_its_own(tiny_slice, stock_checkpoint, tmp_path):
    out = tmp_path / "out"
    base = ["fairseq-headprune", "ablate", tiny_slice, "--path", stock_checkpoint, "--results-dir", out,
            "--gen-subset", "test", "--metric", "loss", "--types", "dec-self", "--workers", "1"]
    run(base + ["--max-tokens", "3000"])
    path = out / "ablation-single-loss.jsonl"
    rows = path.read_text().splitlines()
    run(base + ["--max-tokens", "150", "--batch-size", "3"])
    assert path.read_text().splitlines()[1:] == rows[1:], "the same rows: nothing computed again or appended"
    # a file of the former fingerprint (the padded batches of --max-tokens 3000)
    import hashlib

    ev = _evaluator(tiny_slice, stock_checkpoint, "--max-tokens", "3000")
    legacy = hashlib.sha256()
    for sample in ev.samples:
        legacy.update(sample["id"].cpu().numpy().tobytes())
        legacy.update(sample["net_input"]["src_tokens"].cpu().numpy().tobytes())
    legacy.update("\n".join(ev.references).encode())
    header = json.loads(rows[0])
    header["header"]["data_fingerprint"] = legacy.hexdigest()[:16]
    path.write_text("\n".join([json.dumps(header, sort_keys=True), *rows[1:]]) + "\n")
    run(base + ["--max-tokens", "3000"])
    assert path.read_text().splitlines() == rows, "reopened with its own batching: the header is the new one again"
    run(base + ["--max-tokens", "150", "--batch-size", "3"])
    assert path.read_text().splitlines() == rows
