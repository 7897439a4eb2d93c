"""Forwards that start at the lowest masked layer (the loss preview) and decodes that reuse the encoder output
give what a full forward or a fresh decode gives."""
import pytest
import torch

from fairseq_headprune.core.heads import Head

MASKS = [
    [],
    [Head("enc-self", 1, 2)],
    [Head("enc-self", 3, 1), Head("dec-self", 1, 4)],
    [Head("enc-self", 4, 2)],  # the encoder from its top layer: the three below reused
    [Head("enc-dec", 1, 3)],
    [Head("dec-self", 3, 2)],
    [Head("enc-dec", 3, 1), Head("dec-self", 2, 2)],
    [Head("enc-dec", 2, h) for h in range(1, 5)],
]


@pytest.fixture(scope="module")
def evaluator(tiny_data, stock_checkpoint):
    from fairseq_headprune import cli
    from fairseq_headprune.decoding.evaluate import SubsetEvaluator
    from fairseq_headprune.cli import ablate as ablation
    from fairseq_headprune.fairseq_io.loading import load

    cfg, _ = cli.parse("ablate", ablation, [str(tiny_data), "--path", str(stock_checkpoint), "--results-dir", "unused",
                                            "--gen-subset", "test", "--beam", "4", "--max-tokens", "1200"])
    evaluator = SubsetEvaluator(load(cfg), "test")
    assert len(evaluator.samples) > 1
    return evaluator


@torch.no_grad()
def full_forward_nll(evaluator) -> float:
    """Teacher-forced NLL per token from plain full forwards, padding masked after the log-softmax."""
    model, pad = evaluator.loaded.model, evaluator.loaded.task.target_dictionary.pad()
    total, tokens = 0.0, 0
    for sample in evaluator.samples:
        lprobs = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
        target = sample["target"]
        nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        total += float(nll.masked_fill(target.eq(pad), 0).sum())
        tokens += int(target.ne(pad).sum())
    return total / tokens


def test_nll_from_cached_layer_inputs_equals_the_full_forward(evaluator):
    from fairseq_headprune.core.masking import set_head_masks

    model = evaluator.loaded.model
    values = []
    try:
        for mask in MASKS + MASKS[::-1]:  # masks set in both orders: the cache never holds a masked input
            set_head_masks(model, mask)
            cached, full = evaluator.nll(), full_forward_nll(evaluator)
            assert cached == pytest.approx(full, abs=1e-5), mask
            values.append(cached)
    finally:
        set_head_masks(model, [])
    assert len({round(v, 6) for v in values[: len(MASKS)]}) == len(MASKS), "every mask must change the NLL"


def test_cache_follows_new_weights(evaluator):
    from fairseq_headprune.core.masking import set_head_masks

    model = evaluator.loaded.model
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        set_head_masks(model, [Head("dec-self", 2, 1)])
        before = evaluator.nll()
        with torch.no_grad():
            model.encoder.layers[0].fc2.weight.mul_(10.0)  # a change below every cached input
        after = evaluator.nll()
        assert after == pytest.approx(full_forward_nll(evaluator), abs=1e-5)
        assert after != pytest.approx(before, abs=1e-3)
    finally:
        model.load_state_dict(saved)
        set_head_masks(model, [])


def test_decoding_with_the_reused_encoder_equals_a_fresh_decode(evaluator):
    """translate() reuses the unmasked encoder output under decoder-side masks; a generator of fairseq's own,
    running the encoder every time, gives the same hypotheses."""
    from fairseq_headprune.core.masking import set_head_masks

    loaded = evaluator.loaded
    generator = loaded.task.build_generator([loaded.model], loaded.cfg.generation)
    try:
        for mask in MASKS:
            set_head_masks(loaded.model, mask)
            ours = evaluator.translate()
            fresh = [""] * evaluator.size
            with torch.no_grad():
                for sample in evaluator.samples:
                    outputs = loaded.task.inference_step(generator, [loaded.model], sample)
                    for sid, nbest in zip(sample["id"].tolist(), outputs):
                        fresh[sid] = evaluator.hypothesis_text(nbest[0])
            assert ours == fresh, mask
    finally:
        set_head_masks(loaded.model, [])
