"""`fairseq-headprune correlate A.jsonl B.jsonl`: how two ablation sweeps agree, head by head.

E.g. the loss preview against the BLEU sweep, or in-domain against out-of-domain sweeps (Michel et al.
Section 3.4, newstest2013 vs MTNT): Pearson and Spearman r with p-values (scipy) over the heads both files
hold, and a scatter plot like their Figure 2.
"""
from __future__ import annotations

import json
import os

from fairseq_headprune.errors import UserError
from fairseq_headprune.plots import scatter_with_fit
from fairseq_headprune.stats import correlations
from fairseq_headprune.results.log import write_json_atomic

USES_FAIRSEQ_OPTIONS = False


def add_args(parser) -> None:
    parser.add_argument("first", help="a results file of ablate (JSONL)")
    parser.add_argument("second", help="another results file of ablate (JSONL)")
    parser.add_argument("--results-dir", required=True)
    parser.add_argument("--field", default="delta", help="row field to correlate (default: delta)")
    parser.add_argument("--name", default=None, help="output name (default: correlation-A-vs-B)")


def read_rows(path: str, field: str):
    try:
        with open(path, encoding="utf-8") as f:
            lines = [json.loads(line) for line in f if line.strip()]
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError:
        raise UserError(f"{path} is not a JSONL results file") from None
    if not lines or "header" not in lines[0]:
        raise UserError(f"{path} is not a results file of fairseq-headprune ablate (no header line)")
    rows = {r["key"]: r for r in lines[1:] if r.get("key") != "baseline" and field in r}
    if not rows:
        raise UserError(f"{path} has no rows with a '{field}' field")
    return lines[0]["header"], rows


def run(cfg, args) -> None:
    head_a, a = read_rows(args.first, args.field)
    head_b, b = read_rows(args.second, args.field)
    if head_a.get("checkpoint_sha256") != head_b.get("checkpoint_sha256"):
        print("note: the two files come from different checkpoints")
    keys = sorted(a.keys() & b.keys())
    if len(keys) < 3:
        raise UserError(f"the files share {len(keys)} heads; need at least 3 to correlate")
    x, y = [a[k][args.field] for k in keys], [b[k][args.field] for k in keys]
    stats = correlations(x, y)
    label_a = f"{head_a.get('subset')} ({head_a.get('metric')})"
    label_b = f"{head_b.get('subset')} ({head_b.get('metric')})"
    name = args.name or "correlation-" + "-vs-".join(
        os.path.splitext(os.path.basename(p))[0] for p in (args.first, args.second))
    # the inputs' paths relative to the result's folder: results folders are committed and moved between machines
    result = {**stats, "field": args.field, "first": os.path.relpath(args.first, args.results_dir),
              "second": os.path.relpath(args.second, args.results_dir), "first_label": label_a,
              "second_label": label_b}
    write_json_atomic(os.path.join(args.results_dir, name + ".json"), result)
    png = scatter_with_fit(x, y, f"{args.field}: {label_a}", f"{args.field}: {label_b}",
                           f"Pearson r={stats['pearson_r']:.2f} (p={stats['pearson_p']:.2g}), "
                           f"Spearman r={stats['spearman_r']:.2f}, n={stats['n']}",
                           os.path.join(args.results_dir, name + ".png"))
    print(f"{stats['n']} heads: Pearson r = {stats['pearson_r']:.3f} (p = {stats['pearson_p']:.3g}), "
          f"Spearman r = {stats['spearman_r']:.3f} (p = {stats['spearman_p']:.3g})")
    print(f"wrote {os.path.join(args.results_dir, name + '.json')}\nwrote {png}")
