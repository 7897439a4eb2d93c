"""The shrink study over budgets: BLEU against heads removed for each step of the pipeline, and L0 runs.

Methods are written as a base order and steps joined by '+':
  michel                       Michel et al.'s I_h order (mean |g|, l2 per layer), masks only, no tuning
  fisher                       Kwon's Fisher order (Σ g²), masks only
  fisher+rearrange             + in-layer rearrangement
  fisher+rearrange+scales      + one least-squares scale per kept head (Kwon's mask tuning)
  fisher+rearrange+out-proj    + ridge refit of each pruned sublayer's out-projection instead
  block, full                  greedy fill on the block-diagonal or the full empirical Fisher (prune.select)
Extra steps for the measurements of NOTES.md: `mildP` (a teacher with P% of the removed heads masked), `all` (also
refit sublayers that lost no head), `nobias` (no bias refit of emptied sublayers), `ffn` (also refit every FFN's
fc2 towards the same targets), `in` (also map every drifted sublayer input back onto the teacher's, folded into
q/k/v and fc1), `ridgeX` (the ridge of the refits), `stepsN` (remove the budget in N steps, each
reconstructed and re-scored before the next: search with reconstruction in the loop), `minN` (every attention
sublayer keeps at least N heads: `min1` empties none).

The calibration (sentences, targets) and the gradients are computed once; every budget and method reuses them.
Rows go to a resumable JSONL (ResultsLog) as they are computed.
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from fairseq_headprune.prune import select
from fairseq_headprune.errors import UserError
from fairseq_headprune.core.heads import HeadLayout
from fairseq_headprune.core.masking import set_head_masks
from fairseq_headprune.prune.shrink import (Calibration, build_student, calibrate, search_with_reconstruction,
                                            select_heads)
from fairseq_headprune.prune.shrink_options import (Budget, ShrinkOptions, flat_fields, parse_type_set, validate,
                                                    with_fit)
from fairseq_headprune.decoding.evaluate import SubsetEvaluator
from fairseq_headprune.records.identity import canonical_fingerprint, run_identity
from fairseq_headprune.records.log import ResultsLog, atomic_output, read_log

# ShrinkOptions fields a sweep method name sets (method_options); the others are the sweep's fixed settings
METHOD_FIELDS = ("remove", "keep", "flops", "search", "rearrange", "refit", "teacher_mildness", "refit_unpruned",
                 "empty_bias", "refit_ffn", "refit_inputs", "search_steps", "ridge", "min_heads")
# Kwon's steps one at a time, then the shrink command's default pipeline (full-Fisher fill keeping a head in every
# sublayer, out_proj and fc2 refit)
DEFAULT_METHODS = ("michel", "fisher", "fisher+rearrange", "fisher+rearrange+scales", "fisher+rearrange+out-proj",
                   "full+out-proj+ffn+min1")
DEFAULT_PERCENTS = (10, 20, 30, 40, 50, 60, 70, 80)
SWEEP_LOG, SWEEP_TABLE, SWEEP_FIGURE = "shrink-sweep.jsonl", "shrink-sweep.md", "shrink-sweep.png"


@dataclass
class SweepOptions:
    shrink: ShrinkOptions = field(default_factory=ShrinkOptions)
    percents: Tuple[float, ...] = DEFAULT_PERCENTS
    methods: Tuple[str, ...] = DEFAULT_METHODS
    tag: str = ""  # names a calibration variant in the row keys (e.g. "self-targets")


@dataclass
class SweepStudyOptions:
    """The study over budgets as `report` runs it; field names are `fairseq-headprune shrink`'s options (the
    report renders its command line from them)."""

    subset: str = field(metadata={"flag": "--gen-subset"})
    sweep: str = field(metadata={"always": True})  # percentages of heads removed, e.g. "10,20,30"
    sweep_methods: str = ",".join(DEFAULT_METHODS)
    calibration_subset: str = "valid"
    calibration_sentences: int = 1000
    references: Optional[str] = None
    l0_compare: Optional[str] = None

    def sweep_options(self) -> SweepOptions:
        """The study's own options; refuses bad percentages and unknown methods (UserError)."""
        methods = tuple(m.strip() for m in self.sweep_methods.split(",") if m.strip())
        if not methods:
            raise UserError(f"no sweep method in {self.sweep_methods!r}")
        shrink = ShrinkOptions(calibration_subset=self.calibration_subset,
                               calibration_sentences=self.calibration_sentences)
        for method in methods:
            method_options(method, shrink)
        if self.calibration_sentences < 1:
            raise UserError(f"calibration sentences must be at least 1, not {self.calibration_sentences}")
        return SweepOptions(shrink=shrink, percents=parse_percents(self.sweep), methods=methods)


