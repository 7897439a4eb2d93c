"""Prune a loaded model to a budget without retraining and export it as a smaller stock checkpoint.

After Kwon et al. 2022 (A Fast Post-Training Pruning Framework for Transformers), for encoder-decoder translation:
calibration sentences -> per-sentence mask gradients -> Fisher budget fill (prune.select) -> in-layer
rearrangement -> layer-by-layer least-squares reconstruction (prune.reconstruct) -> physically pruned checkpoint,
checked against the in-memory reconstructed model before it is written. No weight gets a gradient step.

Functions take a loaded model (loading.Loaded) and a ShrinkOptions; nothing here parses arguments.
"""
from __future__ import annotations

import copy
import hashlib
import os
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from fairseq_headprune.core import flops as flop_model
from fairseq_headprune.prune import ffn, layers, select
from fairseq_headprune.errors import UserError
from fairseq_headprune.decoding.evaluate import decoder_start
from fairseq_headprune.core.heads import Head, HeadLayout, format_head_spec
from fairseq_headprune.core.masking import head_masks, set_head_masks
from fairseq_headprune.prune.reconstruct import TeacherTargets, reconstruct
from fairseq_headprune.prune.sublayers import SublayerFit
from fairseq_headprune.core.shape import ModelShape, depths, ffn_widths, kept_heads
from fairseq_headprune.core.surgery import prune_ffn, prune_model, remove_layers
from fairseq_headprune.fairseq_io.checkpoint_io import save_state, write_checkpoint_pair
from fairseq_headprune.fairseq_io.loading import load_subset
from fairseq_headprune.fairseq_io.pruned_checkpoint import pruned_checkpoint_state, weights_state
from fairseq_headprune.records.identity import file_sha256
from fairseq_headprune.prune.shrink_options import (Budget, ShrinkOptions, flat_fields, given_heads, head_budget_given,
                                                    heads_to_remove, parse_type_set, validate, without_layers)
from fairseq_headprune.prune.vocab_trim import companions, describe, note_in_state, trim_and_check
from fairseq_headprune.prune.vocabulary import VocabularyPlan

Key = Tuple[str, int]


# --------------------------------------------------------------------------------------------- calibration


@dataclass
class Calibration:
    samples: List[dict]
    subset: str
    sentences: int
    targets: str
    ids_sha256: str
    source_tokens: int
    target_tokens: int
    seconds: float = 0.0
    seed: Optional[int] = None  # drawn at random with this seed (None: the first sentences)

    def provenance(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "samples"}
        if out["seed"] is None:  # the records of the first sentences stay as they were
            del out["seed"]
        return out


def calibration_samples(loaded, subset: str, n: int, max_tokens: Optional[int] = None,
                        seed: Optional[int] = None) -> Tuple[List[dict], str]:
    """The first n sentences (by id) of a subset, or n drawn at random with `seed`, in batches of similar length;
    the ids' hash."""
    try:
        dataset = load_subset(loaded, subset)
    except UserError as e:
        raise UserError(f"calibration: {e}") from None
    ids = list(range(min(n, len(dataset)))) if seed is None else random_ids(len(dataset), n, seed)
    # (source, target) sizes through fairseq's own size(): the multilingual task's concatenated datasets have no
    # src_sizes array of their own
    sizes = {i: tuple(int(s or 0) for s in dataset.size(i)) for i in ids}
    ids.sort(key=lambda i: (*sizes[i], i))
    max_tokens = max_tokens or 4000
    batches, current, longest = [], [], 0
    for i in ids:
        size = max(sizes[i])
        if current and max(longest, size) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, size)
    if current:
        batches.append(current)
    samples = [dataset.collater([dataset[i] for i in b]) for b in batches]
    sha = hashlib.sha256(",".join(map(str, sorted(ids))).encode()).hexdigest()[:16]
    return samples, sha


