"""Least-squares reconstruction of a head-pruned model, layer by layer from the bottom (after Kwon et al. 2022,
step 3), with no gradient step.

The student is the model with its removed heads masked (ξ = 0); the teacher is the unpruned model (or one with a
milder mask). For each attention sublayer in forward order (encoder self-attention 1..L, then per decoder layer
its self-attention and its encoder-decoder attention), on every non-pad calibration token:

    target  y = (teacher's residual stream after the sublayer) - (student's residual stream before it) - b_out

i.e. what the student's attention output must add for its residual stream to be back on the teacher's: the drift
that the already reconstructed layers below left is corrected here too (Kwon's target), not only the local loss of
this sublayer. The student's forward stops at the sublayer (an exception from its hook), so sublayer k costs the
layers below it only. Then one of:

- `scales`: one factor per kept head, min Σ ||Σ_h s_h o_h - y||² (o_h = the head's contribution through out_proj),
  normal equations summed over tokens (float64); folded into out_proj's columns of that head.
- `out-proj`: the kept columns W of out_proj refit as a ridge regression towards the original weights:
  (X'X + λI) W'' = X'Y + λ W'  (X = the kept heads' outputs before out_proj, λ = ridge · mean diagonal of X'X).
  With nothing removed and no drift, X W' = Y exactly and the refit returns W.
- a sublayer whose every head is removed outputs out_proj's bias: `empty_bias` sets it to the bias plus the
  mean target (its least-squares optimum).

Guards: a singular or ill-conditioned system (condition > max_condition), a non-finite solution, a scale with
|s| > max_scale (Kwon stops there), refit weights whose norm grows past max_scale times the original, or a fit
that does not lower the reconstruction error leaves that sublayer as it was (`out-proj` first falls back to
`scales`); the reason is recorded in its SublayerFit.
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from fairseq_headprune.heads import attention_modules
from fairseq_headprune.mask_search import keys_in_order

Key = Tuple[str, int]
METHODS = ("none", "scales", "out-proj")


@dataclass
class ReconstructionOptions:
    method: str = "out-proj"  # none | scales | out-proj
    ridge: float = 1e-3
    max_scale: float = 10.0
    max_condition: float = 1e12
    refit_unpruned: bool = False  # also refit sublayers that lost no head (they see the drift from below too)
    empty_bias: bool = True
    refit_ffn: bool = False  # also refit every FFN's fc2 (ridge, same drift-corrected targets): beyond Kwon


@dataclass
class SublayerFit:
    key: Key
    kept: int
    method: str  # what was applied: scales | out-proj | bias | none
    error_before: float  # Σ ||output - y||² over calibration tokens, before and after
    error_after: float
    target_energy: float  # Σ ||y + b_out - residual part||²: scale of the errors (Σ ||teacher sublayer delta||²)
    tokens: int
    scales: Optional[List[float]] = None
    fallback: Optional[str] = None
    condition: Optional[float] = None

    def as_json(self) -> dict:
        d = asdict(self)
        d["key"] = f"{self.key[0]}:{self.key[1]}"
        return d


class _Stop(Exception):
    """Raised by a capture hook once the sublayer of interest has run: nothing above it needs computing."""


@dataclass
class _Capture:
    residual: List[torch.Tensor] = field(default_factory=list)
    output: List[torch.Tensor] = field(default_factory=list)
    context: List[torch.Tensor] = field(default_factory=list)


FFN_TYPES = ("enc-ffn", "dec-ffn")


def _parts(model, key: Key):
    """(layer, the module whose output the sublayer adds to the residual stream, the linear layer whose input is
    refit (out_proj or fc2), the LayerNorm before (pre-norm) or after (post-norm) the sublayer, is attention)."""
    t, i = key
    layer = model.encoder.layers[i - 1] if t in ("enc-self", "enc-ffn") else model.decoder.layers[i - 1]
    if getattr(layer, "attn_ln", None) is not None or getattr(layer, "w_resid", None) is not None:
        raise NotImplementedError("decoder layers with --scale-attn or --scale-resids are not supported")
    if t in FFN_TYPES:
        return layer, layer.fc2, layer.fc2, layer.final_layer_norm, False
    attn = attention_modules(model)[key]
    norm = layer.encoder_attn_layer_norm if t == "enc-dec" else layer.self_attn_layer_norm
    return layer, attn, attn.out_proj, norm, True


def sublayer_keys(model, ffn: bool = False) -> List[Key]:
    """Attention (and with ffn, FFN) sublayers in forward order."""
    keys = keys_in_order(attention_modules(model))
    if not ffn:
        return keys
    out = []
    for key in keys:
        out.append(key)
        if key[0] == "enc-self":
            out.append(("enc-ffn", key[1]))
        elif key[0] == "enc-dec" or (key[0] == "dec-self" and ("enc-dec", key[1]) not in keys):
            out.append(("dec-ffn", key[1]))
    return out


@contextlib.contextmanager
def capture(model, keys: Sequence[Key], context: bool = False, stop_at: Optional[Key] = None
            ) -> Iterator[Dict[Key, _Capture]]:
    """Record, per forward, each sublayer's residual stream before it, its attention output (after out_proj, with
    its bias) and, with `context`, out_proj's input before any head mask (the heads' outputs, T x B x H*head_dim).
    With stop_at, the forward raises _Stop right after that sublayer."""
    records = {key: _Capture() for key in keys}
    handles, forced = [], []
    for key in keys:
        layer, module, linear, norm, is_attention = _parts(model, key)
        rec = records[key]
        if layer.normalize_before:  # residual = the LayerNorm's input before the sublayer
            handles.append(norm.register_forward_pre_hook(lambda _m, args, rec=rec: rec.residual.append(args[0])))
        elif is_attention:  # post-norm: the residual is the attention's query itself
            handles.append(module.register_forward_pre_hook(
                lambda _m, args, kwargs, rec=rec: rec.residual.append(kwargs.get("query", args[0] if args else None)),
                with_kwargs=True))
        else:  # post-norm FFN: fc1's input
            handles.append(layer.fc1.register_forward_pre_hook(
                lambda _m, args, rec=rec: rec.residual.append(args[0])))

        def after(_m, _args, output, rec=rec, key=key):
            rec.output.append(output[0] if isinstance(output, tuple) else output)
            if stop_at == key:
                raise _Stop

        handles.append(module.register_forward_hook(after))
        if context:
            # registered before any mask hook of the masked forward, so it sees the unmasked head outputs
            handles.append(linear.register_forward_pre_hook(lambda _m, args, rec=rec: rec.context.append(args[0])))
            if is_attention:
                forced.append((module, module.skip_embed_dim_check))
                module.skip_embed_dim_check = True  # per-head outputs exist on fairseq's Python path only
    try:
        yield records
    finally:
        for h in handles:
            h.remove()
        for attn, flag in forced:
            attn.skip_embed_dim_check = flag


def token_mask(sample, key: Key, pad: int) -> torch.Tensor:
    """(T, B) boolean: the real (non-pad) positions of the sublayer's stream in the batch."""
    if key[0] in ("enc-self", "enc-ffn"):
        return sample["net_input"]["src_tokens"].ne(pad).t()
    return sample["target"].ne(pad).t()