def parse_percents(text: str) -> Tuple[float, ...]:
    """'10,20,30' -> (10.0, 20.0, 30.0): shares of the allowed heads to remove, each in (0, 100)."""
    try:
        values = tuple(float(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise UserError(f"sweep percentages must be comma-separated numbers, e.g. 10,20,30: {text!r}") from None
    if not values or any(not 0 < v < 100 for v in values):
        raise UserError(f"sweep percentages must be above 0 and below 100: {text!r}")
    return values


def method_options(method: str, base: ShrinkOptions) -> ShrinkOptions:
    """The ShrinkOptions a method name stands for (see the module docstring)."""
    parts = method.split("+")
    order = {"michel": "importance", "fisher": "fisher", "block": "block", "full": "full"}.get(parts[0])
    if order is None:
        raise UserError(f"unknown sweep method {method!r}: it starts with michel, fisher, block or full")
    opts = replace(base, search=order, rearrange=False, teacher_mildness=0.0, search_steps=1, min_heads=0)
    opts = with_fit(opts, method="none", refit_unpruned=False, empty_bias=True, refit_ffn=False, refit_inputs=False)
    for step in parts[1:]:
        if step == "rearrange":
            opts = replace(opts, rearrange=True)
        elif step in ("scales", "out-proj"):
            opts = with_fit(opts, method=step)
        elif step.startswith("mild") and step[4:].isdigit():
            opts = replace(opts, teacher_mildness=int(step[4:]) / 100)
        elif step == "all":
            opts = with_fit(opts, refit_unpruned=True)
        elif step.startswith("steps") and step[5:].isdigit():
            opts = replace(opts, search_steps=int(step[5:]))
        elif step == "ffn":
            opts = with_fit(opts, refit_ffn=True)
        elif step == "in":
            opts = with_fit(opts, refit_inputs=True)
        elif step.startswith("ridge"):
            opts = with_fit(opts, ridge=float(step[5:]))
        elif step.startswith("min") and step[3:].isdigit():
            opts = replace(opts, min_heads=int(step[3:]))
        elif step == "nobias":
            opts = with_fit(opts, empty_bias=False)
        else:
            raise UserError(f"unknown step {step!r} in sweep method {method!r}")
    return opts


@contextlib.contextmanager
def weights_of(model, other) -> Iterator[None]:
    """`model` computes with `other`'s weights for the duration (same architecture); its own are put back."""
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.load_state_dict(other.state_dict())
    try:
        yield
    finally:
        model.load_state_dict(saved)


def run_sweep(loaded, evaluator, options: SweepOptions, log, say: Callable = print,
              calibration: Optional[Calibration] = None) -> List[dict]:
    """Every method at every budget (heads removed, share of the allowed types), BLEU on the evaluator's subset."""
    model = loaded.model
    pad = loaded.task.target_dictionary.pad()
    types = parse_type_set(options.shrink.types)
    layout = HeadLayout.of(model)
    n_allowed = len(layout.all_heads(types))
    set_head_masks(model, [])
    done = log.done()
    if "unpruned" not in done:
        hyps = evaluator.translate()
        log.append({"key": "unpruned", "method": "unpruned", "removed": 0, "bleu": evaluator.bleu(hyps).score})
        say(f"unpruned: BLEU {log.rows[-1]['bleu']:.2f}")
    base_bleu = next(r["bleu"] for r in log.rows if r["key"] == "unpruned")
    methods = [(m, method_options(m, options.shrink)) for m in options.methods]
    todo = [(p, m, o) for p in options.percents for m, o in methods if _key(options.tag, m, p, n_allowed) not in done]
    if not todo:
        return log.rows
    if calibration is None:
        calibration = calibrate(loaded, options.shrink)
    start = time.perf_counter()
    grads = select.sentence_gradients(model, calibration.samples, pad)
    say(f"gradients of {calibration.sentences} calibration sentences: {time.perf_counter() - start:.0f}s")
    for percent, method, opts in todo:
        budget = Budget("remove", float(percent), True)
        selection = select_heads(model, grads, budget, opts)
        t0 = time.perf_counter()
        if opts.reconstruction.method == "none" and not opts.reconstruction.refit_ffn:
            fits, hyps = [], _translate_masked(model, evaluator, selection.removed)
        else:
            selection, fits, hyps = _translate_reconstructed(model, evaluator, grads, budget, selection, opts,
                                                             calibration, pad)
        bleu = evaluator.bleu(hyps).score
        row = {"key": _key(options.tag, method, percent, n_allowed), "method": method, "tag": options.tag,
               "percent": percent, "removed": len(selection.removed), "heads_total": len(layout.all_heads()),
               "removed_per_type": select.by_type(selection.removed), "bleu": bleu, "delta": bleu - base_bleu,
               "emptied": [f"{t}:{i}" for t, i in select.emptied_layers(selection.removed, layout.heads)],
               "rearrangement": selection.rearrangement and {k: v for k, v in selection.rearrangement.items()
                                                              if k != "per_layer"},
               "fallbacks": [f"{f.key[0]}:{f.key[1]}: {f.fallback}" for f in fits if f.fallback],
               "relative_error": _relative_errors(fits), "seconds": round(time.perf_counter() - t0, 1),
               "removed_spec": selection.summary()["removed_spec"], "calibration": calibration.provenance()}
        log.append(row)
        say(f"{percent:g}% {method}{' [' + options.tag + ']' if options.tag else ''}: {len(selection.removed)} "
            f"removed, BLEU {bleu:.2f} ({bleu - base_bleu:+.2f})")
    return log.rows


def _translate_masked(model, evaluator, removed) -> List[str]:
    """The evaluator's translations with the heads of `removed` masked; the model is left unmasked."""
    set_head_masks(model, removed)
    try:
        return evaluator.translate()
    finally:
        set_head_masks(model, [])


def _translate_reconstructed(model, evaluator, grads, budget: Budget, selection, opts: ShrinkOptions,
                             calibration: Calibration, pad: int) -> Tuple[object, list, List[str]]:
    """(selection, fits, translations) of the reconstructed student: built from `selection`, or searched with
    reconstruction in the loop when opts.search_steps > 1 (its own selection then); the model keeps its weights."""
    if opts.search_steps > 1:
        result = search_with_reconstruction(model, grads, budget, opts, calibration, pad)
        selection = result.selection
    else:
        result = build_student(model, selection, calibration, opts, pad, grads)
    with weights_of(model, result.student):
        hyps = _translate_masked(model, evaluator, selection.removed)
    return selection, result.fits, hyps


def _key(tag: str, method: str, percent: float, n_allowed: int) -> str:
    return f"{tag + '/' if tag else ''}{method}:{int(round(percent / 100 * n_allowed))}"


def _relative_errors(fits) -> Optional[Dict[str, float]]:
    if not fits:
        return None
    fits = [f for f in fits if f.part == "output"]  # the input maps' errors are of another quantity
    before = sum(f.error_before for f in fits)
    after = sum(f.error_after for f in fits)
    energy = sum(f.target_energy for f in fits)
    return {"before": before / max(energy, 1e-30), "after": after / max(energy, 1e-30)}


# --------------------------------------------------------------------------------------------- table and figure


def l0_rows(path: Optional[str], sweep_header: Optional[dict] = None) -> List[dict]:
    """The L0 runs of `compare` (results/voita/compare.jsonl): heads kept and BLEU of each λ > 0. With the sweep's
    header, only when they were scored like the sweep (same checkpoint, data, subset and beam): else none."""
    if not path or not os.path.exists(path):
        return []

    header, rows = read_log(path)
    if sweep_header is not None and _scoring(header) != _scoring(sweep_header):
        return []
    return [r for r in rows if r.get("method") == "l0" and r.get("l0_lambda")]


def _scoring(header: dict) -> tuple:
    decoding = header.get("decoding") or {}
    beam = decoding.get("beam", (decoding.get("generation") or {}).get("beam"))

    return (header.get("checkpoint_sha256"), canonical_fingerprint(header.get("data_fingerprint")),
            header.get("subset"), beam)


def _name(row: dict) -> str:
    return (row.get("tag") and row["tag"] + "/" or "") + row["method"]


def split_methods(rows: Sequence[dict]) -> Tuple[List[str], List[str]]:
    """(methods measured at three budgets or more: the curves; the others: single-budget candidates)."""
    budgets: Dict[str, set] = {}
    for r in rows:
        if r["key"] != "unpruned":
            budgets.setdefault(_name(r), set()).add(r["removed"])
    curves = [m for m, b in budgets.items() if len(b) >= 3]
    return curves, [m for m in budgets if m not in curves]


Table = Tuple[List[str], List[List[str]]]  # (headers, rows of cells)


def tables(rows: Sequence[dict], l0: Sequence[dict] = (), heads_total: int = 144) -> Dict[str, Table]:
    """The sweep's tables as cells: `curves` (a row per budget, a column per method measured at three budgets or
    more: BLEU and change against the unpruned model), `candidates` (methods measured at fewer budgets, a row
    each) and `l0` (the L0 runs at their numbers of heads); empty ones left out."""
    base = next(r["bleu"] for r in rows if r["key"] == "unpruned")
    sweep = [r for r in rows if r["key"] != "unpruned"]
    methods, candidates = split_methods(rows)
    if not methods:
        methods, candidates = candidates, []
    cell = {(_name(r), r["removed"]): r for r in sweep}
    body = []
    for n in sorted({r["removed"] for r in sweep}):
        cells = [f"{cell[m, n]['bleu']:.2f} ({cell[m, n]['delta']:+.2f})" if (m, n) in cell else "-" for m in methods]
        if any(c != "-" for c in cells):
            body.append([f"{n} ({100 * n / heads_total:.0f}%)"] + cells)
    out: Dict[str, Table] = {"curves": (["heads removed"] + methods, body)}
    if candidates:
        out["candidates"] = (
            ["method", "heads removed", "BLEU", "change", "removed enc-self/enc-dec/dec-self", "emptied sublayers",
             "fallbacks"],
            [[_name(r), str(r["removed"]), f"{r['bleu']:.2f}", f"{r['delta']:+.2f}",
              "/".join(str(r["removed_per_type"][t]) for t in ("enc-self", "enc-dec", "dec-self")),
              ", ".join(r["emptied"]) or "-", str(len(r["fallbacks"]))]
             for r in sweep if _name(r) in candidates])
    if l0:
        out["l0"] = (["λ", "heads removed", "L0 BLEU", "change"],
                     [[str(r["l0_lambda"]), f"{heads_total - r['heads_kept']} "
                       f"({100 * (heads_total - r['heads_kept']) / heads_total:.0f}%)", f"{r['bleu']:.2f}",
                       f"{r['bleu'] - base:+.2f}"]
                      for r in sorted(l0, key=lambda r: r["heads_kept"], reverse=True)])
    return out


def _markdown(table: Table) -> List[str]:
    headers, body = table
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)] + ["| " + " | ".join(r) + " |"
                                                                             for r in body]


