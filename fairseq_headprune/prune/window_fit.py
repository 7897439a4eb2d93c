"""Local reconstruction of an attention sublayer with its nonlinear window: Adam steps on calibration data only.

The closed-form refits of `reconstruct` change one linear map (out_proj) and cannot undo what the removed heads
did inside the softmax. Wagner et al. (2025) find that refitting a window that contains the nonlinearity closes
much of the gap to retraining. Here the window is the whole attention sublayer: q/k/v projections, softmax and
out_proj, under its head mask. Its parameters are fitted by Adam towards the closed-form fit's drift-corrected
target, the teacher's residual stream after the sublayer, from the student's own inputs (already reconstructed
below), on the calibration tokens:

    min Σ_tokens || x_student + attention(inputs_student) - y_teacher ||²

The inputs are recorded once (one student forward per batch, stopped at the sublayer), so a step costs one attention
forward and backward on one batch (at most `step_tokens` tokens: a random share of the sentences of a larger
batch). Every tenth calibration batch is held out: the fit keeps the parameters of the
step with the lowest held-out error, checked every `check_every` steps, and leaves the sublayer as it was when no
step lowered it (or the step kept raised the error on all calibration batches). Removed heads stay removed: their
outputs are masked, so their weights get no gradient. The FFN window (fc1, activation, fc2) was tried too: from
fc2's ridge optimum no Adam step at lr 1e-5 or 3e-5 lowered the held-out error of any FFN of the De-En model, so
FFNs keep their closed-form refit.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, List, Sequence

import torch

from fairseq_headprune.core.heads import attention_modules
from fairseq_headprune.options import option
from fairseq_headprune.prune.sublayers import Key, StopForward, SublayerFit, capture, token_mask


@dataclass
class WindowOptions:
    steps: int = option(0, flag="--window-steps", metavar="N",
                        help="after each closed-form refit, fit each refit attention sublayer whole, softmax included "
                             "(q/k/v, out_proj), by N Adam steps of at most 1000 calibration tokens each (0: none)")
    lr: float = option(3e-4, flag="--window-lr", help="Adam's learning rate of --window-steps")
    check_every: int = 25  # held-out error checked this often; the best step is kept
    seed: int = 1  # order of the calibration batches and of the sentences a step takes from a larger batch
    step_tokens: int = 1000  # a step takes the sentences of one batch, a random share of them above this many tokens


@dataclass
class _Batch:
    residual: torch.Tensor  # (T, B, d) the student's residual stream before the sublayer
    target: torch.Tensor  # (T, B, d) the teacher's residual stream after it (zero at padding)
    call: tuple  # (args, kwargs) the window is called with
    mask: torch.Tensor  # (T, B) real tokens

    def rows(self, rows: torch.Tensor) -> "_Batch":
        """The same batch restricted to some of its sentences (attention never mixes sentences)."""
        args, kwargs = self.call
        kwargs = {k: (v[:, rows] if k in ("query", "key", "value") else v[rows] if k == "key_padding_mask" else v)
                  if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        args = tuple(a[:, rows] if isinstance(a, torch.Tensor) and i < 3 else a for i, a in enumerate(args))
        return _Batch(self.residual[:, rows], self.target[:, rows], (args, kwargs), self.mask[:, rows])


def window_modules(model, key: Key):
    """(the attention module, whose call is recorded, its projections' parameters, output of a recorded call)."""
    module = attention_modules(model)[key]
    params = [p for proj in (module.q_proj, module.k_proj, module.v_proj, module.out_proj) for p in proj.parameters()]
    return module, params, lambda args, kwargs: module(*args, **kwargs)[0]


@contextlib.contextmanager
def _record_call(module, calls: List[tuple]):
    """Record the window's call (its args and kwargs) and stop the forward there."""
    def pre(_m, args, kwargs):
        calls.append((args, dict(kwargs)))
        raise StopForward

    handle = module.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def _load(params, values) -> None:
    with torch.no_grad():
        for p, value in zip(params, values):
            p.copy_(value)


def _difference(b: _Batch, output: Callable) -> torch.Tensor:
    """(n, d) the student's residual stream after the window minus the teacher's, at the real tokens."""
    return (b.residual + output(*b.call) - b.target)[b.mask]


def _error(batches: Sequence[_Batch], output: Callable) -> float:
    with torch.no_grad():
        return sum(float(_difference(b, output).double().pow(2).sum()) for b in batches)


def _step_batch(b: _Batch, step_tokens: int, generator: torch.Generator) -> _Batch:
    """The batch, or (above step_tokens real tokens) a random share of its sentences: a step's cost and its
    learning rate's meaning do not depend on the calibration batches' --max-tokens."""
    tokens, sentences = int(b.mask.sum()), b.mask.size(1)
    if tokens <= step_tokens or sentences == 1:
        return b
    keep = max(1, sentences * step_tokens // tokens)
    return b.rows(torch.randperm(sentences, generator=generator)[:keep].sort().values)


@torch.no_grad()
def record_batches(runner, key: Key, module, targets: List[torch.Tensor], pad: int) -> List[_Batch]:
    """Per calibration batch: the student's residual stream before the sublayer, the teacher's after it, and the
    call the student makes to the attention (one student forward each, stopped there)."""
    batches = []
    for b in range(len(runner.samples)):
        calls: List[tuple] = []
        with capture(runner.model, [key]) as rec, _record_call(module, calls):
            runner.forward_to(b, key)
        m = token_mask(runner.samples[b], key, pad)
        residual = rec[key].residual[0]
        target = torch.zeros_like(residual)
        target[m] = targets[b].to(residual.dtype)
        batches.append(_Batch(residual, target, calls[0], m))
    return batches


def fit_window(runner, key: Key, targets: List[torch.Tensor], pad: int, options: WindowOptions) -> SublayerFit:
    """Fit the sublayer `key` of runner.model (in place) by Adam on its window; returns the fit's record."""
    model = runner.model
    module, params, output = window_modules(model, key)
    if not bool((module.head_mask != 0).any()):
        return SublayerFit(key, 0, "none", 0.0, 0.0, 0.0, 0, fallback="every head removed: nothing to fit",
                           part="window", steps=0)
    batches = record_batches(runner, key, module, targets, pad)
    # every tenth batch (batches are sorted by length: all lengths are held out), the last one of a short set
    held = set(range(min(5, len(batches) - 1), len(batches), 10)) if len(batches) > 1 else {0}
    held_out = [b for i, b in enumerate(batches) if i in held]
    train = [b for i, b in enumerate(batches) if i not in held] or held_out
    energy = sum(float((b.target - b.residual)[b.mask].double().pow(2).sum()) for b in batches)  # as closed-form
    tokens = sum(int(b.mask.sum()) for b in batches)
    kept = int((module.head_mask != 0).sum())
    before_all = _error(batches, output)
    best_error, best_state, best_step = _error(held_out, output), None, 0
    initial = [p.detach().clone() for p in params]
    flags = [p.requires_grad for p in params]
    generator = torch.Generator().manual_seed(options.seed)
    optimizer = torch.optim.Adam(params, lr=options.lr)
    try:
        for p in params:
            p.requires_grad_(True)
        order: List[int] = []
        with torch.enable_grad():
            for step in range(1, options.steps + 1):
                if not order:
                    order = torch.randperm(len(train), generator=generator).tolist()
                b = _step_batch(train[order.pop()], options.step_tokens, generator)
                optimizer.zero_grad(set_to_none=True)
                _difference(b, output).pow(2).sum(-1).mean().backward()
                optimizer.step()
                if step % options.check_every == 0 or step == options.steps:
                    error = _error(held_out, output)
                    if error < best_error:
                        best_error, best_state, best_step = error, [p.detach().clone() for p in params], step
    finally:
        _load(params, best_state or initial)
        for p, flag in zip(params, flags):
            p.requires_grad_(flag)
    after_all = _error(batches, output) if best_state is not None else before_all
    reason = None if best_state is not None else "no step lowered the held-out error"
    if after_all > before_all:  # lower on the held-out batches but higher on all of them: not a better fit
        _load(params, initial)
        after_all, best_step, reason = before_all, 0, "the step kept raised the error on all calibration batches"
    return SublayerFit(key, kept, "window" if reason is None else "none", before_all, after_all, energy, tokens,
                       fallback=reason, part="window", steps=best_step)

