"""Tables and figures of ablation sweeps, laid out like Michel et al.'s Tables 1-3 and 5/6, and shard merging."""
from __future__ import annotations

import os
from typing import Dict, List, Optional

from fairseq_headprune.core.heads import HeadLayout
from fairseq_headprune.plots import head_heatmap
from fairseq_headprune.records.log import ResultsLog, read_log
from fairseq_headprune.records.rows import best_per_layer


def _value(row: Dict, metric: str) -> float:
    return row["bleu"] if metric == "bleu" else row["nll"]


def _cell(row: Dict, metric: str) -> str:
    text = f"{row['delta']:+.2f}" if metric == "bleu" else f"{row['delta']:+.3f}"
    return f"**{text}**" if row.get("significant") else text


def _baseline_line(baseline: Dict, metric: str, alpha: Optional[float]) -> str:
    if metric == "bleu":
        return (f"Baseline BLEU {baseline['bleu']:.2f}. Cells: BLEU change when the head is masked; **bold** = "
                f"significant (paired bootstrap, p < {alpha}).")
    return f"Baseline NLL {baseline['nll']:.4f} nats/token. Cells: NLL change when the head is masked (+ = worse)."


def write_tables(results_dir: str, name: str, rows: List[Dict], layout: HeadLayout, types, mode: str,
                 metric: str) -> List[str]:
    """The Markdown table (and, for single-head sweeps, one heatmap per attention type)."""
    baseline = next(r for r in rows if r["key"] == "baseline")
    results = [r for r in rows if r["key"] != "baseline"]
    alpha = None
    md = [f"# {name}", ""]
    outputs = []
    if mode == "single":
        alpha = _alpha(results_dir, name)
        md.append(_baseline_line(baseline, metric, alpha))
        for t in types:
            by_pos = {(r["layer"], r["head"]): r for r in results if r["type"] == t}
            if not by_pos:
                continue
            heads = sorted({h for _, h in by_pos})
            md += ["", f"## {t}", "", "| layer | " + " | ".join(str(h) for h in heads) + " |",
                   "|---" * (len(heads) + 1) + "|"]
            for layer in layout.layers(t):
                cells = [_cell(by_pos[(layer, h)], metric) if (layer, h) in by_pos else "" for h in heads]
                md.append(f"| {layer} | " + " | ".join(cells) + " |")
            png = os.path.join(results_dir, f"{name}-{t}.png")
            label = "BLEU change" if metric == "bleu" else "NLL change (nats/token)"
            head_heatmap({k: r["delta"] for k, r in by_pos.items()},
                         {k: bool(r.get("significant")) for k, r in by_pos.items()},
                         f"{t}: {label} when one head is masked", label, png)
            outputs.append(png)
    else:
        md.append(_baseline_line(baseline, metric, _alpha(results_dir, name)).replace(
            "the head is masked", "the layer keeps only its best head"))
        md += ["", "| type | layer | best head | " + ("BLEU | change |" if metric == "bleu" else "NLL | change |"),
               "|---|---|---|---|---|"]
        for row in best_per_layer(results, metric):
            md.append(f"| {row['type']} | {row['layer']} | {row['head']} | {_value(row, metric):.2f} | "
                      f"{_cell(row, metric)} |")
    path = os.path.join(results_dir, name + ".md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(md) + "\n")
    return [path] + outputs


def write_keep_one_transfer(results_dir: str, name: str, chosen: List[Dict], report_rows: List[Dict],
                            metric: str, report_metric: Optional[str] = None, selected_on: str = "the selection subset",
                            report_subset: str = "the report subset") -> List[str]:
    """Tables 5/6: each layer's chosen head, its change on the selection subset by `metric` (what chose it) and on
    the report subset by `report_metric` (default the same), each column formatted by its own metric."""
    report_metric = report_metric or metric
    report = {r["key"]: r for r in report_rows}
    baseline = report["baseline"]
    line = _baseline_line(baseline, report_metric, _alpha(results_dir, name))
    how = "highest BLEU" if metric == "bleu" else "lowest teacher-forced NLL"
    md = [f"# {name}", "", f"Each layer reduced to the head chosen for it by {how} on `{selected_on}` (every head "
          f"tried), one layer at a time, and scored on `{report_subset}`.",
          f"On `{report_subset}`: " + line.replace("the head is masked", "the layer keeps only that head"),
          "Both columns: change against the unmasked model on that subset"
          + ("; NLL in nats/token (+ = worse)." if "loss" in (metric, report_metric) else "."), "",
          f"| type | layer | head | {_label(metric)} on {selected_on} | {_label(report_metric)} on {report_subset} |",
          "|---|---|---|---|---|"]
    for row in chosen:
        md.append(f"| {row['type']} | {row['layer']} | {row['head']} | {_cell(row, metric)} | "
                  f"{_cell(report[row['key']], report_metric)} |")
    path = os.path.join(results_dir, name + ".md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(md) + "\n")
    return [path]


def _label(metric: str) -> str:
    return "BLEU change" if metric == "bleu" else "NLL change"


def _alpha(results_dir: str, name: str) -> Optional[float]:
    boot = read_log(os.path.join(results_dir, name + ".jsonl"))[0].get("bootstrap")
    return boot["significance"] if boot else None


def merge_shards(results_dir: str, name: str, shards: int, header: Dict, keys: List[str]) -> Optional[str]:
    """Gather the shards' rows into NAME.jsonl once every shard is complete; None while some are not."""
    rows: Dict[str, Dict] = {}
    for i in range(shards):
        path = os.path.join(results_dir, f"{name}.shard-{i}-of-{shards}.jsonl")
        if not os.path.exists(path):
            return None
        for row in ResultsLog(path, header).rows:
            rows.setdefault(row["key"], row)
    if not set(keys) <= rows.keys():
        return None
    merged = os.path.join(results_dir, name + ".jsonl")
    if os.path.exists(merged):
        os.unlink(merged)  # rebuilt from the shards, which are the record
    log = ResultsLog(merged, header)
    for key in ["baseline"] + keys:
        log.append(rows[key])
    return merged