@torch.no_grad()
def teacher_targets(teacher, samples: Sequence[dict], keys: Sequence[Key], pad: int) -> Dict[Key, List[torch.Tensor]]:
    """Per sublayer and batch: the teacher's residual stream after the sublayer at the real tokens, (n, d)."""
    teacher.eval()
    out: Dict[Key, List[torch.Tensor]] = {key: [] for key in keys}
    for sample in samples:
        with capture(teacher, keys) as rec:
            teacher(**sample["net_input"], features_only=True)
        for key in keys:
            m = token_mask(sample, key, pad)
            out[key].append((rec[key].residual[0] + rec[key].output[0])[m].float())
    return out


class _Student:
    """Runs the student up to one sublayer; caches its encoder output once the encoder no longer changes."""

    def __init__(self, model, samples):
        self.model, self.samples = model, samples
        self._encoder_outs: Optional[List[dict]] = None

    def run_to(self, b: int, key: Key, context: bool):
        model, sample = self.model, self.samples[b]
        net_input = sample["net_input"]
        with capture(model, [key], context=context, stop_at=key) as rec:
            try:
                if key[0] in ("enc-self", "enc-ffn"):
                    model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
                else:
                    if self._encoder_outs is None:
                        self._encoder_outs = [
                            model.encoder(s["net_input"]["src_tokens"], src_lengths=s["net_input"]["src_lengths"])
                            for s in self.samples]
                    model.decoder(net_input["prev_output_tokens"], encoder_out=self._encoder_outs[b],
                                  features_only=True)
            except _Stop:
                pass
        return rec[key]


def _kept_positions(attn) -> List[int]:
    return (attn.head_mask != 0).nonzero().flatten().tolist()


