"""How two ablation sweeps agree, head by head (`fairseq-headprune correlate A.jsonl B.jsonl`).

E.g. the loss preview against the BLEU sweep, or in-domain against out-of-domain sweeps (Michel et al.
Section 3.4, newstest2013 vs MTNT): Pearson and Spearman r with p-values (scipy) over the heads both files
hold, and a scatter plot like their Figure 2.
"""
from __future__ import annotations

import numbers
import os
from typing import Dict, List, Optional, Tuple

from fairseq_headprune.errors import UserError
from fairseq_headprune.plots import scatter_with_fit
from fairseq_headprune.records import layout as names
from fairseq_headprune.records.log import read_log, write_json_atomic
from fairseq_headprune.stats import correlations


def read_rows(path: str, field: str) -> Tuple[Dict, Dict[str, Dict]]:
    """(header, rows by key) of an ablation file: the rows holding a numeric `field`."""
    header, lines = read_log(path)
    rows = {r["key"]: r for r in lines if r.get("key") != "baseline" and field in r}
    if not rows:
        raise UserError(f"{path} has no rows with a '{field}' field")
    bad = next((r for r in rows.values() if not isinstance(r[field], numbers.Real) or isinstance(r[field], bool)),
               None)
    if bad is not None:
        raise UserError(f"--field {field}: {path} holds {bad[field]!r} there, not a number (use a numeric field "
                        "such as delta, bleu or nll)")
    return header, rows


def correlate(first: str, second: str, field: str, results_dir: str, name: Optional[str] = None) -> List[str]:
    """Write DIR/NAME.json (r, p, n, the inputs) and DIR/NAME.png; returns both paths."""
    head_a, a = read_rows(first, field)
    head_b, b = read_rows(second, field)
    if head_a.get("checkpoint_sha256") != head_b.get("checkpoint_sha256"):
        print("note: the two files come from different checkpoints")
    keys = sorted(a.keys() & b.keys())
    if len(keys) < 3:
        raise UserError(f"the files share {len(keys)} heads; need at least 3 to correlate")
    x, y = [a[k][field] for k in keys], [b[k][field] for k in keys]
    stats = correlations(x, y)
    label_a = f"{head_a.get('subset')} ({head_a.get('metric')})"
    label_b = f"{head_b.get('subset')} ({head_b.get('metric')})"
    name = name or names.correlation_name(*(os.path.splitext(os.path.basename(p))[0] for p in (first, second)))
    # the inputs' paths relative to the result's folder: results folders are committed and moved between machines
    result = {**stats, "field": field, "first": os.path.relpath(first, results_dir),
              "second": os.path.relpath(second, results_dir), "first_label": label_a, "second_label": label_b}
    out = os.path.join(results_dir, name + ".json")
    write_json_atomic(out, result)
    png = scatter_with_fit(x, y, f"{field}: {label_a}", f"{field}: {label_b}",
                           f"Pearson r={stats['pearson_r']:.2f} (p={stats['pearson_p']:.2g}), "
                           f"Spearman r={stats['spearman_r']:.2f}, n={stats['n']}",
                           os.path.join(results_dir, name + ".png"))
    print(f"{stats['n']} heads: Pearson r = {stats['pearson_r']:.3f} (p = {stats['pearson_p']:.3g}), "
          f"Spearman r = {stats['spearman_r']:.3f} (p = {stats['spearman_p']:.3g})")
    return [out, png]
