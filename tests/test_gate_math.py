"""Voita et al.'s gate maths by hand, no fairseq model: the deterministic gate just inside and just outside its
clip points, Hard Concrete samples from known noise, P(open), and the L0 criterion's penalty on a stand-in model
(loss with lambda minus loss without = lambda x sample_size x sum of P(open))."""
import math
from types import SimpleNamespace

import pytest
import torch
from fairseq.modules.multihead_attention import MultiheadAttention
from torch import nn

from fairseq_headprune.criterions.label_smoothed_cross_entropy_l0 import LabelSmoothedCrossEntropyL0Criterion
from fairseq_headprune.core.gates import (
    STRETCH,
    TEMPERATURE,
    HeadGate,
    deterministic_gates,
    prob_open,
    sample_gates,
    stretch_and_clip,
)

LOG11 = math.log(11)  # sigmoid(log 11) = 11/12: 11/12 * 1.2 - 0.1 = 1 exactly; sigmoid(-log 11) * 1.2 - 0.1 = 0


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def gate_by_hand(log_alpha: float) -> float:
    return min(1.0, max(0.0, sigmoid(log_alpha) * 1.2 - 0.1))


def p_open_by_hand(log_alpha: float, temperature: float = 0.33) -> float:
    """Louizos et al. eq. 12 with (l, r) = (-0.1, 1.1): sigmoid(log α - τ log(-l / r)) = sigmoid(log α + τ log 11)."""
    return sigmoid(log_alpha + temperature * LOG11)


def test_documented_constants():
    assert STRETCH == (-0.1, 1.1) and TEMPERATURE == 0.33


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_deterministic_gate_just_inside_and_outside_the_clip_points(dtype):
    eps = 1e-3
    x = torch.tensor([-LOG11 - eps, -LOG11 + eps, LOG11 - eps, LOG11 + eps], dtype=dtype)
    gates = deterministic_gates(x)
    assert gates[0] == 0 and gates[3] == 1  # beyond the clip points: exact
    assert 0 < gates[1] < 1e-3 and 1 - 1e-3 < gates[2] < 1  # just inside: a fraction, not clipped
    for g, v in zip(gates.tolist(), x.tolist()):
        assert g == pytest.approx(gate_by_hand(v), abs=1e-6)
    # the slope at the clip points: 1.2 x sigmoid' = 1.2 x 11/144 per unit of log α
    assert float(gates[1]) == pytest.approx(eps * 1.2 * 11 / 144, rel=2e-3)
    assert 1 - float(gates[2]) == pytest.approx(eps * 1.2 * 11 / 144, rel=2e-3)


def test_deterministic_gate_in_between_by_hand():
    for v in (-2.0, -0.5, 0.0, 0.3, 1.0, 2.0):
        assert float(deterministic_gates(torch.tensor([v], dtype=torch.float64))) == pytest.approx(gate_by_hand(v),
                                                                                                 abs=1e-12)
    assert float(deterministic_gates(torch.tensor(1.0))) == pytest.approx(0.7773, abs=1e-4)  # 0.7311 x 1.2 - 0.1


def test_stretch_and_clip_at_one_twelfth_and_eleven_twelfths():
    s = torch.tensor([1 / 12 - 1e-4, 1 / 12 + 1e-4, 11 / 12 - 1e-4, 11 / 12 + 1e-4, 0.5], dtype=torch.float64)
    out = stretch_and_clip(s)
    assert out[0] == 0 and out[3] == 1
    assert out[1] == pytest.approx(1.2e-4, rel=1e-6) and out[2] == pytest.approx(1 - 1.2e-4, rel=1e-9)
    assert out[4] == pytest.approx(0.5)


def test_samples_from_known_noise_by_hand():
    log_alpha = torch.tensor([-1.0, 0.0, 0.7, 2.5], dtype=torch.float64)
    samples = sample_gates(log_alpha, 0.33, generator=torch.Generator().manual_seed(5))
    u = torch.rand(log_alpha.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64).tolist()
    for got, la, ui in zip(samples.tolist(), log_alpha.tolist(), u):
        s = sigmoid((math.log(ui) - math.log(1 - ui) + la) / 0.33)
        assert got == pytest.approx(min(1.0, max(0.0, s * 1.2 - 0.1)), abs=1e-12)


def test_p_open_by_hand():
    for temperature in (0.33, 2 / 3):
        for v in (-3.0, -1.0, 0.0, 0.5, 2.5):
            got = float(prob_open(torch.tensor([v], dtype=torch.float64), temperature))
            assert got == pytest.approx(p_open_by_hand(v, temperature), abs=1e-12)
    # the README's number: the initial log α = 2.5 is open with probability 0.96 at τ = 0.33
    assert float(prob_open(torch.tensor(2.5))) == pytest.approx(0.9641, abs=1e-4)  # sigmoid(3.291)
    gate = HeadGate(3, init_log_alpha=0.0)
    assert float(gate.expected_l0()) == pytest.approx(3 * p_open_by_hand(0.0), abs=1e-6)


# ------------------------------------------------------------------------ the L0 criterion on a stand-in model