def random_ids(size: int, n: int, seed: int) -> List[int]:
    """n sentence ids of a subset of `size`, drawn without replacement with `seed` (all of them when n >= size),
    in id order."""
    return sorted(random.Random(seed).sample(range(size), n)) if n < size else list(range(size))


@torch.no_grad()
def self_targets(loaded, samples: List[dict], beam: int) -> List[dict]:
    """The samples with the model's own translations as targets (teacher forcing on them), no references read."""
    from fairseq.data import data_utils

    gen_cfg = copy.deepcopy(loaded.cfg.generation)
    gen_cfg.beam = beam
    gen_cfg.nbest = 1
    generator = loaded.task.build_generator([loaded.model], gen_cfg)
    d = loaded.task.target_dictionary
    out = []
    for sample in samples:
        hyps = loaded.task.inference_step(generator, [loaded.model], sample)
        order = {sid: r for r, sid in enumerate(sample["id"].tolist())}
        tokens = [hyps[order[sid]][0]["tokens"].long() for sid in sample["id"].tolist()]
        target = data_utils.collate_tokens(tokens, d.pad(), d.eos(), left_pad=False)
        prev = data_utils.collate_tokens(tokens, d.pad(), decoder_start(sample, d.pad(), generator), left_pad=False,
                                         move_eos_to_beginning=True)
        net_input = {**sample["net_input"], "prev_output_tokens": prev}
        out.append({**sample, "net_input": net_input, "target": target, "ntokens": int(target.ne(d.pad()).sum())})
    return out


def calibrate(loaded, options: ShrinkOptions) -> Calibration:
    start = time.perf_counter()
    samples, sha = calibration_samples(loaded, options.calibration_subset, options.calibration_sentences,
                                       loaded.cfg.dataset.max_tokens, options.calibration_seed)
    if options.calibration_targets == "self":
        with head_masks(loaded.model, []):  # the unpruned model's translations; its masks restored after
            samples = self_targets(loaded, samples, options.calibration_beam)
    pad = loaded.task.target_dictionary.pad()
    n = sum(s["id"].numel() for s in samples)
    src = sum(int(s["net_input"]["src_tokens"].ne(pad).sum()) for s in samples)
    tgt = sum(int(s["target"].ne(pad).sum()) for s in samples)
    return Calibration(samples, options.calibration_subset, n, options.calibration_targets, sha, src, tgt,
                       time.perf_counter() - start, options.calibration_seed)


# --------------------------------------------------------------------------------------------- search


@dataclass
class Selection:
    removed: List[Head]
    order: str
    rearranged: bool
    budget: Budget
    rearrangement: Optional[dict] = None
    flops: Optional[dict] = None

    def summary(self) -> dict:
        return {"removed": len(self.removed), "removed_per_type": select.by_type(self.removed),
                "order": self.order, "rearranged": self.rearranged, "budget": asdict(self.budget),
                "removed_spec": format_head_spec(self.removed), "rearrangement": self.rearrangement,
                "flops": self.flops}


def calibration_lengths(calibration: Calibration, pad: int) -> Tuple[List[int], List[int]]:
    src, tgt = [], []
    for s in calibration.samples:
        src += s["net_input"]["src_tokens"].ne(pad).sum(1).tolist()
        tgt += s["target"].ne(pad).sum(1).tolist()
    return src, tgt


@dataclass
class FlopBudget:
    """A --flops budget in FLOPs of beam decoding the calibration sentences with their target lengths (flops.py)."""

    shape: ModelShape
    lengths: Tuple[List[int], List[int]]
    beam: int
    total: float  # the unpruned model's
    per_head: Dict[Key, float]  # what removing one head of each (type, layer) saves
    to_remove: float

    @classmethod
    def of(cls, model, budget: Budget, lengths: Tuple[List[int], List[int]], beam: int) -> "FlopBudget":
        shape = ModelShape.of(model)
        total = flop_model.decode_flops(shape, *lengths, beam)
        return cls(shape, lengths, beam, total, flop_model.flops_per_head(shape, *lengths, beam),
                   total * (1 - budget.value / 100))

    def record(self, removed: Sequence[Head]) -> dict:
        after = flop_model.decode_flops(self.shape.without(removed), *self.lengths, self.beam)
        return {"unpruned": self.total, "pruned": after, "share": after / self.total, "beam": self.beam,
                "lengths": "calibration sources and targets"}