@torch.no_grad()
def reconstruct(teacher, student, samples: Sequence[dict], pad: int, options: ReconstructionOptions,
                log=None) -> List[SublayerFit]:
    """Reconstruct `student` (masked; weights changed in place) towards `teacher` on the calibration samples.

    Sublayers with a removed head are fitted (all sublayers with refit_unpruned); returns one SublayerFit each."""
    if options.method not in METHODS:
        raise ValueError(f"unknown reconstruction method {options.method!r}")
    if options.method == "none":
        return []
    teacher.eval()
    student.eval()
    modules = attention_modules(student)
    keys = sublayer_keys(student, ffn=options.refit_ffn)

    def pruned(key):
        return key[0] not in FFN_TYPES and bool((modules[key].head_mask == 0).any())

    def wanted(i, key):
        if key[0] in FFN_TYPES:  # an FFN below every pruned sublayer sees exactly the teacher's inputs: nothing to fit
            return any(pruned(k) for k in keys[:i])
        return options.refit_unpruned or pruned(key)

    todo = [k for i, k in enumerate(keys) if wanted(i, k)]
    if not todo:
        return []
    targets = teacher_targets(teacher, samples, todo, pad)
    runner = _Student(student, samples)
    fits = []
    for key in todo:
        if key[0] in FFN_TYPES:
            fit = _fit_ffn(runner, key, targets[key], pad, options)
        else:
            fit = _fit_sublayer(runner, key, modules[key], targets[key], pad, options)
        fits.append(fit)
        if log:
            note = f" (fallback: {fit.fallback})" if fit.fallback else ""
            energy = max(fit.target_energy, 1e-30)
            unit = "units" if key[0] in FFN_TYPES else "heads"
            log(f"{key[0]}:{key[1]} {fit.kept} {unit} kept, {fit.method}: relative error "
                f"{fit.error_before / energy:.4f} -> {fit.error_after / energy:.4f}{note}")
    return fits


def _fit_sublayer(runner: _Student, key: Key, attn, targets: List[torch.Tensor], pad: int,
                  options: ReconstructionOptions) -> SublayerFit:
    kept = _kept_positions(attn)
    hd, W, bias = attn.head_dim, attn.out_proj.weight, attn.out_proj.bias
    d = W.size(0)
    cols = torch.tensor([p * hd + i for p in kept for i in range(hd)], dtype=torch.long)
    Wk = W.detach().double()[:, cols] if kept else None
    b = bias.detach().double() if bias is not None else torch.zeros(d, dtype=torch.float64)
    k = len(kept)
    AtA = torch.zeros(k, k, dtype=torch.float64)
    Atb = torch.zeros(k, dtype=torch.float64)
    XtX = torch.zeros(k * hd, k * hd, dtype=torch.float64)
    XtY = torch.zeros(k * hd, d, dtype=torch.float64)
    YY, Ysum, n, energy = 0.0, torch.zeros(d, dtype=torch.float64), 0, 0.0
    for bi in range(len(runner.samples)):
        rec = runner.run_to(bi, key, context=bool(kept))
        m = token_mask(runner.samples[bi], key, pad)
        residual = rec.residual[0][m].double()
        Y = targets[bi].double() - residual - b  # what the heads (through out_proj, without bias) must add
        YY += float(Y.pow(2).sum())
        Ysum += Y.sum(0)
        n += Y.size(0)
        energy += float((Y + b).pow(2).sum())
        if kept:
            X = rec.context[0][m].double()[:, cols]  # (n, k*hd)
            heads_out = torch.einsum("nkh,dkh->nkd", X.view(-1, k, hd), Wk.view(d, k, hd))
            AtA += torch.einsum("nkd,njd->kj", heads_out, heads_out)
            Atb += torch.einsum("nkd,nd->k", heads_out, Y)
            XtX += X.t() @ X
            XtY += X.t() @ Y
    if not kept:
        error_before = YY
        if not options.empty_bias or bias is None or n == 0:
            return SublayerFit(key, 0, "none", error_before, error_before, energy, n)
        shift = Ysum / n
        error_after = YY - n * float(shift.pow(2).sum())
        bias.data.copy_((b + shift).to(bias.dtype))
        return SublayerFit(key, 0, "bias", error_before, error_after, energy, n)
    ones = torch.ones(k, dtype=torch.float64)
    error_before = float(ones @ AtA @ ones - 2 * ones @ Atb + YY)
    fit = SublayerFit(key, k, "none", error_before, error_before, energy, n)
    reasons = []
    if options.method == "out-proj":
        ok, reason = _refit_out_proj(attn, cols, Wk, XtX, XtY, YY, error_before, options, fit)
        if ok:
            return fit
        reasons.append(f"out-proj refit: {reason}")
    ok, reason = _fit_scales(attn, kept, cols, AtA, Atb, YY, error_before, options, fit)
    if not ok:
        reasons.append(f"scales: {reason}")
    fit.fallback = "; ".join(reasons) or None
    return fit


