"""Least-squares reconstruction of a head-pruned model, layer by layer from the bottom (after Kwon et al. 2022,
step 3), with no gradient step.

The student is the model with its removed heads masked (ξ = 0); the teacher is the unpruned model (or one with a
milder mask). For each attention sublayer in forward order (encoder self-attention 1..L, then per decoder layer
its self-attention and its encoder-decoder attention), on every non-pad calibration token:

    target  y = (teacher's residual stream after the sublayer) - (student's residual stream before it) - b_out

i.e. what the student's attention output must add for its residual stream to be back on the teacher's: the drift
that the already reconstructed layers below left is corrected here too (Kwon's target), not only the local loss of
this sublayer. The student's forward stops at the sublayer (an exception from its hook) and starts at the input of
the layer the last forward reached (the layers below are final by then), so a fit costs its own layer, not the
layers below it. Then one of:

- `scales`: one factor per kept head, min Σ ||Σ_h s_h o_h - y||² (o_h = the head's contribution through out_proj),
  normal equations summed over tokens (float64); folded into out_proj's columns of that head.
- `out-proj`: the kept columns W of out_proj refit as a ridge regression towards the original weights:
  (X'X + λI) W'' = X'Y + λ W'  (X = the kept heads' outputs before out_proj, λ = ridge · mean diagonal of X'X).
  With nothing removed and no drift, X W' = Y exactly and the refit returns W.
- a sublayer whose every head is removed outputs out_proj's bias: `empty_bias` sets it to the bias plus the
  mean target (its least-squares optimum).

Beyond Kwon, with `refit_inputs`: every sublayer above the first pruned one reads a drifted input (its LayerNorm's
output, or the encoder's output for encoder-decoder keys and values). A map x -> M x + c from the student's input
to the teacher's is fitted by ridge least squares towards the identity on the calibration tokens, then folded into
the linear layers that read it (q/k/v, fc1: W' = W M, b' = b + W c) before the sublayer's own output is fitted.
M is unconstrained, so the map that is best in the input space is also best for any of those layers' outputs.

With `window.steps`, each refit attention sublayer is then fitted whole, softmax included, by Adam steps towards
the same target (`window_fit`): the closed-form fit is its starting point.

Guards: a singular or ill-conditioned system (condition > max_condition; a ridge system's is bounded without an
SVD where the bound clears it: ridge_condition), a non-finite solution, a scale with
|s| > max_scale (Kwon stops there), refit weights whose norm grows past max_scale times the original, or a fit
that does not lower the reconstruction error leaves that sublayer as it was (`out-proj` first falls back to
`scales`); the reason is recorded in its SublayerFit.
"""
from __future__ import annotations

import contextlib
import math

from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from fairseq_headprune.core.heads import attention_modules
from fairseq_headprune.decoding.layer_inputs import starting_at
from fairseq_headprune.prune.sublayers import (ENCODER_OUT, ENCODER_TYPES, FFN_TYPES, Key, StopForward,
                                                  SublayerFit, input_consumers, capture, capture_inputs,
                                                  sublayer_keys, token_mask)
from fairseq_headprune.prune.window_fit import WindowOptions, fit_window
from fairseq_headprune.options import nested, option
from fairseq_headprune.prune.layers import teacher_key
from fairseq_headprune.core.shape import depths

METHODS = ("none", "scales", "out-proj")


@dataclass
class ReconstructionOptions:
    method: str = option("out-proj", flag="--refit", choices=METHODS,
                         help="reconstruction: none, one scale per kept head (Kwon), or a ridge refit of out_proj")
    ridge: float = option(1e-3, flag="--ridge", help="ridge of the out_proj refit (times the mean diagonal)")
    max_scale: float = option(10.0, flag="--max-scale",
                              help="a fit whose scale or weight norm grows past this factor is not applied (the "
                                   "sublayer is left as it was)")
    max_condition: float = 1e12
    refit_unpruned: bool = option(False, flag="--refit-unpruned", help="also refit sublayers that lost no head")
    empty_bias: bool = option(True, flag="--no-empty-bias", negate=True,
                              help="leave the bias of emptied sublayers as it is")
    refit_ffn: bool = option(True, flag="--no-refit-ffn", negate=True,
                             help="leave the FFNs alone (by default every fc2 is refit towards the same "
                                  "drift-corrected targets)")
    refit_inputs: bool = option(False, flag="--refit-inputs",
                                help="also map every drifted sublayer input back onto the unpruned model's, folded "
                                     "into q/k/v and fc1 (beyond Kwon)")
    window: WindowOptions = nested(WindowOptions, section="window fit")


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


