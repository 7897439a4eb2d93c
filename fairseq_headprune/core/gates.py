"""Voita et al. (2019)'s head gates: one Hard Concrete gate per head, learned by fine-tuning with an L0 penalty.

Parameters and their sources:
- Hard Concrete distribution (Louizos, Welling & Kingma 2018, "Learning Sparse Neural Networks through L0
  Regularization", §4): s = sigmoid((log u - log(1 - u) + log α) / τ), u ~ U(0, 1), stretched to (l, r) and
  clipped to [0, 1], so that exact zeros and ones have non-zero probability.
- Stretch limits (l, r) = (-0.1, 1.1): Louizos et al.'s values, also the default of the reference code
  (lena-voita/the-story-of-heads, ConcreteGate, `stretch_limits=(-0.1, 1.1)`).
- Temperature τ = 0.33: the reference code's default (`temperature=0.33`); Louizos et al. use 2/3. A lower τ
  makes training-time samples nearer to 0/1. Set with the task's --gate-temperature.
- One gate per head, input-independent (log α of shape [1, H, 1, 1] in the reference, (H,) here), one noise
  draw per head per batch (the reference's default, `local_rep=False`).
- Evaluation: the deterministic gate clip(sigmoid(log α) (r - l) + l, 0, 1), as the reference's `get_gates`
  with is_train=False (the training median would be sigmoid(log α / τ): same sign threshold, sharper). A gate
  is exactly 0 at evaluation for log α <= -log 11, exactly 1 for log α >= log 11, a fraction in between.
- Penalty: L0 = Σ_h P(gate_h ≠ 0) = Σ_h sigmoid(log α_h - τ log(-l / r)) (Louizos et al. eq. 12; the
  reference's `get_penalty`), scaled by λ in the criterion label_smoothed_cross_entropy_l0.

Choices made here (the reference trains gates from the start of a long fine-tuning; this package fine-tunes a
converged model on a CPU budget of a few hundred updates):
- Initial log α = 2.5 (--gate-init-log-alpha): above log 11 ≈ 2.40, so every deterministic gate starts at
  exactly 1 and the gated model starts as the converged model; P(open) = 0.96 at τ = 0.33.
- log α = s · θ with θ the trained parameter and s = --gate-lr-scale: fairseq's optimizers keep one learning
  rate for every parameter (`set_lr` overwrites all groups), and for Adam this parametrisation is exactly a
  learning-rate multiplier of s for log α (Adam's step is invariant to the gradient's scale). With s = 1 it is
  the plain parametrisation.
"""
from __future__ import annotations

import math
import re
from typing import Dict, Mapping, Optional, Tuple

import torch
from torch import nn

STRETCH: Tuple[float, float] = (-0.1, 1.1)
TEMPERATURE = 0.33
INIT_LOG_ALPHA = 2.5
EPS = 1e-6  # the reference's uniform noise is drawn from (eps, 1 - eps) to keep the logit finite


def stretch_and_clip(s: torch.Tensor, stretch: Tuple[float, float] = STRETCH) -> torch.Tensor:
    low, high = stretch
    return (s * (high - low) + low).clamp(0.0, 1.0)


def sample_gates(log_alpha: torch.Tensor, temperature: float = TEMPERATURE, stretch: Tuple[float, float] = STRETCH,
                 generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """One Hard Concrete sample per element of log α (reparametrised: differentiable in log α)."""
    u = torch.rand(log_alpha.shape, generator=generator, dtype=log_alpha.dtype, device=log_alpha.device)
    u = u.clamp(EPS, 1.0 - EPS)
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / temperature)
    return stretch_and_clip(s, stretch)


def deterministic_gates(log_alpha: torch.Tensor, stretch: Tuple[float, float] = STRETCH) -> torch.Tensor:
    """The evaluation-time gate: exactly 0 for log α <= -log 11, exactly 1 for log α >= log 11 (stretch ±0.1)."""
    return stretch_and_clip(torch.sigmoid(log_alpha), stretch)


def prob_open(log_alpha: torch.Tensor, temperature: float = TEMPERATURE,
              stretch: Tuple[float, float] = STRETCH) -> torch.Tensor:
    """P(gate ≠ 0) under the training distribution: the expected L0 norm's summands."""
    low, high = stretch
    return torch.sigmoid(log_alpha - temperature * math.log(-low / high))