def select_heads(model, grads: Dict[Key, torch.Tensor], budget: Budget, options: ShrinkOptions,
                 lengths: Optional[Tuple[List[int], List[int]]] = None, beam: int = 5,
                 already: Sequence[Head] = ()) -> Selection:
    """The heads to remove: global fill by Fisher (or Michel's I_h), then (Fisher only) in-layer rearrangement.
    Heads in `already` are removed in any case (they rank first and stay out of the rearrangement)."""
    layout = HeadLayout.of(model)
    ids = dict(layout.heads)
    types = parse_type_set(options.types)
    if options.shape == "per-stack":
        return _select_per_stack(model, grads, budget, options, lengths, beam)
    scores = select.fisher_scores(grads) if options.search == "fisher" else select.michel_scores(grads)
    for h in already:
        scores[(h.type, h.layer)] = scores[(h.type, h.layer)].clone()
        scores[(h.type, h.layer)][ids[(h.type, h.layer)].index(h.head)] = -float("inf")
    flop_info = None
    if budget.kind == "flops":
        flops = FlopBudget.of(model, budget, lengths, beam)
        try:
            if options.search in ("block", "full"):
                removed = select.fill_greedy(grads, ids, 0, types, block=options.search == "block",
                                                  head_cost=flops.per_head, flops_to_remove=flops.to_remove,
                                                  min_kept=options.min_heads)
            else:
                removed = select.fill_by_flops(scores, ids, flops.per_head, flops.to_remove, types,
                                                    options.min_heads)
        except ValueError:
            everything = flop_model.decode_flops(flops.shape.without(layout.all_heads(types)), *lengths, beam)
            raise UserError(f"--flops {budget.value:g}% cannot be reached by removing heads of "
                            f"{', '.join(types)}: without any of them decoding still costs "
                            f"{100 * everything / flops.total:.1f}% of the FLOPs") from None
        if len(removed) >= len(layout.all_heads()):
            raise UserError(f"--flops {budget.value:g}% would remove every head of the model")
        flop_info = flops.record(removed)
    elif options.search in ("block", "full"):
        removed = select.fill_greedy(grads, ids, heads_to_remove(budget, layout, types), types,
                                          block=options.search == "block", already=already,
                                          min_kept=options.min_heads)
    else:
        removed = select.fill_by_heads(scores, ids, heads_to_remove(budget, layout, types), types,
                                            options.min_heads)
    info = None
    if options.rearrange and options.search in ("fisher", "block") and not already:
        r = select.rearrange(removed, grads, ids)
        info = {"objective_before": sum(r.objective_before.values()),
                "objective_after": sum(r.objective_after.values()),
                "swapped_heads": sum(r.swapped.values()),
                "per_layer": {f"{k[0]}:{k[1]}": [r.objective_before[k], r.objective_after[k], r.swapped[k]]
                              for k in r.objective_before}}
        removed = r.removed
    return Selection(removed, options.search, bool(info), budget, info, flop_info)


def _select_per_stack(model, grads, budget: Budget, options: ShrinkOptions, lengths, beam: int) -> Selection:
    """One head count per encoder and one per decoder (self- and cross-attention), chosen by the Fisher estimate."""
    layout = HeadLayout.of(model)
    types = parse_type_set(options.types)
    flops = FlopBudget.of(model, budget, lengths, beam) if budget.kind == "flops" else None
    n = None if flops else heads_to_remove(budget, layout, types)
    head_cost, to_remove = (flops.per_head, flops.to_remove) if flops else (None, None)
    try:
        removed, kept = select.fill_per_stack(grads, dict(layout.heads), n, types, options.search == "block",
                                                   head_cost, to_remove, options.min_heads)
    except ValueError as e:
        raise UserError(f"--shape per-stack: {e}") from None
    flop_info = flops.record(removed) if flops else None
    return Selection(removed, f"{options.search}, per-stack shape {kept}", False, budget, None, flop_info)


