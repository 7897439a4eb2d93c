"""The cost table's mechanism (prune.levers): levers ranked by what they buy, on shapes where the answer is known
(timed by FLOPs here, so the test is of the mechanism, not of the machine), the vocabulary map as a row of it, and
slices timed in groups that fit in memory."""
from __future__ import annotations

from argparse import Namespace

import pytest
import torch

from fairseq_headprune.core.shape import Shape
from fairseq_headprune.prune import levers


def random_model(stock_checkpoint, tiny_data, **dims):
    """A randomly initialised transformer of the stock model's task with other dimensions (speed needs no
    trained weights)."""
    from helpers import load_stock

    _, task = load_stock(stock_checkpoint, tiny_data)
    state = torch.load(stock_checkpoint, map_location="cpu", weights_only=False)
    args = state["cfg"]["model"]
    args = Namespace(**vars(args)) if isinstance(args, Namespace) else Namespace(**dict(args))
    for k, v in dims.items():
        setattr(args, k, v)
    torch.manual_seed(0)
    return task.build_model(args).eval(), task


def random_loaded(stock_checkpoint, tiny_data, **dims):
    """random_model as a loaded model (beam 2, --max-tokens 2000) with its first 32 valid sentences in 4 batches."""
    from fairseq_headprune.fairseq_io.loading import Loaded

    model, task = random_model(stock_checkpoint, tiny_data, **dims)
    task.load_dataset("valid")
    cfg = Namespace(generation=Namespace(beam=2, lenpen=1.0), dataset=Namespace(max_tokens=2000, batch_size=None))
    loaded = Loaded(cfg, task, model, None, str(stock_checkpoint))
    valid = task.dataset("valid")
    return model, loaded, [valid.collater([valid[i] for i in range(j, j + 8)]) for j in range(0, 32, 8)]


def flop_timer(loaded, samples, length: int = 6):
    """A stand-in engine whose seconds are the FLOPs of decoding (core.flops) of the model it is given."""
    from fairseq_headprune.core import flops

    src = [int(n) for s in samples for n in s["net_input"]["src_lengths"].tolist()]

    def factory(model, dictionary, folder, vocab_map=None):
        cost = flops.decode_flops(model, src, [length + 1] * len(src), 2, 8)

        def decode(batches, forced=0):
            ids = [i for s in batches for i in s["id"].tolist()]
            share = sum(s["id"].numel() for s in batches) / len(src)
            return {"seconds": cost * share, "hypotheses": {i: [4] * (forced or length) for i in ids}}
        return decode
    return factory


@pytest.mark.parametrize("dims,first,left_out", [
    # wide FFNs, few narrow heads, a shallow decoder: the FFN buys the most
    (dict(encoder_ffn_embed_dim=1024, decoder_ffn_embed_dim=1024, encoder_attention_heads=2,
          decoder_attention_heads=2, decoder_layers=2), "FFN units", ()),
    # many heads in a deep decoder, thin FFNs: the decoder's heads buy the most (of the levers within a layer: half
    # the decoder's layers take half its heads and the rest of those layers too, so in FLOPs they buy more)
    (dict(encoder_ffn_embed_dim=8, decoder_ffn_embed_dim=8, decoder_layers=6, encoder_layers=1,
          encoder_attention_heads=8, decoder_attention_heads=8), "decoder heads", ("decoder layers",)),
    # a deep decoder over a one-layer encoder: its depth buys the most
    (dict(decoder_layers=6, encoder_layers=1), "decoder layers", ()),
])
def test_cost_table_ranks_the_levers_a_shape_rewards(tiny_data, stock_checkpoint, dims, first, left_out):
    model, loaded, samples = random_loaded(stock_checkpoint, tiny_data, **dims)
    chosen = tuple(lever for lever in levers.LEVERS if lever.name not in left_out)
    table = levers.cost_table(loaded, "fairseq", samples, 2, chosen, log=lambda _: None,
                           decoder_factory=flop_timer(loaded, samples))
    order = [name for name, _ in levers.lever_order(table)]
    assert order[0] == first, table["rows"]
    # the decoder's depth is measured at every count below the whole, as the heads are
    depth = [r["value"] for r in table["rows"] if r["field"] == "dec_layers"]
    assert depth == ([] if left_out else list(range(dims["decoder_layers"] - 1, 0, -1)))
    assert table["whole"]["dec_layers"] == dims["decoder_layers"]
    # the rows are monotone once smoothed, and a prediction multiplies the shares of time each lever leaves
    for field in ("enc_heads", "dec_heads", "dec_layers"):
        saved = [r["saved"] for r in sorted(table["rows"], key=lambda r: r["value"]) if r["field"] == field]
        assert saved == sorted(saved, reverse=True)
    whole = table["whole"]
    point = {"enc_heads": 1, "dec_heads": 1, **({} if left_out else {"dec_layers": 1})}
    expected = 1 / ((1 - levers.saved(table, "enc_heads", 1)) * (1 - levers.saved(table, "dec_heads", 1))
                    * (1 - (0 if left_out else levers.saved(table, "dec_layers", 1))))
    assert levers.predict(table, point) == pytest.approx(expected)
    assert levers.predict(table, {"enc_heads": whole["enc_heads"]}) == 1.0