class TeacherTargets:
    """teacher_targets of one teacher on one set of calibration samples, every sublayer's, computed in one run of
    the teacher when first asked and held: students fitted towards the same teacher on the same samples (the
    choice's structures, the steps of a search, each a reconstruct) run the teacher once, not once a student.
    Held: what one reconstruct whose every sublayer is pruned holds while it fits."""

    def __init__(self, teacher, samples: Sequence[dict], pad: int):
        self.teacher, self.samples, self.pad = teacher, samples, pad
        self._held: Dict[Key, List[torch.Tensor]] = {}

    def serves(self, teacher, samples: Sequence[dict]) -> bool:
        """Whether these are its teacher and samples (the very objects: a masked or cut copy is another teacher)."""
        return teacher is self.teacher and samples is self.samples

    def of(self, keys: Sequence[Key]) -> Dict[Key, List[torch.Tensor]]:
        if not self._held:
            self._held = teacher_targets(self.teacher, self.samples, sublayer_keys(self.teacher, ffn=True), self.pad)
        return {key: self._held[key] for key in keys}


@torch.no_grad()
def teacher_inputs(teacher, samples: Sequence[dict], keys: Sequence[Key], pad: int, encoder_out: bool
                   ) -> Dict[Key, List[torch.Tensor]]:
    """Per sublayer (and with encoder_out, for the encoder output) and batch: the teacher's input stream at the
    real tokens, (n, d)."""
    teacher.eval()
    out: Dict[Key, List[torch.Tensor]] = {key: [] for key in keys}
    enc_key = (ENCODER_OUT, len(teacher.encoder.layers))
    if encoder_out:
        out[enc_key] = []
    for sample in samples:
        net_input = sample["net_input"]
        with capture_inputs(teacher, keys) as rec:
            enc = teacher.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
            if any(key[0] not in ENCODER_TYPES for key in keys):
                teacher.decoder(net_input["prev_output_tokens"], encoder_out=enc, features_only=True)
        for key in keys:
            out[key].append(rec[key][0][token_mask(sample, key, pad)].float())
        if encoder_out:
            out[enc_key].append(enc["encoder_out"][0][token_mask(sample, enc_key, pad)].float())
    return out