def _fit_ffn(runner: _Student, key: Key, targets: List[torch.Tensor], pad: int,
             options: ReconstructionOptions) -> SublayerFit:
    """Ridge refit of an FFN's fc2 towards the drift-corrected target (every hidden unit kept)."""
    layer = runner.model.encoder.layers[key[1] - 1] if key[0] == "enc-ffn" else runner.model.decoder.layers[key[1] - 1]
    fc2 = layer.fc2
    W = fc2.weight.detach().double()
    d, hidden = W.shape
    b = fc2.bias.detach().double() if fc2.bias is not None else torch.zeros(d, dtype=torch.float64)
    XtX = torch.zeros(hidden, hidden, dtype=torch.float64)
    XtY = torch.zeros(hidden, d, dtype=torch.float64)
    YY, n, energy = 0.0, 0, 0.0
    for bi in range(len(runner.samples)):
        rec = runner.run_to(bi, key, context=True)
        m = token_mask(runner.samples[bi], key, pad)
        Y = targets[bi].double() - rec.residual[0][m].double() - b
        X = rec.context[0][m].double()
        YY += float(Y.pow(2).sum())
        energy += float((Y + b).pow(2).sum())
        n += Y.size(0)
        XtX += X.t() @ X
        XtY += X.t() @ Y
    error_before = float((W.t() * (XtX @ W.t())).sum() - 2 * (W.t() * XtY).sum() + YY)
    fit = SublayerFit(key, hidden, "none", error_before, error_before, energy, n)

    class _Linear:  # _refit_out_proj's view of the layer: all columns refit
        out_proj = fc2

    ok, reason = _refit_out_proj(_Linear, torch.arange(hidden), W, XtX, XtY, YY, error_before, options, fit)
    if ok:
        fit.method = "fc2"
    else:
        fit.fallback = f"fc2 refit: {reason}"
    return fit


def _fit_scales(attn, kept, cols, AtA, Atb, YY, error_before, options, fit) -> Tuple[bool, str]:
    cond = float(torch.linalg.cond(AtA)) if AtA.numel() else 1.0
    fit.condition = cond
    if not (cond < options.max_condition):
        return False, f"ill-conditioned normal equations (condition {cond:.3g})"
    s = torch.linalg.solve(AtA, Atb)
    if not torch.isfinite(s).all():
        return False, "non-finite solution"
    if float(s.abs().max()) > options.max_scale:
        return False, f"a scale of {float(s.abs().max()):.3g} exceeds {options.max_scale:g}"
    error_after = float(s @ AtA @ s - 2 * s @ Atb + YY)
    if not error_after <= error_before + 1e-6 * max(abs(YY), 1e-12):  # equal up to rounding counts as no worse
        return False, "the fit does not lower the reconstruction error"
    W = attn.out_proj.weight
    factors = s.repeat_interleave(attn.head_dim).to(W.dtype)
    W.data[:, cols] = W.data[:, cols] * factors
    fit.method, fit.error_after, fit.scales = "scales", error_after, [float(x) for x in s]
    return True, ""


def _refit_out_proj(attn, cols, Wk, XtX, XtY, YY, error_before, options, fit) -> Tuple[bool, str]:
    dim = XtX.size(0)
    lam = options.ridge * float(XtX.diagonal().mean())
    system = XtX + lam * torch.eye(dim, dtype=XtX.dtype)
    cond = float(torch.linalg.cond(system))
    fit.condition = cond
    if not (cond < options.max_condition):
        return False, f"ill-conditioned (condition {cond:.3g})"
    Wt = torch.linalg.solve(system, XtY + lam * Wk.t())  # (k*hd, d)
    if not torch.isfinite(Wt).all():
        return False, "non-finite solution"
    growth = float(Wt.norm() / max(float(Wk.norm()), 1e-30))
    if growth > options.max_scale:
        return False, f"weights grew {growth:.3g}x"
    error_after = float((Wt * (XtX @ Wt)).sum() - 2 * (Wt * XtY).sum() + YY)
    if not error_after <= error_before + 1e-6 * max(abs(YY), 1e-12):  # equal up to rounding counts as no worse
        return False, "the fit does not lower the reconstruction error"
    W = attn.out_proj.weight
    W.data[:, cols] = Wt.t().to(W.dtype)
    fit.method, fit.error_after = "out-proj", error_after
    return True, ""