def test_the_vocabulary_map_is_a_row_of_the_cost_table_and_multiplies_every_prediction(tiny_data, stock_checkpoint):
    """With a vocabulary map, the cost table times the whole model decoding with it (the map reaches that row's
    decoder and no other), says what it changes in the unpruned model's translations, and a prediction with the map
    multiplies the share of time it leaves."""
    model, loaded, samples = random_loaded(stock_checkpoint, tiny_data, decoder_layers=3, encoder_layers=1)
    timer, given = flop_timer(loaded, samples), {}

    def factory(model, dictionary, folder, vocab_map=None):  # the map's decoder: the whole model, at 4/5 the cost
        given[folder] = vocab_map
        run = timer(model, dictionary, folder)
        return (lambda batches, forced=0: {**run(batches, forced), "seconds": 0.8 * run(batches, forced)["seconds"]}
                ) if vocab_map else run

    table = levers.cost_table(loaded, "fairseq", samples, 12, log=lambda _: None, decoder_factory=factory,
                              vocab_map="vmap.txt")
    assert sorted(given.values(), key=str).count("vmap.txt") == 1 and list(given.values())[-1] == "vmap.txt"
    row = table["rows"][-1]
    assert (row["field"], row["lever"], row["removable"]) == (levers.MAP, "vocabulary map", True)
    assert row["speedup"] == pytest.approx(1.25) and row["sign_test"]["batches"] >= levers.MIN_PAIRED
    assert row["translations"]["sentences"] == 32 and row["translations"]["differing"] == 0
    assert row["translations"]["bleu_with"] == row["translations"]["bleu_without"]
    point = {"enc_heads": 1, "dec_layers": 1}
    assert levers.predict(table, {**point, levers.MAP: 1}) == pytest.approx(1.25 * levers.predict(table, point))
    assert levers.predict(table, {**point, levers.MAP: 0}) == pytest.approx(levers.predict(table, point))
    assert dict(levers.lever_order(table))["vocabulary map"] == pytest.approx(1.25)
    with pytest.raises(ValueError, match="no row for the vocabulary map"):
        levers.predict({"rows": [], "whole": {}}, {levers.MAP: 1})


def test_slices_are_timed_in_groups_that_fit_in_memory(tiny_data, stock_checkpoint, monkeypatch):
    """A model whose slices would not fit in memory together is timed in groups (each beside the unpruned model, each
    slice paired with the unpruned model's seconds of its own group); a small one in a single group, as before."""
    assert levers.memory_groups(["a", "b", "c"], 10, 1000) == [["a", "b", "c"]]
    assert levers.memory_groups(["a", "b", "c", "d", "e"], 100, 1200) == [["a", "b"], ["c", "d"], ["e"]]
    assert levers.memory_groups(["a", "b"], 10**9, 10) == [["a"], ["b"]]  # never fewer than one a group
    assert levers.memory_groups(["a", "b"], 0, None) == [["a", "b"]]
    assert levers.available_memory() is None or levers.available_memory() > 0
    model, loaded, samples = random_loaded(stock_checkpoint, tiny_data, decoder_layers=3, encoder_layers=1)
    shapes = {f"dec_layers={n}": Shape.of_point({"dec_layers": n}, levers.stack_sizes(model)) for n in (2, 1)}
    alone = levers.time_shapes(loaded, "fairseq", samples, 3, shapes, log=lambda _: None,
                               decoder_factory=flop_timer(loaded, samples))
    printed = []
    monkeypatch.setattr(levers, "available_memory", lambda: int(2.5 * levers.RESIDENT_PER_BYTE_ON_DISK
                                                                / levers.MEMORY_SHARE * levers.parameter_bytes(model)))
    grouped = levers.time_shapes(loaded, "fairseq", samples, 3, shapes, log=printed.append,
                                 decoder_factory=flop_timer(loaded, samples))
    assert "in 2 groups of at most 1" in printed[0]
    assert grouped["speedup"] == alone["speedup"] and grouped["faster"] == alone["faster"]  # FLOP-timed: no noise
    assert grouped["flop_ratio"] == alone["flop_ratio"] and len(grouped["speedup"]) == 2