class HeadGate(nn.Module):
    """The gates of one attention module's heads: θ (H,) with log α = lr_scale · θ; temperature and lr_scale are
    persistent buffers so a gated checkpoint describes itself. Training mode samples, eval mode is deterministic.

    A state dict without gate entries (a stock checkpoint loaded into a gated model for fine-tuning) gets the
    gate's current values filled in by a load pre-hook, so fairseq's strict loading accepts it."""

    def __init__(self, num_heads: int, temperature: float = TEMPERATURE, init_log_alpha: float = INIT_LOG_ALPHA,
                 lr_scale: float = 1.0):
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"gate temperature must be > 0, not {temperature}")
        if not lr_scale > 0:
            raise ValueError(f"gate lr scale must be > 0, not {lr_scale}")
        self.theta = nn.Parameter(torch.full((num_heads,), float(init_log_alpha) / lr_scale))
        self.register_buffer("lr_scale", torch.tensor(float(lr_scale)))
        self.register_buffer("temperature", torch.tensor(float(temperature)))
        self._register_load_state_dict_pre_hook(self._fill_missing)

    @property
    def log_alpha(self) -> torch.Tensor:
        return self.lr_scale * self.theta

    def forward(self) -> torch.Tensor:
        if self.training:
            return sample_gates(self.log_alpha, float(self.temperature))
        return deterministic_gates(self.log_alpha)

    def expected_l0(self) -> torch.Tensor:
        return prob_open(self.log_alpha, float(self.temperature)).sum()

    def _fill_missing(self, state_dict, prefix, *_args) -> None:
        for name, tensor in list(self.named_parameters(recurse=False)) + list(self.named_buffers(recurse=False)):
            state_dict.setdefault(prefix + name, tensor.detach().clone())

    @classmethod
    def from_state_dict(cls, state_dict: Mapping[str, torch.Tensor], prefix: str) -> "HeadGate":
        gate = cls(state_dict[prefix + "theta"].numel())
        gate.load_state_dict({k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)})
        return gate


# --- gates read from a checkpoint's state dict (no data or task needed) ---

GATE_SUFFIX = ".head_gate.theta"
_MODULE_KEY = re.compile(r"^(?:.*\.)?(encoder|decoder)\.layers\.(\d+)\.(self_attn|encoder_attn)$")


def attention_key(module_path: str) -> Tuple[str, int]:
    """(type, 1-indexed layer) of an attention module's state-dict path, e.g. decoder.layers.0.encoder_attn."""
    m = _MODULE_KEY.match(module_path)
    if not m:
        raise ValueError(f"not a transformer attention module: {module_path}")
    side, layer, kind = m.groups()
    attn_type = "enc-self" if side == "encoder" else ("dec-self" if kind == "self_attn" else "enc-dec")
    return attn_type, int(layer) + 1


def log_alphas_from_state_dict(state_dict: Mapping[str, torch.Tensor]) -> Dict[Tuple[str, int], torch.Tensor]:
    """log α per (type, layer) of every gated attention module in a model state dict."""
    out = {}
    for key, theta in state_dict.items():
        if key.endswith(GATE_SUFFIX):
            module = key[: -len(GATE_SUFFIX)]
            scale = state_dict.get(module + ".head_gate.lr_scale", torch.tensor(1.0))
            out[attention_key(module)] = (theta.float() * scale.float()).detach()
    return out


def fold_gates_into_state_dict(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A stock state dict computing what the gated model computes in eval mode: each head's deterministic gate
    multiplies its out_proj input columns (0 for closed gates, fractions kept), gate entries dropped."""
    out = dict(state_dict)
    for key in [k for k in state_dict if k.endswith(GATE_SUFFIX)]:
        module = key[: -len(GATE_SUFFIX)]
        scale = state_dict.get(module + ".head_gate.lr_scale", torch.tensor(1.0))
        gates = deterministic_gates(state_dict[key].float() * scale.float())
        weight = state_dict[module + ".out_proj.weight"]
        head_dim = weight.shape[1] // gates.numel()
        out[module + ".out_proj.weight"] = (weight.float() * gates.repeat_interleave(head_dim)).to(weight.dtype)
        for name in ("theta", "lr_scale", "temperature"):
            out.pop(f"{module}.head_gate.{name}", None)
    return out
