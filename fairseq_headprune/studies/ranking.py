"""Orders of heads, least important first: strategies as plain functions, apart from the loops that use them
(pruning, dynamics, compare, shrink, the report's speed heads).

A ranking strategy maps heads to scores (higher = more important); `rank_by_scores` turns scores into an order.
Sources of scores: an importance file of `score` (`importance_scores`), a single-head ablation of `ablate`
(`oracle_scores`), a seeded permutation (`random_ranking`). Head lists are written in the `@file.json` form that
`--mask-heads` and `--heads` read (`heads_to_json`), in the package's one type order (heads.ATTENTION_TYPES).
"""
from __future__ import annotations

import random
from typing import Dict, List, Mapping, Optional, Sequence

from fairseq_headprune.errors import UserError
from fairseq_headprune.core.heads import ATTENTION_TYPES, Head
from fairseq_headprune.core.importance import from_nested_lists
from fairseq_headprune.records.log import read_json, read_log


def parse_type_list(text: str) -> List[str]:
    """`--types enc-dec,dec-self` as a list, in the order given (prune.shrink_options.parse_type_set: the set, in the
    model's order); an unknown type is one line."""
    types = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in types if t not in ATTENTION_TYPES]
    if bad or not types:
        name = bad[0] if bad else text
        raise UserError(f"--types: unknown attention type {name!r} (use {', '.join(ATTENTION_TYPES)})")
    return types


def steps(n_heads: int, step: float) -> List[int]:
    """Number of heads masked at each step: 0, step*N, 2*step*N, ... up to all of them."""
    if not 0 < step <= 1:
        raise UserError(f"--step must be in (0, 1], not {step}")
    count = int(round(1 / step))
    return sorted({min(n_heads, int(round(k * step * n_heads))) for k in range(count + 1)})


def rank_by_scores(scores: Mapping[Head, float], candidates: Sequence[Head]) -> List[Head]:
    """Least important first; ties broken by head order so rankings are reproducible."""
    missing = [h for h in candidates if h not in scores]
    if missing:
        raise UserError(f"no score for head {missing[0]}: the scores come from another model")
    position = {h: i for i, h in enumerate(candidates)}
    return sorted(candidates, key=lambda h: (scores[h], position[h]))


def random_ranking(candidates: Sequence[Head], seed: int) -> List[Head]:
    ranking = list(candidates)
    random.Random(seed).shuffle(ranking)
    return ranking


def importance_scores(path: str, checkpoint_sha256: Optional[str] = None) -> Dict[Head, float]:
    """I_h per head from importance.json of `score`; refused when it was computed on another checkpoint."""
    data = read_json(path)
    if data is None:
        raise UserError(f"cannot read importance file {path}: no such file")
    if not isinstance(data, dict) or not any(t in data for t in ATTENTION_TYPES):
        raise UserError(f"{path} is not an importance file of `fairseq-headprune score`")
    theirs = data.get("meta", {}).get("checkpoint_sha256")
    if checkpoint_sha256 and theirs and theirs != checkpoint_sha256:
        raise UserError(f"importance file {path} was computed on another checkpoint (sha256 {theirs[:12]}, this "
                        f"one {checkpoint_sha256[:12]})")
    ids = data.get("meta", {}).get("head_ids", {})
    scores = {}
    for (t, layer), values in from_nested_lists(data).items():
        held = ids.get(t, [])[layer - 1] if ids.get(t) else list(range(1, len(values) + 1))
        for h, v in zip(held, values.tolist()):
            scores[Head(t, layer, h)] = v
    return scores


def oracle_scores(path: str, checkpoint_sha256: Optional[str] = None) -> Dict[Head, float]:
    """Single-head ablation: a head whose removal lowers BLEU least (or raises it) is the least important."""
    header, lines = read_log(path)
    theirs = header.get("checkpoint_sha256")
    if checkpoint_sha256 and theirs and theirs != checkpoint_sha256:
        raise UserError(f"ablation file {path} was computed on another checkpoint (sha256 {theirs[:12]}, this one "
                        f"{checkpoint_sha256[:12]})")
    rows = [r for r in lines if r.get("key") != "baseline" and "delta" in r]
    if not rows:
        raise UserError(f"{path} has no single-head ablation rows")
    sign = -1.0 if header.get("metric") == "loss" else 1.0  # loss delta: + is worse
    return {Head(r["type"], r["layer"], r["head"]): -sign * r["delta"] for r in rows}


def heads_to_json(heads: Sequence[Head]) -> Dict[str, Dict[str, List[int]]]:
    """The `@file.json` form of a head list: {TYPE: {LAYER: [HEADS]}}, readable by --mask-heads and --heads."""
    out: Dict[str, Dict[str, List[int]]] = {}
    for h in sorted(heads, key=lambda h: (ATTENTION_TYPES.index(h.type), h.layer, h.head)):
        out.setdefault(h.type, {}).setdefault(str(h.layer), []).append(h.head)
    return out
