"""Which heads to remove under a budget, with no weight update (after Kwon et al. 2022, steps 1 and 2).

Everything starts from per-sentence mask gradients g_x,h = dL(x)/dξ_h at ξ = 1 (L(x) = summed token NLL of
sentence x, teacher forcing, eval mode): one forward+backward over the calibration sentences, each batch row with
its own ξ leaves (rows of a transformer batch do not interact, so row b's gradient is sentence b's).

- Fisher score of a head: F_h = Σ_x g_x,h², the diagonal of the empirical Fisher of the masks; Michel et al.'s
  I_h = mean_x |g_x,h| (l2-normalised per layer) from the same gradients, for the baseline order.
- Budget fill, global: remove the lowest-scoring heads of the allowed attention types until the number of heads
  (or the decoding FLOPs) to remove is reached; with a FLOP budget heads are taken by score per FLOP saved.
- Rearrangement, within each layer: the second-order estimate of the loss increase of removing a set P of a layer's
  heads with the layer's block of the Fisher, Σ_x (Σ_{h∈P} g_x,h)² = 1_P' F_layer 1_P, is lowered by swapping a
  removed and a kept head while a swap lowers it. Swaps keep every layer's count, so the budget holds exactly.

Pure functions on tensors and head lists; `sentence_gradients` is the one that runs a model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch

from fairseq_headprune.core.heads import ATTENTION_TYPES, Head, HeadLayout
from fairseq_headprune.core.masking import masked_modules, row_head_masks

Key = Tuple[str, int]


# --------------------------------------------------------------------------------------------- gradients


def sentence_nll(model, sample, pad: int) -> torch.Tensor:
    """Summed token NLL of the batch (no label smoothing): its gradient w.r.t. row b's ξ is sentence b's."""
    return output_nll(model, model(**sample["net_input"]), sample, pad)


def output_nll(model, net_output, sample, pad: int) -> torch.Tensor:
    """Summed token NLL of the batch's targets under the model's output for it (sentence_nll's last step)."""
    lprobs = model.get_normalized_probs(net_output, log_probs=True)
    target = sample["target"]
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return nll.masked_fill(target.eq(pad), 0.0).sum()


def sentence_gradients(model, samples: Iterable[dict], pad: int, progress=None) -> Dict[Key, torch.Tensor]:
    """{(type, layer): (sentences, heads) float64 tensor of dL(x)/dξ_h}, rows in the order of the samples' rows.

    The model is put in eval mode; weights get no gradient (only the ξ leaves require one)."""
    model.eval()
    masked_modules(model)  # raises unless masks are installed
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    chunks: Dict[Key, List[torch.Tensor]] = {}
    try:
        for sample in progress(samples) if progress else samples:
            with row_head_masks(model, sample["target"].size(0), requires_grad=True) as leaves:
                sentence_nll(model, sample, pad).backward()
                for key, leaf in leaves.items():
                    grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
                    chunks.setdefault(key, []).append(grad.detach().double().cpu())
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
    return {key: torch.cat(parts) for key, parts in chunks.items()}


# --------------------------------------------------------------------------------------------- scores


def fisher_scores(grads: Mapping[Key, torch.Tensor]) -> Dict[Key, torch.Tensor]:
    """F_h = Σ_x g_x,h² (the diagonal of the empirical Fisher of the head masks)."""
    return {key: g.pow(2).sum(0) for key, g in grads.items()}


def michel_scores(grads: Mapping[Key, torch.Tensor], eps: float = 1e-20) -> Dict[Key, torch.Tensor]:
    """Michel et al.'s I_h = mean_x |g_x,h|, l2-normalised per layer (their default)."""
    out = {}
    for key, g in grads.items():
        s = g.abs().mean(0)
        out[key] = s / (s.pow(2).sum().sqrt() + eps)
    return out


def layer_fisher(grads: torch.Tensor) -> torch.Tensor:
    """The layer's block of the empirical Fisher: Σ_x g_x g_x' (heads x heads)."""
    return grads.t() @ grads


# --------------------------------------------------------------------------------------------- budget


def ranked_heads(scores: Mapping[Key, torch.Tensor], head_ids: Mapping[Key, Sequence[int]],
                 types: Iterable[str] = ATTENTION_TYPES) -> List[Tuple[float, Head]]:
    """(score, head) of the allowed types, lowest score first; ties broken by spec order (deterministic)."""
    types = set(types)
    rows = [(float(s), Head(t, layer, head_ids[(t, layer)][i]))
            for (t, layer), values in scores.items() if t in types for i, s in enumerate(values.tolist())]
    return sorted(rows, key=lambda r: (r[0], ATTENTION_TYPES.index(r[1].type), r[1].layer, r[1].head))


def _removable(head_ids: Mapping[Key, Sequence[int]], keys: Iterable[Key], min_kept: int) -> int:
    """How many heads of these layers can go when each must keep at least min_kept."""
    return sum(max(len(head_ids[k]) - min_kept, 0) for k in keys)


def fill_by_heads(scores: Mapping[Key, torch.Tensor], head_ids: Mapping[Key, Sequence[int]], n_remove: int,
                  types: Iterable[str] = ATTENTION_TYPES, min_kept: int = 0) -> List[Head]:
    """The n_remove lowest-scoring heads of the allowed types (a global fill, as Kwon's search with equal costs),
    skipping a head whose layer would keep fewer than min_kept heads."""
    ranked = ranked_heads(scores, head_ids, types)
    if not 0 <= n_remove <= len(ranked):
        raise ValueError(f"cannot remove {n_remove} of {len(ranked)} heads")
    keys = {(h.type, h.layer) for _, h in ranked}
    if n_remove > _removable(head_ids, keys, min_kept):
        raise ValueError(f"cannot remove {n_remove} heads keeping at least {min_kept} in every layer "
                         f"(at most {_removable(head_ids, keys, min_kept)})")
    kept = {k: len(head_ids[k]) for k in keys}
    removed = []
    for _, h in ranked:
        if len(removed) == n_remove:
            break
        if kept[(h.type, h.layer)] > min_kept:
            removed.append(h)
            kept[(h.type, h.layer)] -= 1
    return sorted(removed)


def fill_by_flops(scores: Mapping[Key, torch.Tensor], head_ids: Mapping[Key, Sequence[int]],
                  head_cost: Mapping[Key, float], flops_to_remove: float,
                  types: Iterable[str] = ATTENTION_TYPES, min_kept: int = 0) -> List[Head]:
    """Remove heads by ascending score per FLOP saved until at least flops_to_remove are saved, never taking a
    layer below min_kept heads.

    head_cost[(type, layer)] is the decoding FLOPs one head of that layer costs; a layer's heads cost alike. Raises
    ValueError when even every allowed head does not save enough."""
    rows = [(s / max(head_cost[(h.type, h.layer)], 1e-30), h) for s, h in ranked_heads(scores, head_ids, types)]
    rows.sort(key=lambda r: (r[0], ATTENTION_TYPES.index(r[1].type), r[1].layer, r[1].head))
    removed, saved = [], 0.0
    kept = {k: len(head_ids[k]) for k in {(h.type, h.layer) for _, h in rows}}
    for _, h in rows:
        if saved >= flops_to_remove:
            break
        if kept[(h.type, h.layer)] <= min_kept:
            continue
        kept[(h.type, h.layer)] -= 1
        removed.append(h)
        saved += head_cost[(h.type, h.layer)]
    if saved < flops_to_remove:
        keeping = f" keeping at least {min_kept} in every layer" if min_kept else ""
        raise ValueError(f"the allowed heads cost {saved:.3g} FLOPs, less than the {flops_to_remove:.3g} to "
                         f"remove{keeping}")
    return sorted(removed)


def fill_greedy(grads: Mapping[Key, torch.Tensor], head_ids: Mapping[Key, Sequence[int]], n_remove: int,
                types: Iterable[str] = ATTENTION_TYPES, block: bool = True,
                already: Iterable[Head] = (), head_cost: Optional[Mapping[Key, float]] = None,
                flops_to_remove: Optional[float] = None, min_kept: int = 0) -> List[Head]:
    """Remove n_remove heads one at a time, each the head whose removal raises the Fisher estimate of the loss
    increase least given the heads already removed: Σ_x (Σ_{h∈P} g_x,h)² over each layer's heads (block: Kwon's
    block-diagonal Fisher, the objective the rearrangement lowers) or over all heads (full empirical Fisher).
    Unlike the diagonal fill, heads that fail together (correlated gradients) are not all removed. `already` are
    removed first (and count towards n_remove). With head_cost and flops_to_remove (n_remove is then ignored),
    each step takes the smallest increase per FLOP saved until at least flops_to_remove are saved; ValueError
    when every allowed head does not save enough. min_kept > 0 never takes a layer below that many heads (no
    emptied sublayer at 1)."""
    types = set(types)
    keys = [k for k in grads if k[0] in types]
    columns = [(k, i) for k in keys for i in range(len(head_ids[k]))]
    by_flops = flops_to_remove is not None
    if not by_flops and not 0 <= n_remove <= len(columns):
        raise ValueError(f"cannot remove {n_remove} of {len(columns)} heads")
    if not by_flops and n_remove > _removable(head_ids, keys, min_kept):
        raise ValueError(f"cannot remove {n_remove} heads keeping at least {min_kept} in every layer "
                         f"(at most {_removable(head_ids, keys, min_kept)})")
    G = torch.cat([grads[k] for k in keys], dim=1)  # (sentences, heads of the allowed types)
    F = G.t() @ G
    layer = torch.tensor([keys.index(k) for k, _ in columns])
    if block:
        F = F * (layer.unsqueeze(0) == layer.unsqueeze(1))
    size = torch.tensor([len(head_ids[k]) for k in keys])
    position = {Head(k[0], k[1], head_ids[k][i]): c for c, (k, i) in enumerate(columns)}
    v = torch.zeros(len(columns), dtype=F.dtype)
    for h in already:
        v[position[h]] = 1
    diag = F.diagonal()
    cost = torch.tensor([head_cost[k] if by_flops else 1.0 for k, _ in columns], dtype=F.dtype)
    saved = float((cost * v).sum())
    while (saved < flops_to_remove) if by_flops else (int(v.sum()) < n_remove):
        kept = size - torch.zeros(len(keys), dtype=F.dtype).index_add_(0, layer, v).long()
        full = v.bool() | (kept[layer] <= min_kept)
        if bool(full.all()):
            keeping = f" keeping at least {min_kept} in every layer" if min_kept else ""
            if by_flops:
                raise ValueError(f"the allowed heads save {saved:.3g} FLOPs, less than the {flops_to_remove:.3g} "
                                 f"to remove{keeping}")
            raise ValueError(f"cannot remove {n_remove} heads{keeping}")
        increase = (2 * (F @ v) + diag) / cost
        increase[full] = float("inf")
        c = int(torch.argmin(increase))
        v[c] = 1
        saved += float(cost[c])
    return sorted(Head(k[0], k[1], head_ids[k][i]) for c, (k, i) in enumerate(columns) if v[c])


STACKS = {"encoder": ("enc-self",), "decoder": ("dec-self", "enc-dec")}


def per_stack_shapes(head_ids: Mapping[Key, Sequence[int]], types: Iterable[str] = ATTENTION_TYPES,
                     min_kept: int = 1) -> List[Dict[str, int]]:
    """Every per-stack shape reachable by removing heads: {stack: heads kept in each of its layers}. CTranslate2 (and
    Marian) run one head count per stack, the decoder's self- and cross-attention sharing it. A stack whose types
    are not all allowed keeps its heads (so it must already be uniform); ValueError when a stack is split (some of
    its types allowed, not all) or an unpruned stack is uneven."""
    types = set(types)
    options: Dict[str, List[int]] = {}
    for stack, stack_types in STACKS.items():
        keys = [k for k in head_ids if k[0] in stack_types]
        if not keys:
            continue
        allowed = [t in types for t in stack_types]
        if any(allowed) and not all(allowed):
            raise ValueError(f"the per-stack shape prunes whole stacks: --types must name all of "
                             f"{', '.join(stack_types)} or none of them")
        smallest = min(len(head_ids[k]) for k in keys)
        if all(allowed):
            options[stack] = list(range(max(min_kept, 0) if smallest else 0, smallest + 1))
        elif len({len(head_ids[k]) for k in keys}) > 1:
            raise ValueError(f"the {stack} is not pruned (--types) but its layers keep different numbers of heads")
        else:
            options[stack] = [smallest]
    shapes = [{}]
    for stack, counts in options.items():
        shapes = [{**shape, stack: c} for shape in shapes for c in counts]
    return shapes


def stack_of(key: Key) -> str:
    return next(stack for stack, stack_types in STACKS.items() if key[0] in stack_types)


def removed_count(head_ids: Mapping[Key, Sequence[int]], shape: Mapping[str, int]) -> int:
    return sum(len(ids) - shape[stack_of(k)] for k, ids in head_ids.items())


def layer_removal_order(g: torch.Tensor) -> List[int]:
    """A layer's heads in the order the greedy fill on the layer's Fisher block removes them."""
    F = layer_fisher(g)
    v = torch.zeros(F.shape[0], dtype=F.dtype)
    order: List[int] = []
    for _ in range(F.shape[0]):
        increase = 2 * (F @ v) + F.diagonal()
        increase[v.bool()] = float("inf")
        c = int(torch.argmin(increase))
        v[c] = 1
        order.append(c)
    return order


def fill_per_stack(grads: Mapping[Key, torch.Tensor], head_ids: Mapping[Key, Sequence[int]],
                   n_remove: Optional[int], types: Iterable[str] = ATTENTION_TYPES, block: bool = False,
                   head_cost: Optional[Mapping[Key, float]] = None, flops_to_remove: Optional[float] = None,
                   min_kept: int = 1) -> Tuple[List[Head], Dict[str, int]]:
    """The heads to remove for a per-stack shape: every encoder layer keeps E heads, every decoder self- and
    cross-attention layer D. Within a layer, heads go in the greedy order of the layer's Fisher block; among the
    shapes that remove exactly n_remove heads (or, with head_cost, save at least flops_to_remove FLOPs), the one
    with the lowest Fisher estimate of the loss increase Σ_x (Σ_removed g_x,h)² (full, or summed per layer with
    block) wins. Returns the heads and the shape; ValueError when no shape meets the budget."""
    shapes = per_stack_shapes(head_ids, types, min_kept)
    orders = {k: layer_removal_order(g) for k, g in grads.items()}

    def removed_by(shape):
        return [(k, i) for k in grads for i in orders[k][:len(head_ids[k]) - shape[stack_of(k)]]]

    def objective(columns) -> float:
        if not columns:
            return 0.0
        if block:
            return sum(float((grads[k][:, [i for kk, i in columns if kk == k]].sum(1) ** 2).sum())
                       for k in {k for k, _ in columns})
        return float((torch.stack([grads[k][:, i] for k, i in columns], 1).sum(1) ** 2).sum())

    if flops_to_remove is not None:
        feasible = [s for s in shapes if sum(head_cost[k] for k, _ in removed_by(s)) >= flops_to_remove]
        budget = f"saves {flops_to_remove:.3g} FLOPs"
    else:
        feasible = [s for s in shapes if removed_count(head_ids, s) == n_remove]
        budget = f"removes exactly {n_remove} heads"
    if not feasible:
        counts = sorted({removed_count(head_ids, s) for s in shapes} - {0})
        raise ValueError(f"no per-stack shape {budget} (heads a per-stack shape can remove: "
                         f"{', '.join(map(str, counts))})")
    # the lowest estimate; ties (and a FLOP budget met several ways) keep more heads
    best = min(feasible, key=lambda s: (objective(removed_by(s)), removed_count(head_ids, s)))
    heads = sorted(Head(k[0], k[1], head_ids[k][i]) for k, i in removed_by(best))
    return heads, best


# --------------------------------------------------------------------------------------------- rearrangement


def loss_estimate(fisher_block: torch.Tensor, removed: torch.Tensor) -> float:
    """1_P' F 1_P for the boolean vector `removed` of one layer: Σ_x (Σ_{h∈P} g_x,h)²."""
    v = removed.to(fisher_block.dtype)
    return float(v @ fisher_block @ v)


def rearrange_layer(fisher_block: torch.Tensor, removed: torch.Tensor, max_swaps: int = 1000) -> torch.Tensor:
    """Best-improvement swaps of one removed and one kept head while the estimate strictly falls.

    Returns a new boolean vector with the same number of removed heads; the objective never increases."""
    removed = removed.clone().bool()
    n = removed.numel()
    if removed.all() or not removed.any():
        return removed
    current = loss_estimate(fisher_block, removed)
    for _ in range(max_swaps):
        best, best_pair = current, None
        for p in removed.nonzero().flatten().tolist():
            for k in (~removed).nonzero().flatten().tolist():
                trial = removed.clone()
                trial[p], trial[k] = False, True
                value = loss_estimate(fisher_block, trial)
                if value < best - 1e-12 * max(abs(current), 1.0):
                    best, best_pair = value, (p, k)
        if best_pair is None:
            break
        removed[best_pair[0]], removed[best_pair[1]] = False, True
        current = best
    assert int(removed.sum()) <= n
    return removed


@dataclass
class Rearrangement:
    removed: List[Head]
    objective_before: Dict[Key, float]
    objective_after: Dict[Key, float]
    swapped: Dict[Key, int]


def rearrange(removed: Iterable[Head], grads: Mapping[Key, torch.Tensor],
              head_ids: Mapping[Key, Sequence[int]]) -> Rearrangement:
    """Kwon's mask rearrangement in every layer that has both removed and kept heads (counts per layer kept)."""
    removed = set(removed)
    out: List[Head] = []
    before, after, swapped = {}, {}, {}
    for key, g in grads.items():
        ids = list(head_ids[key])
        vec = torch.tensor([Head(key[0], key[1], h) in removed for h in ids], dtype=torch.bool)
        block = layer_fisher(g)
        new = rearrange_layer(block, vec)
        if vec.any():
            before[key], after[key] = loss_estimate(block, vec), loss_estimate(block, new)
            swapped[key] = int((vec & ~new).sum())
        out += [Head(key[0], key[1], ids[i]) for i in new.nonzero().flatten().tolist()]
    return Rearrangement(sorted(out), before, after, swapped)


def by_type(heads: Iterable[Head]) -> Dict[str, int]:
    """Number of heads per attention type (every type present, zeros included)."""
    counts = {t: 0 for t in ATTENTION_TYPES}
    for h in heads:
        counts[h.type] += 1
    return counts


def emptied_layers(removed: Iterable[Head], head_ids: Mapping[Key, Sequence[int]]) -> List[Key]:
    """(type, layer) whose every head is removed."""
    grouped: Dict[Key, int] = {}
    for h in removed:
        grouped[(h.type, h.layer)] = grouped.get((h.type, h.layer), 0) + 1
    return sorted((k for k, n in grouped.items() if n == len(head_ids[k])),
                  key=lambda k: (ATTENTION_TYPES.index(k[0]), k[1]))


def head_ids_of(model) -> Dict[Key, Tuple[int, ...]]:
    return dict(HeadLayout.of(model).heads)


def keys_in_order(keys: Iterable[Key], decoder_first_self: bool = True) -> List[Key]:
    """Sublayers in forward order: encoder self-attention 1..L, then per decoder layer its self-attention and its
    encoder-decoder attention."""
    rank = {"enc-self": 0, "dec-self": 1, "enc-dec": 2}

    def order(k: Key):
        return (0, k[1], 0) if k[0] == "enc-self" else (1, k[1], rank[k[0]])

    return sorted(keys, key=order)


def optional_types(types: Optional[Iterable[str]]) -> Tuple[str, ...]:
    return tuple(types) if types else ATTENTION_TYPES
