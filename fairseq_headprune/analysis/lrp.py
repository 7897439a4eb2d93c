"""Head relevance by conservative layer-wise relevance propagation (LRP) on a fairseq transformer.

Rule: the "AH+LN" rules of Ali et al. (2022), *XAI for Transformers: Better Explanations through Conservative
Propagation*. In the backward pass the attention probabilities and LayerNorm's normalisation factor
1/sqrt(var + eps) are treated as constants (detached). What remains (ReLU FFN, linear maps, residual sums,
LayerNorm's centring and affine map, the tied output projection) is piecewise linear in the inputs and biases,
so gradient x input is exactly LRP-0 on it, and relevance is conserved:

    f = sum over input embeddings x (token and positional) of x.df/dx + sum over biases b of b.df/db

(`conservation_terms` computes both sides; the test checks the identity on a tiny model.) Why this rule rather
than Voita et al.'s: their reference code uses LRP-alpha-beta through the unmodified softmax and LayerNorm, which
does not conserve relevance through those layers (Ali et al. Section 3), and it needs a relevance rule per layer
type; the conservative rule needs one backward pass and no change to fairseq's modules.

The relevance of head h is R_h = xi_h . df/dxi_h at xi = 1, xi the per-row gradient leaves that multiply each
head's output before out_proj (`masking.row_head_masks`): by the chain rule, the sum over the head's output
elements of output x gradient, i.e. the relevance LRP-0 assigns to the head's output neurons. f is the top-1
logit of one generation step; rows of a batch do not interact, so one backward of the sum over rows of step
t's top-1 logit gives every sentence's relevances for step t.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple

import torch

from fairseq_headprune.core.heads import attention_modules

Key = Tuple[str, int]
RULE = ("conservative LRP (Ali et al. 2022, AH+LN rules): attention probabilities and LayerNorm's 1/std "
        "detached, then gradient x input = LRP-0; R_h = xi_h * df/dxi_h at xi = 1, f = top-1 logit of a step")


def _is_layer_norm(module) -> bool:
    """torch's LayerNorm, or fairseq's FusedLayerNorm wrapper (apex, CUDA only): both hold normalized_shape,
    eps, weight and bias with torch's semantics."""
    return isinstance(module, torch.nn.LayerNorm) or type(module).__name__ == "FusedLayerNorm"


def _detached_layer_norm(module):
    def forward(x):
        dims = tuple(range(-len(module.normalized_shape), 0))
        centred = x - x.mean(dims, keepdim=True)
        scale = torch.rsqrt(centred.pow(2).mean(dims, keepdim=True) + module.eps).detach()
        y = centred * scale
        if module.weight is not None:
            y = y * module.weight
        if module.bias is not None:
            y = y + module.bias
        return y

    return forward


@contextlib.contextmanager
def conservative_propagation(model) -> Iterator[None]:
    """For the duration: softmax outputs of fairseq's attention and LayerNorm's 1/std are constants in the
    backward pass (forward values are unchanged up to rounding). Attention takes fairseq's Python path, whose
    softmax is fairseq.utils.softmax (the fused path has its own); the patch is global to fairseq.utils while
    active, so nothing else should run meanwhile."""
    from fairseq import utils

    softmax = utils.softmax
    modules = attention_modules(model)
    saved = {key: attn.skip_embed_dim_check for key, attn in modules.items()}
    norms = [m for m in model.modules() if _is_layer_norm(m)]

    def detached_softmax(x, dim, onnx_trace=False):
        return softmax(x, dim=dim, onnx_trace=onnx_trace).detach()

    utils.softmax = detached_softmax
    try:
        for attn in modules.values():
            attn.skip_embed_dim_check = True
        for norm in norms:
            norm.forward = _detached_layer_norm(norm)  # instance attribute: shadows the class's forward
        yield
    finally:
        utils.softmax = softmax
        for key, attn in modules.items():
            attn.skip_embed_dim_check = saved[key]
        for norm in norms:
            del norm.forward


@dataclass
class RelevanceInputs:
    """The additive inputs of the linearised network: embedding outputs (gradient leaves made per call) and
    bias parameters (given requires_grad while active)."""

    embeddings: List[torch.Tensor] = field(default_factory=list)
    biases: List[torch.Tensor] = field(default_factory=list)


def _bias_parameters(model) -> List[torch.Tensor]:
    """Parameters that enter additively: Linear/LayerNorm biases and attention bias_k/bias_v (if any)."""
    return [p for name, p in model.named_parameters()
            if name.endswith(".bias") or name.endswith("bias_k") or name.endswith("bias_v")]


