"""What shrink is asked for: ShrinkOptions, the budget it parses to (heads, a share, a FLOP share, layers, FFN
widths), and every check of their combinations before any work.
"""
from __future__ import annotations

import copy
import re
from collections import Counter
from dataclasses import asdict, dataclass, replace
from typing import List, Optional, Sequence, Tuple


from fairseq_headprune.prune import layers, select
from fairseq_headprune.errors import UserError
from fairseq_headprune.core.heads import ATTENTION_TYPES, Head, HeadLayout, parse_head_spec
from fairseq_headprune.core.masking import head_gates
from fairseq_headprune.prune.reconstruct import METHODS, ReconstructionOptions
from fairseq_headprune.prune.window_fit import WindowOptions
from fairseq_headprune.options import given_flags, nested, option
from fairseq_headprune.prune.vocabulary import VocabularyOptions
from fairseq_headprune.core.surgery import remove_layers


TARGETS = ("references", "self")
SEARCHES = ("fisher", "importance", "block", "full")
SHAPES = ("free", "per-stack")


@dataclass
class ShrinkOptions:
    """What `fairseq-headprune shrink` does: each field declares its option, default and help once (options.py)."""

    remove: Optional[str] = option(None, flag="--remove", group="budget",
                                   help="heads to remove: a number (72) or a share of the allowed heads (50%)")
    keep: Optional[str] = option(None, flag="--keep", group="budget",
                                 help="heads to keep: a number or a share of the allowed heads")
    flops: Optional[str] = option(None, flag="--flops", group="budget",
                                  help="the pruned model's decoding FLOPs at most this share of the unpruned's (60%)")
    heads: Optional[str] = option(None, flag="--heads", metavar="SPEC", group="budget",
                                  help="no search: remove and reconstruct these heads (TYPE:LAYER:HEADS,... or "
                                       "@file.json, e.g. an L0 run's closed heads from `gates`)")
    types: Tuple[str, ...] = option(ATTENTION_TYPES, flag="--types", parse=lambda text: parse_type_set(text),
                                    shown=",".join(ATTENTION_TYPES), help="attention types that may lose heads")
    calibration_subset: str = option("valid", flag="--calibration-subset",
                                     help="the subset whose sentences the search and the fits read")
    calibration_sentences: int = option(1000, flag="--calibration-sentences", help="how many of them (the first)")
    calibration_seed: Optional[int] = option(None, flag="--calibration-seed",
                                             help="draw them at random over the subset with this seed instead of "
                                                  "taking the first (a concatenated corpus: every part)")
    calibration_targets: str = option("references", flag="--calibration-targets", choices=TARGETS,
                                      help="teacher-force the references, or the unpruned model's own translations "
                                           "(no references needed)")
    calibration_beam: int = option(1, flag="--calibration-beam", help="beam for --calibration-targets self")
    search: str = option("full", flag="--search", choices=SEARCHES,
                         help="head selection: a greedy fill on the full or block-diagonal empirical Fisher, Kwon's "
                              "diagonal Fisher score, or Michel's I_h")
    search_steps: int = option(1, flag="--search-steps",
                               help="remove the budget in N steps, reconstructing and re-scoring the heads between "
                                    "steps")
    rearrange: bool = option(True, flag="--no-rearrange", negate=True,
                             help="skip Kwon's in-layer mask rearrangement (after --search fisher or block)")
    shape: str = option("free", flag="--shape", choices=SHAPES,
                        help="free: any number of heads per layer; per-stack: every encoder layer keeps the same "
                             "number, every decoder self- and cross-attention layer another (the shape CTranslate2 "
                             "runs faster: one head count per stack)")
    min_heads: int = option(1, flag="--min-heads-per-layer", metavar="N",
                            help="every attention sublayer keeps at least N heads (1: none is emptied; 0: no limit)")
    teacher_mildness: float = option(0.0, flag="--teacher-mildness",
                                     help="reconstruct towards a teacher with this share of the removed heads masked "
                                          "(0: the unpruned model)")
    check: bool = option(True, flag="--no-check", negate=True,
                         help="skip decoding the calibration slice with both models")
    check_sentences: Optional[int] = option(None, flag="--check-sentences",
                                            help="calibration sentences decoded by the check (default all)")
    keep_layers: Optional[str] = option(None, flag="--keep-layers", metavar="dec:N[,enc:M]",
                                        help="keep N decoder (M encoder) layers whole, the others removed (alone, "
                                             "with a head budget counted in the kept layers, or with --heads naming "
                                             "them renumbered 1..N); every sublayer above "
                                             "the first removed one is reconstructed towards the unpruned model's "
                                             "residual stream")
    layer_selection: str = option("importance", flag="--layer-selection", choices=("importance", "even"),
                                  help="which layers --keep-layers keeps: greedy removal of the layer whose loss "
                                       "increase on the calibration data is smallest, or Shleifer & Rush's evenly "
                                       "spaced layers")
    ffn_keep: float = option(100.0, flag="--ffn-keep", metavar="P%", parse=lambda text: parse_ffn_keep(text),
                             shown="100%",
                             help="every FFN keeps this share of its hidden units, those of the highest mask "
                                  "Fisher on the calibration data (Kwon et al. 2022), chosen after the heads and "
                                  "layers and refit (fc2) towards the unpruned model's FFN output")
    reconstruction: ReconstructionOptions = nested(ReconstructionOptions, section="reconstruction")
    vocabulary: VocabularyOptions = nested(VocabularyOptions, section="vocabulary")