def table(rows: Sequence[dict], l0: Sequence[dict] = (), heads_total: int = 144) -> str:
    """Markdown of `tables`: the curves, then the candidates measured at one budget, then the L0 runs."""
    base = next(r["bleu"] for r in rows if r["key"] == "unpruned")
    parts = tables(rows, l0, heads_total)
    lines = [f"Unpruned: **{base:.2f}** BLEU, {heads_total} heads.", ""] + _markdown(parts["curves"])
    if "candidates" in parts:
        lines += ["", "Candidates measured at one budget (NOTES.md):", ""] + _markdown(parts["candidates"])
    if "l0" in parts:
        lines += ["", "L0 gates (Voita et al., fine-tuned 300 updates per λ; results/voita/compare.jsonl):", ""]
        lines += _markdown(parts["l0"])
    return "\n".join(lines)


def figure(rows: Sequence[dict], path: str, l0: Sequence[dict] = (), heads_total: int = 144,
           title: str = "") -> str:
    """BLEU against heads removed: a line per method, the unpruned model, the L0 runs as points; the right panel
    is the same, zoomed to within 6 BLEU of the unpruned model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = next(r["bleu"] for r in rows if r["key"] == "unpruned")
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    series: Dict[str, List[Tuple[int, float]]] = {}
    curves, _ = split_methods(rows)
    for r in rows:
        if r["key"] != "unpruned" and (_name(r) in curves or not curves):
            series.setdefault(_name(r), []).append((r["removed"], r["bleu"]))
    for ax in axes:
        for name, points in series.items():
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
        if l0:
            ax.scatter([heads_total - r["heads_kept"] for r in l0], [r["bleu"] for r in l0], marker="*", s=120,
                       color="black", label="L0 gates (fine-tuned)", zorder=5)
        ax.axhline(base, color="grey", linestyle="--", label=f"unpruned {base:.2f}")
        ax.axhline(base - 0.5, color="grey", linestyle=":", label="unpruned - 0.5")
        ax.set_xlabel(f"heads removed (of {heads_total})")
        ax.set_ylabel("BLEU")
        ax.grid(alpha=0.3)
    axes[1].set_ylim(base - 6, base + 2)
    axes[1].set_title("zoomed: within 6 BLEU of the unpruned model", fontsize=9)
    if title:
        axes[0].set_title(title)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run(loaded, options: SweepOptions, results_dir: str, subset: str, references: Optional[str] = None,
        l0_compare: Optional[str] = None, say: Callable = print) -> List[str]:
    """The study over budgets into DIR: shrink-sweep.jsonl (rows appended as they are measured, resumable),
    shrink-sweep.md and shrink-sweep.png; returns the files written. `command` and `report` both call this."""
    from dataclasses import replace as with_fields

    for method in options.methods:  # unknown methods and budgets a method cannot meet fail here, before decoding
        for percent in options.percents:
            validate(with_fields(method_options(method, options.shrink), remove=f"{percent:g}%"), loaded.model)
    evaluator = SubsetEvaluator(loaded, subset, references)
    # calibration and reconstruction settings may differ between rows (tagged variants): each row records its own
    identity = run_identity("shrink-sweep", loaded, evaluator, metric="bleu",
                            inputs={"types": list(parse_type_set(options.shrink.types))})
    log = ResultsLog(os.path.join(results_dir, SWEEP_LOG), identity)
    # the settings the methods do not set (calibration, ridge, guards) are fixed per tag: a rerun with others under
    # the same tag is refused instead of resuming its rows; another tag is another variant and joins the file
    fixed = {k: v for k, v in flat_fields(options.shrink).items() if k not in METHOD_FIELDS}
    log.confirm({f"inputs.settings[{options.tag or 'default'}]": fixed})
    rows = run_sweep(loaded, evaluator, options, log, say)
    l0 = l0_rows(l0_compare, log.header)
    total = rows[1]["heads_total"] if len(rows) > 1 else len(HeadLayout.of(loaded.model).all_heads())
    md = os.path.join(results_dir, SWEEP_TABLE)
    with atomic_output(md) as f:
        f.write(f"# Retraining-free pruning to a budget: BLEU on '{evaluator.subset}' against heads removed\n\n"
                f"{evaluator.bleu_signature()}, beam {loaded.cfg.generation.beam}; calibration: "
                f"{options.shrink.calibration_sentences} sentences of '{options.shrink.calibration_subset}'.\n\n"
                f"{table(rows, l0, total)}\n")
    png = figure(rows, os.path.join(results_dir, SWEEP_FIGURE), l0, total)
    return [log.path, md, png]