# --------------------------------------------------------------------------------------------- reconstruction


@dataclass
class ShrinkResult:
    student: object  # the reconstructed model with its removed heads masked (in memory, not pruned)
    selection: Selection
    fits: List[SublayerFit]
    seconds: Dict[str, float] = field(default_factory=dict)
    layers: Optional[object] = None  # prune.layers.LayerSelection when whole layers were removed
    ffn_kept: Optional[Dict[str, Dict[str, int]]] = None  # --ffn-keep: {stack: {layer: units kept}}

    def fits_json(self) -> List[dict]:
        return [f.as_json() for f in self.fits]


def build_student(model, selection: Selection, calibration: Calibration, options: ShrinkOptions, pad: int,
                  grads: Optional[Dict[Key, torch.Tensor]] = None, log: Optional[Callable] = None,
                  teacher=None, kept_layers=None, held: Optional[TeacherTargets] = None) -> ShrinkResult:
    """A copy of `model` with the selected heads masked and reconstructed as options.reconstruction says (towards
    `model`, or `teacher`: the deeper model `model` was cut from, whose layers `kept_layers` kept; the teacher's
    targets from `held` where it holds them)."""
    start = time.perf_counter()
    student = copy.deepcopy(model)
    set_head_masks(student, selection.removed)
    teacher = model if teacher is None else teacher
    fit = options.reconstruction
    if options.teacher_mildness > 0 and (fit.method != "none" or fit.refit_ffn):
        teacher = copy.deepcopy(model)
        milder = _milder(selection, grads, int(round(options.teacher_mildness * len(selection.removed))))
        set_head_masks(teacher, milder)
    ffn_kept = narrow_ffn(student, calibration, options, pad, log) if options.ffn_keep < 100 else None
    fits = reconstruct(teacher, student, calibration.samples, pad, options.reconstruction, log=log,
                       kept_layers=kept_layers, held=held)
    return ShrinkResult(student, selection, fits, {"reconstruction": time.perf_counter() - start},
                        ffn_kept=ffn_kept)


def narrow_ffn(student, calibration: Calibration, options: ShrinkOptions, pad: int,
               log: Optional[Callable]) -> Dict[str, Dict[str, int]]:
    """--ffn-keep: every FFN of the student (its heads already masked, its layers already cut) keeps its
    highest-Fisher units, in place; returns {stack: {layer: units kept}}."""
    kept = ffn.fisher_kept(ffn.unit_gradients(student, calibration.samples, pad), options.ffn_keep)
    before = ffn_widths(student)
    prune_ffn(student, kept)
    if log:
        log(f"FFN units: every FFN keeps {options.ffn_keep:g}% of its units by mask Fisher ("
            + ", ".join(f"{s}:{i} {len(units)}/{before[(s, i)]}" for (s, i), units in kept.items()) + ")")
    out: Dict[str, Dict[str, int]] = {}
    for (s, i), units in kept.items():
        out.setdefault(s, {})[str(i)] = len(units)
    return out


def _milder(selection: Selection, grads, n: int) -> List[Head]:
    """The n least important of the removed heads (by Fisher score): a teacher that lost the least of them."""
    if not grads or n <= 0:
        return []
    scores = select.fisher_scores(grads)  # unpruned model: a head's position is its id - 1
    ranked = sorted(selection.removed, key=lambda h: float(scores[(h.type, h.layer)][h.head - 1]))
    return ranked[:n]


