"""Which heads the L0 runs keep, across λ (Voita et al. 2019, Section 6: the heads retained per attention type and
per layer as the penalty grows, and the functions of the encoder heads that survive).

`fairseq-headprune survivors GATES.json... --analysis HEADS_ANALYSIS.json --results-dir DIR` reads files the
sweep already wrote (each run's gates.json from `gates`, one heads_analysis.json from `analyze`) and writes, in DIR:
  survivors.md   heads kept per type, per layer of each type, and the functions of the kept encoder
                 self-attention heads, one row per run, ordered by λ
  survivors.png  the same as three panels
A head's function is the one `analyze` found on the model the runs were fine-tuned from (positional, syntactic,
rare, or none of them): the functions are not measured again on the fine-tuned models.
"""
from __future__ import annotations

import os
from typing import Dict, List, Mapping, Optional, Sequence

from fairseq_headprune.errors import UserError
from fairseq_headprune.core.heads import ATTENTION_TYPES
from fairseq_headprune.records import layout as names
from fairseq_headprune.records.log import atomic_output, read_json
from fairseq_headprune.plots import survivors_figure

FUNCTIONS = ("positional", "syntactic", "rare", "none")  # a head with several labels counts under the first


def function_of(labels: Sequence[str]) -> str:
    """The one function a head counts under: the first of FUNCTIONS its labels name, else "none"."""
    for name in FUNCTIONS[:-1]:
        if any(label.startswith(name) for label in labels):
            return name
    return "none"


def measured_functions(analysis: Mapping) -> Sequence[str]:
    """FUNCTIONS without those the analysis could not measure (syntactic ones need a parse of the source): a head
    is never counted as "not syntactic" by an analysis that did not look."""
    skipped = "skipped" in analysis.get("meta", {}).get("syntactic", {})
    return tuple(f for f in FUNCTIONS if not (skipped and f == "syntactic"))


def encoder_functions(analysis: Mapping) -> Dict[tuple, str]:
    """(layer, head) -> function of every encoder self-attention head in an `analyze` result."""
    return {(entry["layer"], h["head"]): function_of(h.get("labels", []))
            for entry in analysis.get("enc-self", []) for h in entry["heads"]}


def survivor_row(gates: Mapping, functions: Optional[Mapping[tuple, str]] = None) -> dict:
    """One run's survivors from its gates.json: kept heads per type and per layer (a head is kept when its
    evaluation gate is above 0), and the functions of its kept encoder self-attention heads."""
    per_layer = {t: [sum(g > 0 for g in layer) for layer in gates["heads"][t]["gate"]]
                 for t in ATTENTION_TYPES if t in gates["heads"]}
    row = {"l0_lambda": gates["l0_lambda"], "updates": gates["updates"], "gated_types": gates["gated_types"],
           "kept": sum(map(sum, per_layer.values())), "total": gates["total"],
           "kept_per_type": {t: sum(v) for t, v in per_layer.items()}, "kept_per_layer": per_layer,
           "heads_per_type": {t: sum(len(layer) for layer in gates["heads"][t]["gate"]) for t in per_layer}}
    if functions is not None and "enc-self" in gates["heads"]:
        counts = {name: 0 for name in FUNCTIONS}
        all_counts = dict(counts)
        for layer, gate_row in enumerate(gates["heads"]["enc-self"]["gate"], start=1):
            for head, g in enumerate(gate_row, start=1):
                name = functions.get((layer, head), "none")
                all_counts[name] += 1
                counts[name] += g > 0
        row["functions_kept"], row["functions_all"] = counts, all_counts
    return row


def read_json_file(path: str, what: str) -> dict:
    """results.log.read_json, with a missing file an error (a survivors input is never optional)."""
    if not os.path.isfile(path):
        raise UserError(f"{what}: no such file: {path}")
    return read_json(path)


def read_gates(path: str) -> dict:
    gates = read_json_file(path, "gates")
    if not isinstance(gates, dict) or not {"l0_lambda", "heads", "total", "updates"} <= set(gates):
        raise UserError(f"{path} is not a gates.json written by `fairseq-headprune gates`")
    return gates


