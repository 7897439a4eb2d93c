"""Iterative pruning curves: the right heads, in the right order, at every step."""
import json
from types import SimpleNamespace

from conftest import run
from fairseq_headprune.studies import pruning
from fairseq_headprune.studies.pruning import evaluate_steps
from fairseq_headprune.studies.ranking import rank_by_scores, steps
from fairseq_headprune.core.heads import Head, format_head_spec, parse_head_spec
from fairseq_headprune.records.log import ResultsLog

# on the first 48 sentences (conftest.tiny_slice) in two batches, hypotheses capped as the demo caps them (heavily
# masked models would otherwise write to fairseq's default of 200 tokens)
PRUNE = ["--gen-subset", "test", "--beam", "1", "--max-tokens", "600", "--max-len-a", "1.2", "--max-len-b", "10",
         "--types", "enc-dec,dec-self", "--step", "0.25"]


def test_steps_cover_zero_to_all():
    assert steps(144, 0.1) == [0, 14, 29, 43, 58, 72, 86, 101, 115, 130, 144]
    assert steps(24, 0.25) == [0, 6, 12, 18, 24]


def test_rank_by_scores_least_important_first_and_stable():
    heads = [Head("enc-dec", 1, h) for h in (1, 2, 3)]
    scores = {heads[0]: 0.5, heads[1]: 0.1, heads[2]: 0.5}
    assert rank_by_scores(scores, heads) == [heads[1], heads[0], heads[2]]


def test_prune_by_importance_and_random(tiny_slice, stock_checkpoint, tmp_path):
    run(["fairseq-headprune", "score", tiny_slice, "--path", stock_checkpoint, "--results-dir", tmp_path,
         "--gen-subset", "valid"])
    run(["fairseq-headprune", "prune", tiny_slice, "--path", stock_checkpoint, "--results-dir", tmp_path, *PRUNE,
         "--order", "importance,random", "--importance", tmp_path / "importance.json",
         "--save-pruned", tmp_path / "pruned.pt"])
    lines = [json.loads(line) for line in open(tmp_path / "pruning.jsonl")]
    rows = lines[1:]
    assert sorted((r["order"], r["heads_masked"]) for r in rows) == [
        (order, n) for order in ("importance", "random") for n in (0, 6, 12, 18, 24)]
    importance = json.loads((tmp_path / "importance.json").read_text())
    scores = {Head(t, i + 1, h + 1): v for t in ("enc-dec", "dec-self")
              for i, layer in enumerate(importance[t]) for h, v in enumerate(layer)}
    by_order = {}
    for row in sorted(rows, key=lambda r: r["heads_masked"]):
        by_order.setdefault(row["order"], []).append(parse_head_spec(row["masked"]))
    for masked_sets in by_order.values():
        for smaller, larger in zip(masked_sets, masked_sets[1:]):
            assert set(smaller) < set(larger)  # each step masks 10% more, never unmasks
    six = by_order["importance"][1]
    assert max(scores[h] for h in six) <= min(v for h, v in scores.items() if h not in six)
    assert by_order["random"][1] != six
    assert (tmp_path / "pruning.png").stat().st_size > 1000
    # the steps decoded 8 masks to a beam search give the same BLEU as one mask at a time (the default)
    run(["fairseq-headprune", "prune", tiny_slice, "--path", stock_checkpoint, "--results-dir", tmp_path / "shared",
         *PRUNE, "--order", "importance,random", "--importance", tmp_path / "importance.json",
         "--masks-per-batch", "8"])
    shared = [json.loads(line) for line in open(tmp_path / "shared" / "pruning.jsonl")][1:]
    assert sorted((r["key"], r["bleu"]) for r in shared) == sorted((r["key"], r["bleu"]) for r in rows)
    # a rerun resumes: nothing new is computed
    out = run(["fairseq-headprune", "prune", tiny_slice, "--path", stock_checkpoint, "--results-dir", tmp_path, *PRUNE,
               "--order", "importance,random", "--importance", tmp_path / "importance.json"]).stdout
    assert "heads masked" not in out
    assert len(open(tmp_path / "pruning.jsonl").readlines()) == 11
    # the 50% of heads the importance order prunes, written as a spec file and physically removed
    half = parse_head_spec(f"@{tmp_path / 'heads-importance-enc-dec+dec-self-50.json'}")
    assert set(half) == set(by_order["importance"][2])
    run(["fairseq-headprune", "score", tiny_slice, "--path", tmp_path / "pruned.pt", "--results-dir", tmp_path / "p",
         "--gen-subset", "valid"])
    pruned = json.loads((tmp_path / "p" / "importance.json").read_text())
    for t in ("enc-dec", "dec-self"):
        for layer, ids in enumerate(pruned["meta"]["head_ids"][t], start=1):
            assert set(ids) == {1, 2, 3, 4} - {h.head for h in half if (h.type, h.layer) == (t, layer)}