def search_with_reconstruction(model, grads, budget: Budget, options: ShrinkOptions, calibration: Calibration,
                               pad: int, log: Optional[Callable] = None) -> ShrinkResult:
    """Remove the budget in options.search_steps equal steps: after each step the student is reconstructed and its
    mask gradients recomputed, so the next heads are scored on the model they will be removed from."""
    layout = HeadLayout.of(model)
    n_total = heads_to_remove(budget, layout, parse_type_set(options.types))
    removed: List[Head] = []
    result = None
    step_grads = grads
    held = TeacherTargets(model, calibration.samples, pad)  # every step's student is fitted towards the same model
    for k in range(1, options.search_steps + 1):
        n_k = int(round(n_total * k / options.search_steps))
        selection = select_heads(model, step_grads, Budget("remove", float(n_k), False), options, already=removed)
        removed = selection.removed
        result = build_student(model, selection, calibration, options, pad, grads, held=held)
        if log:
            log(f"step {k}/{options.search_steps}: {len(removed)} heads removed and reconstructed")
        if k < options.search_steps:
            step_grads = select.sentence_gradients(result.student, calibration.samples, pad)
    result.selection = Selection(removed, f"{options.search} in {options.search_steps} steps with reconstruction",
                                 options.rearrange, budget)
    return result


def shrink(loaded, options: ShrinkOptions, log: Callable = print) -> Tuple[ShrinkResult, Calibration]:
    """Calibrate, search and reconstruct: the in-memory result (write_checkpoint() writes it). The loaded model is
    read unmasked, and left with the masks it held."""
    with head_masks(loaded.model, []):
        return shrunk(loaded, options, log)


def shrunk(loaded, options: ShrinkOptions, log: Callable) -> Tuple[ShrinkResult, Calibration]:
    """shrink() on the loaded model as it is (no head masked)."""
    budget = validate(options, loaded.model)
    calibration = calibrate(loaded, options)
    log(f"calibration: {calibration.sentences} sentences of '{calibration.subset}' "
        f"({calibration.target_tokens} target tokens, targets: {calibration.targets})")
    pad = loaded.task.target_dictionary.pad()
    if options.keep_layers is not None:
        return shrink_layers(loaded, options, calibration, pad, log), calibration
    if options.heads is None and not head_budget_given(options):  # --ffn-keep alone
        selection = Selection([], "none (FFN units only)", False, budget)
        result = build_student(loaded.model, selection, calibration, options, pad, log=log)
        result.seconds.update(calibration=calibration.seconds)
        return result, calibration
    if options.heads is not None:  # selected elsewhere: no mask gradients, no search
        selection = Selection(given_heads(options, loaded.model), "given (--heads)", False, budget)
        log(f"given: remove {len(selection.removed)} heads "
            f"({', '.join(f'{t} {n}' for t, n in select.by_type(selection.removed).items())})")
        result = build_student(loaded.model, selection, calibration, options, pad, log=log)
        result.seconds.update(calibration=calibration.seconds)
        return result, calibration
    start = time.perf_counter()
    grads = select.sentence_gradients(loaded.model, calibration.samples, pad)
    t_grads = time.perf_counter() - start
    start = time.perf_counter()
    if options.search_steps > 1:
        result = search_with_reconstruction(loaded.model, grads, budget, options, calibration, pad, log)
        result.seconds.update(calibration=calibration.seconds, gradients=t_grads,
                              search_and_reconstruction=time.perf_counter() - start)
        return result, calibration
    selection = select_heads(loaded.model, grads, budget, options, calibration_lengths(calibration, pad),
                             beam=loaded.cfg.generation.beam)
    t_search = time.perf_counter() - start
    per_type = select.by_type(selection.removed)
    emptied = select.emptied_layers(selection.removed, HeadLayout.of(loaded.model).heads)
    log(f"search ({selection.order}{', rearranged' if selection.rearranged else ''}): remove {len(selection.removed)} "
        f"heads ({', '.join(f'{t} {n}' for t, n in per_type.items())}); emptied layers: "
        f"{', '.join(f'{t}:{i}' for t, i in emptied) or 'none'}")
    result = build_student(loaded.model, selection, calibration, options, pad, grads, log)
    result.seconds.update(calibration=calibration.seconds, gradients=t_grads, search=t_search)
    return result, calibration


