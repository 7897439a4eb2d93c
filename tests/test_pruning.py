"""Iterative pruning curves: the right heads, in the right order, at every step."""
import json


from conftest import run
from fairseq_headprune.experiments.pruning import rank_by_scores, steps
from fairseq_headprune.heads import Head, parse_head_spec

PRUNE = ["--gen-subset", "test", "--beam", "1", "--max-tokens", "3000", "--types", "enc-dec,dec-self",
         "--step", "0.25"]


def test_steps_cover_zero_to_all():
    assert steps(144, 0.1) == [0, 14, 29, 43, 58, 72, 86, 101, 115, 130, 144]
    assert steps(24, 0.25) == [0, 6, 12, 18, 24]


def test_rank_by_scores_least_important_first_and_stable():
    heads = [Head("enc-dec", 1, h) for h in (1, 2, 3)]
    scores = {heads[0]: 0.5, heads[1]: 0.1, heads[2]: 0.5}
    assert rank_by_scores(scores, heads) == [heads[1], heads[0], heads[2]]


def test_prune_by_importance_and_random(tiny_data, stock_checkpoint, tmp_path):
    run(["fairseq-headprune", "score", tiny_data, "--path", stock_checkpoint, "--results-dir", tmp_path,
         "--gen-subset", "valid"])
    run(["fairseq-headprune", "prune", tiny_data, "--path", stock_checkpoint, "--results-dir", tmp_path, *PRUNE,
         "--order", "importance,random", "--importance", tmp_path / "importance.json",
         "--save-pruned", tmp_path / "pruned.pt"])
    lines = [json.loads(line) for line in open(tmp_path / "pruning.jsonl")]
    rows = lines[1:]
    assert [r["heads_masked"] for r in rows] == [0, 6, 12, 18, 24] * 2
    importance = json.loads((tmp_path / "importance.json").read_text())
    scores = {Head(t, i + 1, h + 1): v for t in ("enc-dec", "dec-self")
              for i, layer in enumerate(importance[t]) for h, v in enumerate(layer)}
    by_order = {}
    for row in rows:
        by_order.setdefault(row["order"], []).append(parse_head_spec(row["masked"]))
    for masked_sets in by_order.values():
        for smaller, larger in zip(masked_sets, masked_sets[1:]):
            assert set(smaller) < set(larger)  # each step masks 10% more, never unmasks
    six = by_order["importance"][1]
    assert max(scores[h] for h in six) <= min(v for h, v in scores.items() if h not in six)
    assert by_order["random"][1] != six
    assert rows[0]["bleu"] == rows[5]["bleu"]  # nothing masked: the same model
    assert (tmp_path / "pruning.png").stat().st_size > 1000
    # the steps share beam searches (8 masks a decode by default): each alone gives the same BLEU
    run(["fairseq-headprune", "prune", tiny_data, "--path", stock_checkpoint, "--results-dir", tmp_path / "alone",
         *PRUNE, "--order", "importance,random", "--importance", tmp_path / "importance.json",
         "--masks-per-batch", "1"])
    alone = [json.loads(line) for line in open(tmp_path / "alone" / "pruning.jsonl")][1:]
    assert [(r["key"], r["bleu"]) for r in alone] == [(r["key"], r["bleu"]) for r in rows]
    # a rerun resumes: nothing new is computed
    out = run(["fairseq-headprune", "prune", tiny_data, "--path", stock_checkpoint, "--results-dir", tmp_path, *PRUNE,
               "--order", "importance,random", "--importance", tmp_path / "importance.json"]).stdout
    assert "heads masked" not in out
    assert len(open(tmp_path / "pruning.jsonl").readlines()) == 11
    # the 50% of heads the importance order prunes, written as a spec file and physically removed
    half = parse_head_spec(f"@{tmp_path / 'heads-importance-enc-dec+dec-self-50.json'}")
    assert set(half) == set(by_order["importance"][2])
    run(["fairseq-headprune", "score", tiny_data, "--path", tmp_path / "pruned.pt", "--results-dir", tmp_path / "p",
         "--gen-subset", "valid"])
    pruned = json.loads((tmp_path / "p" / "importance.json").read_text())
    for t in ("enc-dec", "dec-self"):
        for layer, ids in enumerate(pruned["meta"]["head_ids"][t], start=1):
            assert set(ids) == {1, 2, 3, 4} - {h.head for h in half if (h.type, h.layer) == (t, layer)}


def test_prune_bad_input(tiny_data, stock_checkpoint, tmp_path):
    for extra, message in [(["--order", "oracle"], "--order oracle needs --ablation"),
                           (["--order", "best"], "unknown order 'best'"),
                           (["--types", "enc-sel"], "unknown attention type 'enc-sel'")]:
        proc = run(["fairseq-headprune", "prune", tiny_data, "--path", stock_checkpoint, "--results-dir", tmp_path,
                    *extra], check=False)
        assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1]


def test_prune_reestimate_rescores_remaining_heads(tiny_data, stock_checkpoint, tmp_path):
    """--reestimate: the first step is the importance order's, later steps re-rank only the heads still there."""
    run(["fairseq-headprune", "score", tiny_data, "--path", stock_checkpoint, "--results-dir", tmp_path,
         "--gen-subset", "valid"])
    run(["fairseq-headprune", "prune", tiny_data, "--path", stock_checkpoint, "--results-dir", tmp_path, *PRUNE,
         "--order", "importance", "--reestimate", "--importance", tmp_path / "importance.json"])
    run(["fairseq-headprune", "prune", tiny_data, "--path", stock_checkpoint, "--results-dir", tmp_path / "once",
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
    from fairseq_headprune.experiments.pruning import heads_file_name
    from fairseq_headprune.heads import ATTENTION_TYPES

    assert heads_file_name("importance", ATTENTION_TYPES, 50.0) == "heads-importance-50.json"
    assert heads_file_name("importance", ["dec-self"], 50.0) == "heads-importance-dec-self-50.json"
    assert heads_file_name("random", ["enc-dec", "dec-self"], 12.5) == "heads-random-enc-dec+dec-self-12.5.json"