class CountingEvaluator:
    """Stands in for SubsetEvaluator: records which masked sets are decoded; BLEU = 100 - heads masked."""

    def __init__(self):
        self.loaded = SimpleNamespace(model=None)
        self.samples = [{"id": [0, 1]}]  # what mask_batching.rows_per_search reads: one batch of 2 sentences
        self.generator = SimpleNamespace(beam_size=1)
        self.decoded = []

    def translate_many(self, mask_sets, masks_per_batch):
        self.decoded += [format_head_spec(m) for m in mask_sets]
        return [[str(len(m))] for m in mask_sets]

    def bleu(self, hyps):
        return SimpleNamespace(score=100.0 - int(hyps[0]))


def test_each_masked_set_is_decoded_once_and_reused_from_the_log(tmp_path, monkeypatch):
    monkeypatch.setattr(pruning, "set_head_masks", lambda model, heads: None)
    heads = [Head("enc-dec", 1, h) for h in (1, 2, 3, 4)]
    first = CountingEvaluator()
    for per_batch in (1, 3):
        first.decoded = []
        log = ResultsLog(str(tmp_path / f"pruning-{per_batch}.jsonl"), {"command": "prune"})
        evaluate_steps(first, log, ["enc-dec"], [("importance:enc-dec", heads), ("random:enc-dec", heads[::-1])],
                       len(heads), 0.25, per_batch)
        # 10 steps, 8 distinct sets: both orders start with nothing masked and end with everything masked
        assert len(log.rows) == 10 and len(first.decoded) == len(set(first.decoded)) == 8
        assert all(r["bleu"] == 100 - r["heads_masked"] == 100 - len(parse_head_spec(r["masked"]))
                   for r in log.rows)
    # later orders decode only the sets the log lacks: the oracle's are the importance order's, and of 2, 3, 4, 1
    # only {2} and {2, 3} are new ({2, 3, 4} was the random order's third step)
    later = CountingEvaluator()
    evaluate_steps(later, log, ["enc-dec"], [("oracle:enc-dec", heads), ("other:enc-dec", heads[1:] + heads[:1])],
                   len(heads), 0.25, 1)
    assert later.decoded == ["enc-dec:1:2", "enc-dec:1:2+3"]
    assert len(log.rows) == 20


def test_prune_bad_input(tiny_data, stock_checkpoint, tmp_path):
    for extra, message in [(["--order", "oracle"], "--order oracle needs --ablation"),
                           (["--order", "best"], "unknown order 'best'"),
                           (["--types", "enc-sel"], "unknown attention type 'enc-sel'")]:
        proc = run(["fairseq-headprune", "prune", tiny_data, "--path", stock_checkpoint, "--results-dir", tmp_path,
                    *extra], check=False)
        assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1]


def test_prune_reestimate_rescores_remaining_heads(tiny_slice, stock_checkpoint, tmp_path):
    """--reestimate: the first step is the importance order's, later steps re-rank only the heads still there."""
    run(["fairseq-headprune", "score", tiny_slice, "--path", stock_checkpoint, "--results-dir", tmp_path,
         "--gen-subset", "valid"])
    run(["fairseq-headprune", "prune", tiny_slice, "--path", stock_checkpoint, "--results-dir", tmp_path, *PRUNE,
         "--order", "importance", "--reestimate", "--importance", tmp_path / "importance.json"])
    run(["fairseq-headprune", "prune", tiny_slice, "--path", stock_checkpoint, "--results-dir", tmp_path / "once",
         *PRUNE, "--order", "importance", "--importance", tmp_path / "importance.json"])
    rows = [json.loads(line) for line in open(tmp_path / "pruning.jsonl")][1:]
    once = [json.loads(line) for line in open(tmp_path / "once" / "pruning.jsonl")][1:]
    assert [r["order"] for r in rows] == ["importance+reestimate"] * 5
    masked = [set(parse_head_spec(r["masked"])) for r in rows]
    assert all(a < b for a, b in zip(masked, masked[1:]))
    assert masked[1] == set(parse_head_spec(once[1]["masked"]))
    assert (rows[0]["bleu"], rows[1]["bleu"]) == (once[0]["bleu"], once[1]["bleu"])
    assert masked[2] != set(parse_head_spec(once[2]["masked"]))  # re-ranking changed which heads go next


def test_heads_file_names_keep_the_whole_model_and_each_type_apart():
    from fairseq_headprune.records.layout import heads_file_name
    from fairseq_headprune.core.heads import ATTENTION_TYPES

    assert heads_file_name("importance", ATTENTION_TYPES, 50.0) == "heads-importance-50.json"
    assert heads_file_name("importance", ["dec-self"], 50.0) == "heads-importance-dec-self-50.json"
    assert heads_file_name("random", ["enc-dec", "dec-self"], 12.5) == "heads-random-enc-dec+dec-self-12.5.json"