def shrink_layers(loaded, options: ShrinkOptions, calibration: Calibration, pad: int, log: Callable) -> ShrinkResult:
    """--keep-layers: choose the layers (greedy calibration loss or evenly spaced), cut them out, choose the heads
    of the kept layers (if a head budget is given) on the cut model, and reconstruct every sublayer from the first
    changed one towards the unpruned model's residual stream (each kept layer mapped to its teacher layer)."""
    counts = layers.parse_keep_layers(options.keep_layers)
    start = time.perf_counter()
    if options.layer_selection == "even":
        chosen = layers.select_even(loaded.model, counts)
    else:
        chosen = layers.select_by_loss(loaded.model, counts,
                                       layers.CutLoss(loaded.model, calibration.samples, pad), log)
    t_layers = time.perf_counter() - start
    log(f"layers kept ({chosen.rule}): " + "; ".join(f"{s} {list(v)}" for s, v in chosen.kept.items()))
    model = remove_layers(copy.deepcopy(loaded.model), chosen.kept)
    grads, t_grads, t_search = None, 0.0, 0.0
    if options.heads is not None:  # selected elsewhere (compress's choice), named in the cut model's numbering
        selection = Selection(given_heads(without_layers(options), model), "given (--heads)", False,
                              validate(without_layers(options), model))
        log(f"given: remove {len(selection.removed)} heads of the kept layers "
            f"({', '.join(f'{t} {n}' for t, n in select.by_type(selection.removed).items())})")
    elif head_budget_given(options):
        head_options = without_layers(options)
        budget = validate(head_options, model)
        start = time.perf_counter()
        grads = select.sentence_gradients(model, calibration.samples, pad)
        t_grads = time.perf_counter() - start
        start = time.perf_counter()
        selection = select_heads(model, grads, budget, head_options, calibration_lengths(calibration, pad),
                                 beam=loaded.cfg.generation.beam)
        t_search = time.perf_counter() - start
        log(f"search ({selection.order}): remove {len(selection.removed)} heads of the kept layers "
            f"({', '.join(f'{t} {n}' for t, n in select.by_type(selection.removed).items())})")
    else:
        selection = Selection([], "none (whole layers only)", False, Budget("remove", 0.0, False))
    result = build_student(model, selection, calibration, options, pad, grads, log, teacher=loaded.model,
                           kept_layers=chosen.kept)
    result.layers = chosen
    result.seconds.update(calibration=calibration.seconds, layer_selection=t_layers, gradients=t_grads,
                          search=t_search)
    return result


# --------------------------------------------------------------------------------------------- export


@torch.no_grad()
def hypotheses(task, generator, model, samples) -> Dict[int, List[int]]:
    out = {}
    for sample in samples:
        for sid, nbest in zip(sample["id"].tolist(), task.inference_step(generator, [model], sample)):
            out[sid] = nbest[0]["tokens"].tolist()
    return out


def check_pruned(loaded, student, pruned, samples: List[dict]) -> dict:
    """The physically pruned model against the in-memory reconstructed one: largest logit difference on the first
    batch and identical best hypotheses (the command's beam) on the given samples; raises UserError otherwise."""
    with torch.no_grad():
        a = student(**samples[0]["net_input"])[0]
        b = pruned(**samples[0]["net_input"])[0]
    diff = float((a - b).abs().max())
    if not torch.isfinite(b).all() or diff > 1e-3:
        raise UserError(f"the pruned model differs from the reconstructed one (max logit difference {diff:.2e})")
    task, gen = loaded.task, loaded.cfg.generation
    h_student = hypotheses(task, task.build_generator([student], gen), student, samples)
    h_pruned = hypotheses(task, task.build_generator([pruned], gen), pruned, samples)
    differing = [sid for sid in h_student if h_student[sid] != h_pruned[sid]]
    if differing:
        raise UserError(f"the pruned model translates {len(differing)} of {len(h_student)} calibration sentences "
                        f"differently from the reconstructed one (first: sentence {differing[0]}); nothing written")
    return {"max_logit_diff": diff, "sentences_checked": len(h_student), "identical_hypotheses": True}