class _Student:
    """Runs the student up to one sublayer. The fits go bottom up and a fit changes only its own layer, so the
    input of the layer a forward last reached is kept per stack and batch, and the next forward starts there
    (decoding.layer_inputs.starting_at: the layers that run compute what a full forward computes): each layer runs
    about once per sublayer fitted in it, not once per sublayer above it. The encoder output is computed once the
    decoder is reached (the encoder is final by then)."""

    def __init__(self, model, samples):
        self.model, self.samples = model, samples
        self._encoder_outs: Optional[List[dict]] = None
        self._streams: Dict[Tuple[bool, int], Tuple[int, torch.Tensor]] = {}  # (encoder?, batch): (layer, input)

    def encoder_outs(self) -> List[dict]:
        """The student's encoder outputs, computed once the decoder is reached (the encoder is final by then)."""
        if self._encoder_outs is None:
            self._encoder_outs = [
                self.model.encoder(s["net_input"]["src_tokens"], src_lengths=s["net_input"]["src_lengths"])
                for s in self.samples]
        return self._encoder_outs

    def forward_to(self, b: int, key: Key) -> None:
        """Batch b through the student until the sublayer `key` has run (or a hook stops it earlier), from the
        input of the layer the last forward of this stack reached (from the embeddings when that layer is above
        key's: a forward that goes back down)."""
        net_input = self.samples[b]["net_input"]
        encoder = key[0] in ENCODER_TYPES
        stack, where, layer = (self.model.encoder if encoder else self.model.decoder), (encoder, b), key[1] - 1
        start, hidden = self._streams.get(where, (0, None))
        if start > layer:
            start, hidden = 0, None
        with contextlib.ExitStack() as scope:
            if layer > start or hidden is None:  # key's layer: its input kept for the next forward
                scope.enter_context(_kept_input(stack.layers[layer], self._streams, where, layer))
            if hidden is not None:
                scope.enter_context(starting_at(stack, start, hidden))
            try:
                if encoder:
                    self.model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
                else:
                    self.model.decoder(net_input["prev_output_tokens"], encoder_out=self.encoder_outs()[b],
                                       features_only=True)
            except StopForward:
                pass

    def run_to(self, b: int, key: Key, context: bool):
        with capture(self.model, [key], context=context, stop_at=key) as rec:
            self.forward_to(b, key)
        return rec[key]

    def input_of(self, b: int, key: Key) -> torch.Tensor:
        """The input stream of the sublayer's projections (T x B x d), the forward stopped right there."""
        if key[0] == ENCODER_OUT:
            return self.encoder_outs()[b]["encoder_out"][0]
        with capture_inputs(self.model, [key], stop_at=key) as rec:
            self.forward_to(b, key)
        return rec[key][0]


@contextlib.contextmanager
def _kept_input(layer, streams: Dict, where: Tuple[str, int], index: int) -> Iterator[None]:
    """streams[where] = (index, the layer's input) once the layer is called."""
    handle = layer.register_forward_pre_hook(lambda _m, args: streams.__setitem__(where, (index, args[0])))
    try:
        yield
    finally:
        handle.remove()


def _kept_positions(attn) -> List[int]:
    return (attn.head_mask != 0).nonzero().flatten().tolist()


def ffn_width(model, key) -> int:
    layer = model.encoder.layers[key[1] - 1] if key[0] == "enc-ffn" else model.decoder.layers[key[1] - 1]
    return layer.fc1.out_features


@torch.no_grad()
def reconstruct(teacher, student, samples: Sequence[dict], pad: int, options: ReconstructionOptions,
                log=None, kept_layers=None, held: Optional[TeacherTargets] = None) -> List[SublayerFit]:
    """Reconstruct `student` (masked; weights changed in place) towards `teacher` on the calibration samples (the
    teacher's targets from `held` where it holds this teacher's on these samples).

    Sublayers with a removed head are fitted (all sublayers with refit_unpruned); returns one SublayerFit each.
    With `kept_layers` ({stack: the teacher's layers the student kept}, prune.layers), the student has fewer
    layers: each sublayer's target is its teacher sublayer's (layers.teacher_key), and every sublayer from the
    first one whose target moved (or lost heads) upwards is fitted."""
    if options.method not in METHODS:
        raise ValueError(f"unknown reconstruction method {options.method!r}")
    if options.method == "none":
        return []
    teacher.eval()
    student.eval()
    modules = attention_modules(student)
    keys = sublayer_keys(student, ffn=True)  # an FFN is fitted when wanted() says so
    todo, pruned, to_teacher = _selection(teacher, student, keys, modules, options, kept_layers)
    inputs, encoder_drift = drifted_inputs(keys, pruned) if options.refit_inputs else ([], False)
    if not todo and not inputs:
        return []
    teacher_keys = [to_teacher(k) for k in todo]
    raw = (held.of(teacher_keys) if held is not None and held.serves(teacher, samples)
           else teacher_targets(teacher, samples, teacher_keys, pad))
    targets = {k: raw[t] for k, t in zip(todo, teacher_keys)}
    teacher_in = teacher_inputs(teacher, samples, inputs, pad, encoder_out=encoder_drift) if inputs else {}
    runner = _Student(student, samples)
    fits: List[SublayerFit] = []
    _fit_in_order(runner, keys, todo, inputs, targets, teacher_in, encoder_drift, modules, pad, options,
                  _fit_logger(fits, log, options.window.steps))
    return fits


