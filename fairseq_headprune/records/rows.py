"""Pure helpers over result rows that several readers share (studies, claims, report sections)."""
from __future__ import annotations

from typing import Dict, List, Sequence

from fairseq_headprune.core.heads import ATTENTION_TYPES


def best_per_layer(rows: Sequence[Dict], metric: str = "bleu") -> List[Dict]:
    """For each (type, layer), the keep-one row with the best score (highest BLEU or lowest NLL), in type order."""
    value = (lambda r: r["bleu"]) if metric == "bleu" else (lambda r: -r["nll"])
    best: Dict = {}
    for row in rows:
        if row.get("key") == "baseline" or "type" not in row:
            continue
        key = (row["type"], row["layer"])
        if key not in best or value(row) > value(best[key]):
            best[key] = row
    return [best[k] for k in sorted(best, key=lambda k: (ATTENTION_TYPES.index(k[0]), k[1]))]
