"""Speed ceilings (core/shape.py, core/surgery.py): the shape grammar, and a crude slice of a tiny model that holds
exactly the heads, FFN units and target words asked for, exports to CTranslate2 and decodes as the slice does in
fairseq."""
from __future__ import annotations

import pytest
import torch

from helpers import load_stock, sample_batch

from fairseq_headprune.errors import UserError
from fairseq_headprune.core.heads import attention_modules
from fairseq_headprune.core.shape import Shape, kept_count
from fairseq_headprune.core.surgery import crude_model


def test_shape_grammar():
    assert Shape.parse("8/4") == Shape(8, 4)
    assert Shape.parse(" 8/3:ffn=75% ") == Shape(8, 3, ffn_percent=75)
    assert Shape.parse("8/8:vocab=50,ffn=50%") == Shape(8, 8, 50, 50)
    assert Shape.parse("8/3:ffn=75%").label == "8/3 (ffn 75%)"
    assert Shape.parse("8/8:vocab=50,ffn=50%").label == "8/8 (ffn 50%, vocab 50%)"
    for bad in ("8", "8/4/2", "a/b", "8/4:ffn", "8/4:ffn=x", "8/4:ffn=101", "8/4:layers=2", "8/4:"):
        with pytest.raises(UserError, match="--ceilings"):
            Shape.parse(bad)
    assert kept_count(1024, 75) == 768 and kept_count(10, 1) == 1 and kept_count(6044, 50, least=5) == 3022


def test_crude_model_has_the_shape_and_keeps_the_slice(tiny_data, stock_checkpoint):
    model, task = load_stock(stock_checkpoint, tiny_data)
    tgt = task.target_dictionary
    heads_before = {k: a.num_heads for k, a in attention_modules(model).items()}
    shape = Shape(4, 2, ffn_percent=50, vocab_percent=50)
    crude, dictionary = crude_model(model, tgt, shape)
    for (attn_type, _), attn in attention_modules(crude).items():
        assert attn.num_heads == (4 if attn_type == "enc-self" else 2)
        assert list(attn.head_ids) == list(range(1, attn.num_heads + 1))  # the first heads
    layers = list(crude.encoder.layers) + list(crude.decoder.layers)
    originals = list(model.encoder.layers) + list(model.decoder.layers)
    for layer, original in zip(layers, originals):
        assert layer.fc1.out_features == layer.fc2.in_features == original.fc1.out_features // 2
        assert torch.equal(layer.fc1.weight, original.fc1.weight[: layer.fc1.out_features])
    words = len(tgt) // 2
    assert len(dictionary) == words and dictionary.symbols == tgt.symbols[:words] and len(tgt) == 2 * words
    assert crude.decoder.output_projection.out_features == crude.decoder.embed_tokens.num_embeddings == words
    # the original is untouched, and the slice is a model fairseq runs
    assert {k: a.num_heads for k, a in attention_modules(model).items()} == heads_before
    assert model.decoder.output_projection.out_features == len(tgt)
    sample = sample_batch(task, 3)
    sample["net_input"]["prev_output_tokens"].clamp_(max=words - 1)  # targets within the cut vocabulary
    with torch.no_grad():
        logits = crude.eval()(**sample["net_input"])[0]
    assert logits.shape[-1] == words and torch.isfinite(logits).all()
    with pytest.raises(UserError, match="the decoder keeps 1 to"):
        crude_model(model, tgt, Shape(4, 99))


def test_cut_target_vocabulary_scores_the_kept_words_as_before(tiny_data, stock_checkpoint):
    """Any subset of words (here every third, not a prefix): the cut model gives each kept word the score the full
    model gives it, for the same previous words; the specials are always kept."""
    import copy

    from fairseq_headprune.core.surgery import cut_target_vocabulary

    model, task = load_stock(stock_checkpoint, tiny_data)
    tgt = task.target_dictionary
    sample = sample_batch(task, 3)
    prev = sample["net_input"]["prev_output_tokens"]
    words = set(range(tgt.nspecial, len(tgt), 3)) | set(prev.flatten().tolist())
    cut = copy.deepcopy(model)
    dictionary = cut_target_vocabulary(cut, tgt, words)
    keep = sorted(words | set(range(tgt.nspecial)))
    assert dictionary.symbols == [tgt[i] for i in keep] and dictionary.index(tgt[keep[-1]]) == len(keep) - 1
    new_id = {old: new for new, old in enumerate(keep)}
    net_input = dict(sample["net_input"], prev_output_tokens=prev.clone().apply_(new_id.__getitem__))
    with torch.no_grad():
        full = model(**sample["net_input"])[0]
        ours = cut.eval()(**net_input)[0]
    assert torch.allclose(ours, full[..., keep], atol=1e-5)


def test_a_ceiling_with_fewer_layers(tiny_data, stock_checkpoint):
    assert Shape.parse("4x8/2x2") == Shape(8, 2, enc_layers=4, dec_layers=2)
    assert Shape.parse("8/2x3:ffn=50%") == Shape(8, 3, ffn_percent=50, dec_layers=2)
    assert Shape.parse("6x8/3x3").label == "6x8/3x3" and Shape.parse("8/4").label == "8/4"
    for bad in ("x8/4", "2x/4", "8/4x", "2x2x8/4"):
        with pytest.raises(UserError, match="--ceilings"):
            Shape.parse(bad)
    model, task = load_stock(stock_checkpoint, tiny_data)
    crude, _ = crude_model(model, task.target_dictionary, Shape.parse("8/2x2"))
    assert (len(crude.encoder.layers), len(crude.decoder.layers)) == (4, 2)
    assert {a.num_heads for (t, _), a in attention_modules(crude).items() if t != "enc-self"} == {2}
    assert len(model.decoder.layers) == 3  # the original is untouched
    for bad, message in (("8/4x2", "decoder keeps 1 to 3 layers, not 4"), ("0x8/2", "encoder keeps 1 to 4 layers")):
        with pytest.raises(UserError, match=message):
            crude_model(model, task.target_dictionary, Shape.parse(bad))


def test_a_shape_and_its_choice_point_are_one_shape():
    whole = {"enc_heads": 8, "dec_heads": 8, "dec_layers": 6, "enc_layers": 6}
    shape = Shape.parse("4x8/3x2:ffn=50%")
    point = shape.point(whole)
    assert point == {"enc_heads": 8, "dec_heads": 2, "dec_layers": 3, "enc_layers": 4, "ffn_percent": 50.0}
    assert Shape.of_point(point, whole) == shape
    # what the whole model keeps is left out of the point, and read back whole
    assert Shape.parse("6x8/6x8").point(whole) == {"enc_heads": 8, "dec_heads": 8}
    assert Shape.of_point({"dec_heads": 4}, whole) == Shape(8, 4)