def source_dtypes(checkpoint: str) -> Dict[str, torch.dtype]:
    """The dtype each weight has in the source checkpoint (the bundled models store fp16, loaded as fp32)."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    return {k: v.dtype for k, v in state["model"].items() if torch.is_tensor(v)}


@torch.no_grad()
def round_to_dtypes(model, dtypes: Dict[str, torch.dtype]) -> int:
    """Round each floating weight to the precision its source checkpoint stores it in (in place, the dtype stays):
    the refit weights become exactly what the saved file holds, so the check before saving checks that. Returns
    the number of tensors that changed."""
    changed = 0
    for name, tensor in model.state_dict().items():
        dt = dtypes.get(name)
        if dt is not None and dt.is_floating_point and tensor.is_floating_point() and dt != tensor.dtype:
            rounded = tensor.to(dt).to(tensor.dtype)
            if not torch.equal(rounded, tensor):
                tensor.copy_(rounded)
                changed += 1
    return changed


def in_dtypes(weights: Dict[str, torch.Tensor], dtypes: Dict[str, torch.dtype]) -> Dict[str, torch.Tensor]:
    """Each weight in its source dtype (exact after round_to_dtypes), so a pruned fp16 checkpoint is smaller than
    its source rather than twice its size; the file is written once, in these dtypes."""
    return {k: (v.to(dtypes[k]) if torch.is_tensor(v) and k in dtypes and v.is_floating_point()
                and dtypes[k].is_floating_point else v) for k, v in weights.items()}


def layers_of(model) -> Dict[str, int]:
    return depths(model)


def output_path_ok(source: str, out: str) -> None:
    if os.path.realpath(out) == os.path.realpath(source):
        raise UserError("--out must not overwrite the checkpoint being shrunk")


def check_samples(samples: List[dict], sentences: Optional[int]) -> List[dict]:
    """The first batches of `samples` holding at least `sentences` sentences (None: all of them)."""
    if not sentences:
        return samples
    out, n = [], 0
    for s in samples:
        if n >= sentences:
            break
        out.append(s)
        n += s["id"].numel()
    return out


def write_checkpoint(loaded, result: ShrinkResult, calibration: Calibration, options: ShrinkOptions, out: str,
           json_path: Optional[str] = None, log: Callable = print, plan: Optional[VocabularyPlan] = None) -> dict:
    """Physically prune the reconstructed model, check it, write the checkpoint (in its source's dtypes) and the JSON
    record as one pair (fairseq_headprune.fairseq_io.checkpoint_io: written once, atomically, under a lock on `out`);
    with a vocabulary `plan`, trimmed after the check, its dictionaries written with the pair."""
    output_path_ok(loaded.checkpoint, out)
    start = time.perf_counter()
    dtypes = source_dtypes(loaded.checkpoint)
    rounded = round_to_dtypes(result.student, dtypes)  # what the saved file will hold, before the check
    pruned = prune_model(copy.deepcopy(result.student), result.selection.removed)
    check, vocabulary = None, None
    samples = check_samples(calibration.samples, options.check_sentences)
    if options.check:
        check = check_pruned(loaded, result.student, pruned, samples)
        log(f"check: identical hypotheses on {check['sentences_checked']} calibration sentences, "
            f"max logit difference {check['max_logit_diff']:.1e}")
    if plan is not None:
        pruned, vocabulary = trim_and_check(loaded, pruned, plan, samples if options.check else None)
        log(describe(vocabulary))
    state = pruned_checkpoint_state(pruned, loaded.checkpoint)
    if plan is not None:
        note_in_state(state, plan)
    state["model"] = in_dtypes(state["model"], dtypes)
    result.seconds["export"] = time.perf_counter() - start
    params = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    layout = HeadLayout.of(loaded.model)
    flat = flat_fields(options)
    record = {
        "checkpoint": os.path.abspath(out),
        "source_checkpoint": os.path.abspath(loaded.checkpoint),
        "source_sha256": file_sha256(loaded.checkpoint),
        "heads_total": len(layout.all_heads()),
        "heads_kept": len(HeadLayout.of(pruned).all_heads()),
        "kept_heads": kept_heads(pruned),
        "layers": result.layers.as_json(layers_of(loaded.model)) if result.layers is not None else None,
        **({"ffn_kept": result.ffn_kept} if result.ffn_kept else {}),
        **({"vocabulary": vocabulary} if vocabulary else {}),
        "selection": result.selection.summary(),
        "reconstruction": {"options": {k: flat[k] for k in (
            "refit", "ridge", "max_scale", "refit_unpruned", "empty_bias", "refit_ffn", "refit_inputs",
            "teacher_mildness")},
            "sublayers": result.fits_json(),
            "fallbacks": [f"{f.key[0]}:{f.key[1]}: {f.fallback}" for f in result.fits if f.fallback]},
        "calibration": {**calibration.provenance(), "data": os.path.abspath(loaded.cfg.task.data)},
        "check": check,
        "stored_dtypes": sorted({str(dt) for dt in dtypes.values()}), "rounded_tensors": rounded,
        "params_before": params(loaded.model), "params_after": params(pruned),
        "seconds": result.seconds,
        "options": {k: (list(v) if isinstance(v, tuple) else v) for k, v in flat.items()},
    }
    write_checkpoint_pair(out, lambda path: save_state(state, path), record if json_path else None, json_path,
                          companions=companions(plan, out) if plan is not None else None)
    return record


def trim_only(loaded, options: ShrinkOptions, plan: VocabularyPlan, out: str, json_path: Optional[str] = None,
              log: Callable = print) -> dict:
    """--keep-vocab alone: the loaded model's vocabulary trimmed, checked on the first calibration sentences (or
    --check-sentences), written with its dictionaries; its architecture stays the source's, so stock fairseq
    loads it with those dictionaries."""
    output_path_ok(loaded.checkpoint, out)
    start = time.perf_counter()
    samples = None
    if options.check:
        samples, _ = calibration_samples(loaded, options.calibration_subset,
                                         options.check_sentences or options.calibration_sentences,
                                         loaded.cfg.dataset.max_tokens, options.calibration_seed)
    with head_masks(loaded.model, []):  # the loaded model unmasked; its masks restored after
        model, vocabulary = trim_and_check(loaded, loaded.model, plan, samples)
    log(describe(vocabulary))
    state = note_in_state(weights_state(model, loaded.checkpoint), plan)
    state["model"] = in_dtypes(state["model"], source_dtypes(loaded.checkpoint))
    record = {"checkpoint": os.path.abspath(out), "source_checkpoint": os.path.abspath(loaded.checkpoint),
              "source_sha256": file_sha256(loaded.checkpoint), "vocabulary": vocabulary,
              "params_before": vocabulary["memory"]["parameters_before"],
              "params_after": vocabulary["memory"]["parameters_after"],
              "seconds": {"trim": time.perf_counter() - start},
              "options": {k: (list(v) if isinstance(v, tuple) else v) for k, v in flat_fields(options).items()}}
    write_checkpoint_pair(out, lambda path: save_state(state, path), record if json_path else None, json_path,
                          companions=companions(plan, out))
    return record