def _selection(teacher, student, keys: Sequence[Key], modules, options: ReconstructionOptions, kept_layers):
    """The sublayers to fit (in the order of keys), the test of a pruned sublayer, and each key's teacher key."""
    if kept_layers:
        teacher_depths = depths(teacher)

        def to_teacher(key):
            return teacher_key(key, kept_layers, teacher_depths)
    else:
        def to_teacher(key):
            return key

    def moved(key):
        return to_teacher(key) != key

    def pruned(key):  # heads masked, or FFN units removed (narrower than the teacher's FFN it stands for)
        if key[0] in FFN_TYPES:
            return ffn_width(student, key) < ffn_width(teacher, to_teacher(key))
        return bool((modules[key].head_mask == 0).any())

    first = next((i for i, k in enumerate(keys) if pruned(k) or moved(k)), len(keys))

    def wanted(i, key):
        if key[0] in FFN_TYPES:  # an FFN below every pruned sublayer sees exactly the teacher's inputs: nothing to fit
            return pruned(key) or (options.refit_ffn or kept_layers is not None) and (i > first or moved(key))
        return options.refit_unpruned or pruned(key) or (kept_layers is not None and i > first)

    return [k for i, k in enumerate(keys) if wanted(i, k)], pruned, to_teacher


def _fit_logger(fits: List[SublayerFit], log, window_steps: int):
    """record(fit): the fit kept, and its line logged (when there is a log)."""
    def record(fit):
        fits.append(fit)
        if log:
            note = f" (fallback: {fit.fallback})" if fit.fallback else ""
            energy = max(fit.target_energy, 1e-30)
            what = "input map" if fit.part == "input" else \
                f"{fit.kept} {'units' if fit.key[0] in FFN_TYPES else 'heads'} kept, {fit.method}"
            if fit.part == "window":
                what += f" (step {fit.steps} of {window_steps} kept)"
            log(f"{fit.key[0]}:{fit.key[1]} {what}: relative error "
                f"{fit.error_before / energy:.4f} -> {fit.error_after / energy:.4f}{note}")

    return record


def _fit_in_order(runner, keys: Sequence[Key], todo, inputs, targets, teacher_in, encoder_drift: bool, modules,
                  pad: int, options: ReconstructionOptions, record) -> None:
    """Each sublayer fitted bottom up (its input map first, where its input drifted), on the student's stream as
    the fits below it left it."""
    wanted_inputs = set(inputs)
    for key in keys:
        if encoder_drift and key[0] not in ENCODER_TYPES:  # the decoder's keys and values read the encoder output
            enc_key = (ENCODER_OUT, len(runner.model.encoder.layers))
            record(_fit_input(runner, enc_key, teacher_in.pop(enc_key), pad, options))
            encoder_drift = False
        if key in wanted_inputs:
            record(_fit_input(runner, key, teacher_in.pop(key), pad, options))
        if key in todo:
            target = targets.pop(key)
            if key[0] in FFN_TYPES:
                record(_fit_ffn(runner, key, target, pad, options))
            else:
                record(_fit_sublayer(runner, key, modules[key], target, pad, options))
            if options.window.steps > 0 and key[0] not in FFN_TYPES:

                record(fit_window(runner, key, target, pad, options.window))


def drifted_inputs(keys: Sequence[Key], pruned) -> Tuple[List[Key], bool]:
    """The sublayers (in forward order) whose input stream differs from the teacher's once the `pruned` ones lost
    heads, and whether the encoder output does: a stream drifts above its first pruned sublayer, and the decoder's
    also above its first encoder-decoder attention when the encoder output drifted."""
    encoder, decoder, out = False, False, []
    for key in keys:
        in_encoder = key[0] in ENCODER_TYPES
        if encoder if in_encoder else decoder:
            out.append(key)
        if pruned(key):
            encoder, decoder = encoder or in_encoder, decoder or not in_encoder
        if key[0] == "enc-dec" and encoder:
            decoder = True
    return out, encoder