@contextlib.contextmanager
def relevance_inputs(model) -> Iterator[RelevanceInputs]:
    """Make every input of the conservation identity a gradient leaf for the duration: the outputs of the
    token and positional embeddings of encoder and decoder (one leaf per call) and every bias."""
    inputs = RelevanceInputs(biases=_bias_parameters(model))
    embedders = []
    for part in (model.encoder, model.decoder):
        for name in ("embed_tokens", "embed_positions"):
            module = getattr(part, name, None)
            if module is not None and all(module is not m for m in embedders):
                embedders.append(module)  # shared embeddings: one hook, called by encoder and decoder

    def hook(_module, _inputs, output):
        leaf = output.detach().requires_grad_(True)
        inputs.embeddings.append(leaf)
        return leaf

    handles = [m.register_forward_hook(hook) for m in embedders]
    flags = [p.requires_grad for p in inputs.biases]
    for p in inputs.biases:
        p.requires_grad_(True)
    try:
        yield inputs
    finally:
        for handle in handles:
            handle.remove()
        for p, flag in zip(inputs.biases, flags):
            p.requires_grad_(flag)


def conservation_terms(f: torch.Tensor, inputs: RelevanceInputs, retain_graph: bool = True) -> Tuple[float, float]:
    """(relevance on input embeddings, relevance on biases) of the scalar f: sum x.df/dx and sum b.df/db.
    Their sum equals f under `conservative_propagation` for a piecewise-linear (ReLU) network."""
    tensors = inputs.embeddings + inputs.biases
    grads = torch.autograd.grad(f, tensors, retain_graph=retain_graph, allow_unused=True)
    return _input_terms(inputs, grads)


def _input_terms(inputs: RelevanceInputs, grads) -> Tuple[float, float]:
    totals = [0.0, 0.0]
    for i, (x, g) in enumerate(zip(inputs.embeddings + inputs.biases, grads)):
        if g is not None:
            totals[0 if i < len(inputs.embeddings) else 1] += float((x.detach().double() * g.double()).sum())
    return totals[0], totals[1]


def step_head_relevances(
    top_logits: torch.Tensor,
    valid: torch.Tensor,
    leaves: Dict[Key, torch.Tensor],
    inputs: Optional[RelevanceInputs] = None,
) -> Tuple[Dict[Key, torch.Tensor], float]:
    """Head relevances of every generation step: {key: (batch, steps, heads)}, zero where a step is padding.

    top_logits: (batch, steps) top-1 logit of each step, computed under `conservative_propagation` with the ξ
    `leaves` ((batch, heads) per module, all ones) active. With `inputs`, also the largest relative violation
    of conservation over the steps, |f - (input + bias relevance)| / |f| with f the step's summed logits (else
    nan); the same backward pass serves both."""
    keys = list(leaves)
    extra = [] if inputs is None else inputs.embeddings + inputs.biases
    batch, steps = top_logits.shape
    out = {key: torch.zeros(batch, steps, leaves[key].size(1), dtype=torch.float64) for key in keys}
    worst = float("nan") if inputs is None else 0.0
    live = [t for t in range(steps) if bool(valid[:, t].any())]
    for n, t in enumerate(live):
        rows = valid[:, t]
        f = top_logits[rows, t].sum()
        grads = torch.autograd.grad(f, [leaves[k] for k in keys] + extra, retain_graph=n < len(live) - 1,
                                    allow_unused=True)
        for key, g in zip(keys, grads):
            if g is not None:
                out[key][:, t] = (leaves[key].detach() * g).double() * rows.unsqueeze(1)
        if inputs is not None:
            x_part, b_part = _input_terms(inputs, grads[len(keys):])
            value = float(f.detach())
            worst = max(worst, abs(value - x_part - b_part) / max(abs(value), 1e-12))
    return out, worst


def layer_shares(relevance: torch.Tensor) -> torch.Tensor:
    """Each head's share of its layer's relevance at each step: |R_h| / sum_h' |R_h'| over the last dim.

    Absolute values: a head whose output lowers the top-1 logit matters as much as one that raises it, and a
    signed normalisation divides by near-zero sums when heads cancel. The sign is reported separately."""
    magnitude = relevance.abs()
    total = magnitude.sum(-1, keepdim=True)
    return torch.where(total > 0, magnitude / total.clamp_min(1e-300), torch.zeros_like(magnitude))