def rows_of(gate_files: Sequence[str], analysis: Optional[dict]) -> List[dict]:
    """Rows of every run, by λ; runs of different fine-tuning lengths or gated types are refused together."""
    functions = encoder_functions(analysis) if analysis is not None else None
    rows = sorted((survivor_row(read_gates(p), functions) | {"gates": p} for p in gate_files),
                  key=lambda r: r["l0_lambda"])
    kinds = {(r["updates"], tuple(r["gated_types"])) for r in rows}
    if len(kinds) > 1:
        raise UserError("the gates files come from runs of different lengths or gated types: "
                        + "; ".join(f"{u} updates, {','.join(t)}" for u, t in sorted(kinds)))
    return rows


def table(rows: Sequence[dict], functions: Sequence[str] = FUNCTIONS, note: str = "") -> str:
    """Markdown: heads kept per type and per layer, and the functions of the kept encoder heads, a row per run
    (the `functions` measured; `note` says why others are not shown)."""
    types = [t for t in ATTENTION_TYPES if t in rows[0]["kept_per_layer"]]
    out = ["| λ | kept | " + " | ".join(types) + " | "
           + " | ".join(f"{t} by layer" for t in types) + " |",
           "|---|---|" + "---|" * (2 * len(types))]
    for r in rows:
        out.append(f"| {r['l0_lambda']:g} | {r['kept']}/{r['total']} | "
                   + " | ".join(f"{r['kept_per_type'][t]}/{r['heads_per_type'][t]}" for t in types) + " | "
                   + " | ".join(" ".join(str(k) for k in r["kept_per_layer"][t]) for t in types) + " |")
    if "functions_kept" in rows[0]:
        all_counts = rows[0]["functions_all"]
        out += ["", "Functions of the encoder self-attention heads kept (function found by `analyze` on the model "
                "before fine-tuning; of all encoder heads: "
                + ", ".join(f"{all_counts[f]} {f}" for f in functions) + ")" + (f"; {note}" if note else "") + ":",
                "", "| λ | " + " | ".join(functions) + " |", "|---|" + "---|" * len(functions)]
        for r in rows:
            out.append(f"| {r['l0_lambda']:g} | "
                       + " | ".join(f"{r['functions_kept'][f]}/{all_counts[f]}" for f in functions) + " |")
    return "\n".join(out)


def figure(rows: Sequence[dict], path: str, functions: Sequence[str] = FUNCTIONS) -> str:
    return survivors_figure(rows, functions, path)


def run(gate_files: Sequence[str], analysis_file: Optional[str], results_dir: str) -> List[str]:
    """survivors.md and survivors.png in results_dir; returns the files written."""
    if not gate_files:
        raise UserError("give at least one gates.json")
    analysis = read_json_file(analysis_file, "--analysis") if analysis_file else None
    if analysis is not None and "enc-self" not in analysis:
        raise UserError(f"{analysis_file} is not a heads_analysis.json written by `fairseq-headprune analyze`")
    rows = rows_of(gate_files, analysis)
    functions = measured_functions(analysis) if analysis is not None else FUNCTIONS
    note = "" if functions == FUNCTIONS else "syntactic functions not measured (the analysis had no source parse)"
    md = os.path.join(results_dir, names.SURVIVORS_MD)
    source = (f"; functions from `{analysis_file}` (checkpoint sha256 "
              f"{analysis.get('meta', {}).get('checkpoint_sha256', '?')[:16]})" if analysis else "")
    with atomic_output(md) as f:
        f.write(f"# Heads kept by the L0 runs, by λ ({rows[0]['updates']} updates, gated: "
                f"{', '.join(rows[0]['gated_types'])})\n\nFrom {len(rows)} gates.json files{source}. "
                "Made by `fairseq-headprune survivors`.\n\n" + table(rows, functions, note) + "\n")
    return [md, figure(rows, os.path.join(results_dir, names.SURVIVORS_PNG), functions)]