def _fit_input(runner: _Student, key: Key, targets: List[torch.Tensor], pad: int,
               options: ReconstructionOptions) -> SublayerFit:
    """Ridge map (towards the identity) from the student's input stream to the teacher's, folded into the linear
    layers that read it."""
    d = targets[0].size(1)
    G = torch.zeros(d + 1, d + 1, dtype=torch.float64)
    C = torch.zeros(d + 1, d, dtype=torch.float64)
    UU, error_before, n = 0.0, 0.0, 0
    for bi in range(len(runner.samples)):
        X = runner.input_of(bi, key)[token_mask(runner.samples[bi], key, pad)].double()
        U = targets[bi].double()
        Xa = torch.cat([X, torch.ones(X.size(0), 1, dtype=X.dtype)], 1)
        G += Xa.t() @ Xa
        C += Xa.t() @ U
        UU += float(U.pow(2).sum())
        error_before += float((X - U).pow(2).sum())
        n += X.size(0)
    fit = SublayerFit(key, d, "none", error_before, error_before, UU, n, part="input")
    identity = torch.cat([torch.eye(d, dtype=torch.float64), torch.zeros(1, d, dtype=torch.float64)])
    ridge = torch.eye(d + 1, dtype=torch.float64) * options.ridge * float(G.diagonal()[:d].mean())
    ridge[d, d] = 0.0  # the shift c is not pulled towards 0
    system = G + ridge
    fit.condition = float(torch.linalg.cond(system))
    A = torch.linalg.solve(system, C + ridge @ identity) if fit.condition < options.max_condition else None
    error_after = float((A * (G @ A)).sum() - 2 * (A * C).sum() + UU) if A is not None else error_before
    if A is None:
        fit.fallback = f"input map: ill-conditioned (condition {fit.condition:.3g})"
    elif not torch.isfinite(A).all():
        fit.fallback = "input map: non-finite solution"
    elif float(A[:d].norm() / identity[:d].norm()) > options.max_scale:
        fit.fallback = f"input map: grew {float(A[:d].norm() / identity[:d].norm()):.3g}x"
    elif not error_after <= error_before + 1e-6 * max(UU, 1e-12):
        fit.fallback = "input map: the fit does not lower the error"
    else:
        M, c = A[:d], A[d]  # u ~ x @ M + c
        for linear in input_consumers(runner.model, key):
            W = linear.weight.detach().double()
            if linear.bias is not None:
                linear.bias.data.copy_((linear.bias.detach().double() + W @ c).to(linear.bias.dtype))
            linear.weight.data.copy_((W @ M.t()).to(linear.weight.dtype))
        fit.method, fit.error_after = "input-map", error_after
    return fit


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


def ridge_condition(system: torch.Tensor, lam: float, max_condition: float) -> float:
    """The condition number of a ridge system X'X + λI, or its bound 1 + trace(X'X)/λ when that bound already clears
    max_condition (X'X is positive semi-definite: its largest eigenvalue is at most its trace, its smallest at least
    0), which spares an SVD of the system: minutes on one core for an FFN of 8192 units, where the ridge of
    `--ridge 1e-3` bounds every system of up to 10^9 columns below the guard's 1e12."""
    trace = float(system.diagonal().sum()) - lam * system.size(0)
    bound = 1.0 + trace / lam if lam > 0 else math.inf
    return bound if bound < max_condition else float(torch.linalg.cond(system))


def _refit_out_proj(attn, cols, Wk, XtX, XtY, YY, error_before, options, fit) -> Tuple[bool, str]:
    dim = XtX.size(0)
    lam = options.ridge * float(XtX.diagonal().mean())
    system = XtX + lam * torch.eye(dim, dtype=XtX.dtype)
    cond = ridge_condition(system, lam, options.max_condition)
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