LOG_ALPHAS = {  # (type, layer): log α per head; closed, fractional and fully open evaluation gates
    "enc-self": [-3.0, 0.0, 3.0],
    "dec-self": [1.0, -0.5, 2.5],
    "enc-dec": [0.2, -2.6, 2.41],
}


class _Attention(MultiheadAttention):
    """A fairseq attention module as far as the package's addressing goes (heads.attention_modules), holding a gate
    and nothing else: MultiheadAttention's own __init__ is skipped."""

    def __init__(self, log_alphas):
        nn.Module.__init__(self)
        self.head_gate = HeadGate(len(log_alphas), init_log_alpha=0.0)
        with torch.no_grad():
            self.head_gate.theta.copy_(torch.tensor(log_alphas))


class _Layer(nn.Module):
    def __init__(self, self_attn, encoder_attn=None):
        super().__init__()
        self.self_attn, self.encoder_attn = self_attn, encoder_attn


class StandInModel(nn.Module):
    """What the criterion touches of a fairseq transformer: forward -> (logits, extra), normalised
    probabilities, targets, and encoder/decoder layers whose attention modules hold head gates."""

    def __init__(self, batch=2, length=4, vocab=6):
        super().__init__()
        self.logits = nn.Parameter(torch.randn(batch, length, vocab, generator=torch.Generator().manual_seed(0)))
        self.encoder, self.decoder = nn.Module(), nn.Module()
        self.encoder.layers = nn.ModuleList([_Layer(_Attention(LOG_ALPHAS["enc-self"]))])
        self.decoder.layers = nn.ModuleList([_Layer(_Attention(LOG_ALPHAS["dec-self"]),
                                                    _Attention(LOG_ALPHAS["enc-dec"]))])

    def forward(self, src_tokens, src_lengths, prev_output_tokens):
        return self.logits, None

    def get_normalized_probs(self, net_output, log_probs):
        return torch.log_softmax(net_output[0], -1) if log_probs else torch.softmax(net_output[0], -1)

    def get_targets(self, sample, net_output):
        return sample["target"]


PAD = 1
TASK = SimpleNamespace(target_dictionary=SimpleNamespace(pad=lambda: PAD))
# 2 sentences, targets of 4 and 3 tokens (one pad): 7 target tokens
SAMPLE = {"net_input": {"src_tokens": torch.ones(2, 3, dtype=torch.long), "src_lengths": torch.tensor([3, 3]),
                        "prev_output_tokens": torch.ones(2, 4, dtype=torch.long)},
          "target": torch.tensor([[2, 3, 4, 5], [3, 4, 5, PAD]]), "ntokens": 7}
L0_BY_HAND = sum(p_open_by_hand(v) for values in LOG_ALPHAS.values() for v in values)


def criterion(l0_lambda, sentence_avg=False):
    return LabelSmoothedCrossEntropyL0Criterion(TASK, sentence_avg, 0.1, l0_lambda=l0_lambda)


@pytest.mark.parametrize("sentence_avg,sample_size", [(False, 7), (True, 2)])
def test_penalty_is_lambda_times_sample_size_times_sum_of_p_open(sentence_avg, sample_size):
    model = StandInModel().train()
    lam = 0.05
    plain, size0, _ = criterion(0.0, sentence_avg)(model, SAMPLE)
    penalised, size, log = criterion(lam, sentence_avg)(model, SAMPLE)
    assert size == size0 == sample_size
    assert float(penalised - plain) == pytest.approx(lam * sample_size * L0_BY_HAND, rel=1e-5)
    assert log["l0"] == pytest.approx(L0_BY_HAND, rel=1e-5)
    assert float(log["loss"]) == pytest.approx(float(penalised))
    # evaluation gates: enc-self 0, 0.5, 1; dec-self 0.777, 0.35, 1; enc-dec 0.56, 0, 1 (log 11 < 2.41)
    assert (log["gates_open"], log["gates_one"], log["gates_total"]) == (7, 3, 9)


def test_penalty_gradient_reaches_every_gate():
    model = StandInModel().train()
    lam = 0.05
    loss, size, _ = criterion(lam)(model, SAMPLE)
    loss.backward()
    for key, attn in (("enc-self", model.encoder.layers[0].self_attn), ("dec-self", model.decoder.layers[0].self_attn),
                      ("enc-dec", model.decoder.layers[0].encoder_attn)):
        # d/dlogα of λ n sigmoid(logα + τ log 11) = λ n p (1 - p); lr_scale 1 so θ = log α
        expected = [lam * size * p_open_by_hand(v) * (1 - p_open_by_hand(v)) for v in LOG_ALPHAS[key]]
        assert attn.head_gate.theta.grad.tolist() == pytest.approx(expected, rel=1e-4)


def test_criterion_refuses_a_negative_lambda_and_a_model_without_gates():
    with pytest.raises(ValueError, match="--l0-lambda must be >= 0"):
        criterion(-0.1)
    model = StandInModel()
    for layer in (*model.encoder.layers, *model.decoder.layers):
        for name in ("self_attn", "encoder_attn"):
            if getattr(layer, name) is not None:
                getattr(layer, name).head_gate = None
    with pytest.raises(RuntimeError, match="needs head gates"):
        criterion(0.1)(model, SAMPLE)