def parse_ffn_keep(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*%?\s*", str(text))
    if not m or not 0 < float(m.group(1)) <= 100:
        raise UserError(f"--ffn-keep is the share of every FFN's hidden units kept, above 0% and at most 100%, "
                        f"not {text!r}")
    return float(m.group(1))


def flat_fields(options: ShrinkOptions) -> dict:
    """The options as one flat dict under the names records and sweep logs have always used (refit, window_steps,
    ...): nested in code, flat in files, so that older results folders still compare equal."""
    fit = options.reconstruction
    out = {k: v for k, v in asdict(options).items() if k not in ("reconstruction", "vocabulary")}
    out.update({k: v for k, v in asdict(fit).items() if k not in ("method", "window", "max_condition")})
    out.update(refit=fit.method, window_steps=fit.window.steps, window_lr=fit.window.lr)
    if options.keep_layers is None:  # records of head-only shrinks (and their sweep logs) as they always were
        del out["keep_layers"], out["layer_selection"]
    if options.ffn_keep == 100:
        del out["ffn_keep"]
    if options.vocabulary.corpora:  # records of shrinks that keep the whole vocabulary as they always were
        out.update(keep_vocab=list(options.vocabulary.corpora), keep_vocab_floor=options.vocabulary.floor)
    return out


def with_fit(options: ShrinkOptions, **changes) -> ShrinkOptions:
    """A copy whose reconstruction options have these fields changed."""
    return replace(options, reconstruction=replace(options.reconstruction, **changes))


@dataclass(frozen=True)
class Budget:
    kind: str  # remove | keep | flops
    value: float
    percent: bool

    def describe(self) -> str:
        amount = f"{self.value:g}%" if self.percent else f"{int(self.value)}"
        return {"remove": f"remove {amount} of the heads", "keep": f"keep {amount} of the heads",
                "flops": f"at most {amount} of the decoding FLOPs"}[self.kind]


def _parse_amount(text: str, option: str) -> Tuple[float, bool]:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(%?)\s*", str(text))
    if not m:
        raise UserError(f"{option} must be a number of heads (72) or a percentage (50%), not {text!r}")
    return float(m.group(1)), bool(m.group(2))


def parse_budget(options: ShrinkOptions) -> Budget:
    given = [(k, v) for k, v in (("remove", options.remove), ("keep", options.keep), ("flops", options.flops))
             if v is not None]
    if len(given) != 1:
        raise UserError("give exactly one budget: --remove N|P%, --keep N|P% or --flops P% (or the heads: --heads)")
    kind, text = given[0]
    value, percent = _parse_amount(text, f"--{kind}")
    if kind == "flops":
        if not percent:
            raise UserError(f"--flops is a share of the unpruned model's decoding FLOPs, e.g. 60%, not {text!r}")
        if not 0 < value < 100:
            raise UserError(f"--flops must be above 0% and below 100%, not {text}")
    elif percent and not 0 < value <= 100:
        raise UserError(f"--{kind} must be above 0% and at most 100%, not {text}")
    elif not percent and (value != int(value) or (kind == "remove" and value < 1) or value < 0):
        raise UserError(f"--{kind} must be a whole number of heads{' above 0' if kind == 'remove' else ''}, "
                        f"not {text}")
    return Budget(kind, value, percent)


def parse_type_set(text) -> Tuple[str, ...]:
    """`--types` (text or a sequence) as the attention types it names, in the model's order (ATTENTION_TYPES), not
    the order given (studies.ranking.parse_type_list keeps that); an unknown type is one line."""
    items = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    bad = [t for t in items if t not in ATTENTION_TYPES]
    if bad or not items:
        raise UserError(f"unknown attention type {bad[0] if bad else repr(text)}: "
                        f"use {', '.join(ATTENTION_TYPES)} (comma-separated)")
    return tuple(t for t in ATTENTION_TYPES if t in items)


def heads_to_remove(budget: Budget, layout: HeadLayout, types: Sequence[str]) -> int:
    """Number of heads a head budget removes; a UserError when it does not fit the model."""
    allowed = len(layout.all_heads(types))
    total = len(layout.all_heads())
    if budget.kind == "flops":
        raise ValueError("a FLOP budget has no head count before search")
    n = budget.value / 100 * allowed if budget.percent else budget.value
    n = int(round(n))
    if budget.kind == "keep":
        if n > allowed:
            raise UserError(f"--keep {budget.value:g}: the selected types ({', '.join(types)}) have only {allowed} "
                            f"heads ({layout.describe()})")
        n = allowed - n
    if n > allowed:
        raise UserError(f"cannot remove {n} heads: the selected types ({', '.join(types)}) have {allowed} "
                        f"({layout.describe()})")
    if n < 1:
        raise UserError(f"the budget ({budget.describe()}) removes no head")
    if n >= total:
        raise UserError(f"cannot remove all {total} heads of the model")
    return n


def given_heads(options: ShrinkOptions, model) -> List[Head]:
    """--heads: a selection made elsewhere (L0 gates' closed heads, an I_h order), checked against the model; the
    options that would choose heads are refused beside it, never ignored."""
    choosers = (("--remove/--keep/--flops", any(v is not None for v in (options.remove, options.keep, options.flops))),
                ("--types", tuple(options.types) != ATTENTION_TYPES), ("--search", options.search != "full"),
                ("--search-steps", options.search_steps != 1), ("--no-rearrange", not options.rearrange),
                ("--shape", options.shape != "free"), ("--teacher-mildness", options.teacher_mildness != 0))
    chooser = next((flag for flag, given in choosers if given), None)
    if chooser:
        raise UserError(f"--heads gives the heads to remove; {chooser} would choose them: leave one of the two out")
    heads = parse_head_spec(options.heads)
    if not heads:
        raise UserError("--heads names no head")
    layout = HeadLayout.of(model)
    layout.check(heads)
    removed = Counter((h.type, h.layer) for h in heads)
    short = next((key for key, ids in layout.heads.items() if len(ids) - removed[key] < options.min_heads), None)
    if short:
        raise UserError(f"--heads leaves {short[0]}:{short[1]} fewer than {options.min_heads} head(s) (the "
                        f"--min-heads-per-layer guard; 0 lets a sublayer go empty)")
    return heads


def head_budget_given(options: ShrinkOptions) -> bool:
    return any(v is not None for v in (options.remove, options.keep, options.flops, options.heads))


def validate_layers(options: ShrinkOptions, model) -> Optional[Budget]:
    """--keep-layers: the counts, the options it works with, and the head budget (if any) checked on a model of
    the kept depth (any selection of layers gives an unpruned model the same head layout)."""
    counts = layers.parse_keep_layers(options.keep_layers)
    layers.check_counts(model, counts)
    if options.layer_selection not in layers.SELECTIONS:
        raise UserError(f"--layer-selection must be one of {', '.join(layers.SELECTIONS)}")
    for flag, given in (("--flops", options.flops is not None),
                        ("--search-steps", options.search_steps != 1),
                        ("--teacher-mildness", options.teacher_mildness != 0)):
        if given:
            raise UserError(f"--keep-layers works with --remove or --keep (heads counted in the kept layers) or "
                            f"--heads (naming the kept layers, renumbered 1..N), not {flag}")
    fit = options.reconstruction
    if fit.method == "none" and fit.window.steps:
        raise UserError("--window-steps fits the sublayers --refit fits: it needs --refit scales or out-proj")
    if not head_budget_given(options):
        if options.calibration_targets not in TARGETS or fit.method not in METHODS \
                or options.calibration_sentences < 1:
            raise UserError(f"--calibration-targets must be one of {', '.join(TARGETS)}, --refit one of "
                            f"{', '.join(METHODS)}, --calibration-sentences at least 1")
        return None
    shallow = remove_layers(copy.deepcopy(model), layers.select_even(model, counts).kept)
    return validate(without_layers(options), shallow)


def without_layers(options: ShrinkOptions) -> ShrinkOptions:
    return replace(options, keep_layers=None)


def _validate_settings(options: ShrinkOptions, budget: Budget) -> None:
    """The types, the search's and the reconstruction's settings, each in range; raises UserError."""
    parse_type_set(options.types)
    if options.calibration_targets not in TARGETS:
        raise UserError(f"--calibration-targets must be one of {', '.join(TARGETS)}")
    if options.search not in SEARCHES:
        raise UserError(f"--search must be one of {', '.join(SEARCHES)}")
    fit = options.reconstruction
    if fit.method not in METHODS:
        raise UserError(f"--refit must be one of {', '.join(METHODS)}")
    if options.calibration_sentences < 1:
        raise UserError("--calibration-sentences must be at least 1")
    if options.search_steps < 1:
        raise UserError("--search-steps must be at least 1")
    if options.search_steps > 1 and budget.kind == "flops":
        raise UserError("--search-steps works with head budgets (--remove, --keep), not --flops")
    if options.min_heads < 0:
        raise UserError(f"--min-heads-per-layer must be at least 0, not {options.min_heads}")
    if not 0 <= options.teacher_mildness < 1:
        raise UserError("--teacher-mildness must be in [0, 1)")
    if fit.ridge < 0 or fit.max_scale <= 0:
        raise UserError("--ridge must be >= 0 and --max-scale > 0")
    if fit.window.steps < 0 or fit.window.lr <= 0:
        raise UserError("--window-steps must be >= 0 and --window-lr > 0")
    if fit.window.steps and fit.method == "none":
        raise UserError("--window-steps fits the sublayers --refit fits: it needs --refit scales or out-proj")


def validate(options: ShrinkOptions, model) -> Budget:
    """Everything that can be checked before any expensive work; raises UserError."""
    if not 0 < options.ffn_keep <= 100:
        raise UserError(f"--ffn-keep must be above 0% and at most 100%, not {options.ffn_keep:g}%")
    if options.ffn_keep < 100 and options.search_steps != 1:
        raise UserError("--ffn-keep narrows the FFNs once, after the heads: it works with one search step, not "
                        "--search-steps")
    if options.keep_layers is not None:
        return validate_layers(options, model)
    given = options.heads is not None
    ffn_only = options.ffn_keep < 100 and not head_budget_given(options)
    if ffn_only:  # no head budget: the options that choose heads would do nothing
        chooser = next((flag for flag, on in (("--types", tuple(options.types) != ATTENTION_TYPES),
                                               ("--search", options.search != "full"),
                                               ("--shape", options.shape != "free"),
                                               ("--teacher-mildness", options.teacher_mildness != 0)) if on), None)
        if chooser:
            raise UserError(f"{chooser} chooses heads: give a head budget (--remove, --keep, --flops) with it")
        budget = Budget("remove", 0.0, False)
    else:
        budget = Budget("remove", float(len(given_heads(options, model))), False) if given \
            else parse_budget(options)
    if head_gates(model):
        raise UserError("the checkpoint has L0 head gates: fold them into a stock checkpoint first "
                        "(fairseq-headprune gates CKPT --results-dir DIR --fold-out stock.pt) and shrink that")
    _validate_settings(options, budget)
    layout = HeadLayout.of(model)
    if given or ffn_only:
        return budget
    if options.shape != "free":
        _validate_per_stack(options, budget, layout)
    if budget.kind != "flops":
        n = heads_to_remove(budget, layout, parse_type_set(options.types))
        removable = sum(max(len(ids) - options.min_heads, 0) for (t, _), ids in layout.heads.items()
                        if t in parse_type_set(options.types))
        if n > removable:
            raise UserError(f"cannot remove {n} heads keeping at least {options.min_heads} in every attention "
                            f"sublayer: at most {removable} can go ({layout.describe()})")
    return budget


# what --keep-vocab alone reads: the sentences its check decodes (and the options it is given by)
VOCABULARY_ONLY_FLAGS = ("--keep-vocab", "--keep-vocab-floor", "--calibration-subset", "--calibration-sentences",
                         "--calibration-seed", "--no-check", "--check-sentences")


def vocabulary_only(options: ShrinkOptions) -> bool:
    """--keep-vocab with no head budget, no --keep-layers and no --ffn-keep: the vocabulary alone is trimmed."""
    return bool(options.vocabulary.corpora) and not head_budget_given(options) and options.keep_layers is None \
        and options.ffn_keep == 100


def inert_options(options: ShrinkOptions) -> Optional[str]:
    """An option given in a combination where it does nothing (it would be recorded and ignored), said in one
    line; None when every option given acts."""
    if options.vocabulary.floor is not None and not options.vocabulary.corpora:
        return "--keep-vocab-floor is the floor of --keep-vocab: it needs --keep-vocab CORPUS"
    if vocabulary_only(options):
        inert = next((flag for flag in given_flags(ShrinkOptions, options) if flag not in VOCABULARY_ONLY_FLAGS),
                     None)
        if inert:
            return (f"{inert} acts on heads, layers or FFN units: --keep-vocab alone trims the vocabulary (give a "
                    "head budget, --keep-layers or --ffn-keep with it)")
    fit = options.reconstruction
    if fit.window.lr != WindowOptions.lr and not fit.window.steps:
        return "--window-lr sets the window fit's learning rate: it needs --window-steps N"
    if options.calibration_beam != 1 and options.calibration_targets != "self":
        return "--calibration-beam is the beam of --calibration-targets self: the references need none"
    if fit.window.steps and options.ffn_keep < 100 and options.keep_layers is None \
            and not head_budget_given(options) and not fit.refit_unpruned:
        return "--window-steps fits the attention sublayers that lost heads: --ffn-keep alone removes none"
    if options.layer_selection != "importance" and options.keep_layers is None:
        return "--layer-selection chooses the layers --keep-layers keeps: it needs --keep-layers"
    if not options.rearrange and options.search not in ("fisher", "block"):
        return (f"--no-rearrange skips the rearrangement after --search fisher or block; --search {options.search} "
                "has none")
    return None


def _validate_per_stack(options: ShrinkOptions, budget: Budget, layout: HeadLayout) -> None:
    """--shape per-stack: the options it works with, and a head budget one of its shapes meets exactly."""
    if options.shape not in SHAPES:
        raise UserError(f"--shape must be one of {', '.join(SHAPES)}, not {options.shape!r}")
    if options.search not in ("full", "block"):
        raise UserError(f"--shape per-stack chooses heads by the Fisher fill (--search full or block), not "
                        f"--search {options.search}")
    if options.search_steps > 1:
        raise UserError("--shape per-stack removes the budget in one step (--search-steps 1)")
    try:
        shapes = select.per_stack_shapes(layout.heads, parse_type_set(options.types), options.min_heads)
    except ValueError as e:
        raise UserError(f"--shape per-stack: {e}") from None
    if budget.kind != "flops":
        n = heads_to_remove(budget, layout, parse_type_set(options.types))
        reachable = sorted({select.removed_count(layout.heads, s) for s in shapes} - {0})
        if n not in reachable:
            raise UserError(f"--shape per-stack cannot remove exactly {n} heads ({budget.describe()}): with one "
                            f"head count per stack it removes one of {', '.join(map(str, reachable))}")
