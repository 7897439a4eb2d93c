"""Every file name of a results folder, in one place: the studies write them, the report and claims read them."""
from __future__ import annotations

from typing import Optional, Sequence

from fairseq_headprune.core.heads import ATTENTION_TYPES

IMPORTANCE = "importance.json"
PRUNING = "pruning.jsonl"
PRUNING_FIGURE = "pruning.png"
SPEED = "speed.json"
ANALYSIS = "heads_analysis.json"
ANALYSIS_PARTIAL = "heads_analysis.partial.jsonl"
COMPARE = "compare.jsonl"
DYNAMICS = "dynamics.jsonl"
GATES = "gates.json"
CLOSED_HEADS = "closed-heads.json"
KEPT_HEADS = "kept-heads.md"
SURVIVORS_MD = "survivors.md"
SURVIVORS_PNG = "survivors.png"
REPORT_STATE = "report-state.json"
CLAIMS = "claims.json"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
INPUTS = "inputs"


def ablation_name(mode: str, metric: str) -> str:
    """ablation-single, ablation-keep-one, ablation-single-loss, ... (add .jsonl, .md)."""
    return f"ablation-{mode}" + ("-loss" if metric == "loss" else "")


def keep_one_report_name(metric: str, report_subset: str, report_metric: Optional[str] = None) -> str:
    """The keep-one report file's name: the selection metric, the report subset and, when it differs, the report
    metric (ablation-keep-one-loss-report-test-bleu: chosen by NLL, scored by BLEU on test)."""
    report_metric = report_metric or metric
    return (ablation_name("keep-one", metric) + f"-report-{report_subset}"
            + (f"-{report_metric}" if report_metric != metric else ""))


def shard_name(name: str, shard: int, shards: int) -> str:
    return name + (f".shard-{shard}-of-{shards}" if shards > 1 else "")


def heads_file_name(order: str, types: Sequence[str], percent: float) -> str:
    """heads-ORDER-PCT.json for the whole model, heads-ORDER-TYPE+TYPE-PCT.json for some types: runs of several
    --types into one results folder (the report's per-type curves) must not overwrite the whole model's file."""
    scope = "" if set(types) == set(ATTENTION_TYPES) else "-" + "+".join(types)
    return f"heads-{order}{scope}-{percent:g}.json"


def speed_heads_name(percent: float) -> str:
    """The heads the report's speed part prunes: what the importance order masks at `percent`."""
    return f"speed-heads-importance-{percent:g}.json"


def speed_ct2_name(compute_type: str) -> str:
    """`speed --engine ct2`'s file, one per compute type (float32 and int8 measured into one folder side by side)."""
    return f"speed-ct2-{compute_type}.json"


def correlation_name(first: str, second: str) -> str:
    return f"correlation-{first}-vs-{second}"
