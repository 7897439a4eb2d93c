"""The speed/BLEU frontier of the models `compress` built, read from the runs' compress.json
alone: nothing is decoded or timed again. One row per run (its shape, recovery epochs, speed over the unpruned model
at equal work in the run's engine, FLOP ratio, and the BLEU difference to the unpruned model on every reported set
with its paired-bootstrap p); the controls (the unpruned model through the same recovery: every control*-bleu.json
of benchmarks/engine_bleu.py the folder holds). Speeds come from different runs and machine loads: read them
to about +-0.1. Shown by `report` and written by benchmarks/frontier.py; the figure is plots.compress_frontier.
"""
from __future__ import annotations

import glob
import json
import os
from typing import Dict, List, Optional, Tuple

from fairseq_headprune.errors import UserError
from fairseq_headprune.core.shape import shape_words
from fairseq_headprune.prune.recovery_config import DEFAULT_DISTILL

RECORD = "compress.json"
CONTROLS = "control*-bleu.json"
TEXT = ("From each run's compress.json; speeds from different runs and loads, each with the 95% interval of its own "
        "timing (batches resampled with their rounds; runs recorded before intervals: read them to about +-0.1); "
        "ΔBLEU against the unpruned model in the same engine, with its p, and ΔchrF with its p where the run recorded "
        "chrF.")
LEGEND = ("Squares: the decoder's depth cut; marker size: recovery epochs; open markers: the hidden-state term; "
          "orange: a recovery signal other than the KL on the references (--distill); gray "
          "dashes at 1.0x: the control (the unpruned model through the same recovery), where there is one; dashed "
          "line: -0.5.")


def row(name: str, record: Dict) -> Dict:
    """One run's row from its compress.json."""
    stages = record["stages"]
    report = stages["report"]
    sets = {report["subset"]: report, **{a["subset"]: a for a in report.get("also") or []}}
    return {"run": name, "shape": shape_words(stages["choice"]["chosen"]),
            "teacher_sha256": (stages.get("cost-table", {}).get("identity") or {}).get("model_sha256"),
            "epochs": stages["recover"].get("budget_epochs", 0), "given": bool(record["options"].get("shape")),
            "hidden": (stages["recover"].get("distill_hidden") or {}).get("weight"),
            "distill": stages["recover"].get("distill") or DEFAULT_DISTILL,  # (records before --distill: none)
            "other_signal": (stages["recover"].get("distill") or DEFAULT_DISTILL) != DEFAULT_DISTILL,
            "vocab_map": bool(record["options"].get("vocab_map")),
            "distillation_set": stages["recover"].get("distillation_set"),
            **speeds(stages["measure"]), "flops": stages["measure"]["flop_ratio"],
            "sets": {s: (r["bleu_delta"], r["p"]) for s, r in sets.items()},
            "chrf": {s: (r["chrf_delta"], r["chrf_p"]) for s, r in sets.items() if "chrf_p" in r},  # (since chrF)
            "significance": report.get("significance", "not recorded")}


def speeds(measure: Dict) -> Dict:
    """The speed at the run's decoding batches with its interval, and one sentence at a time: a run served at batch 1
    (--deploy-batch 1) was timed there first and at batch 64 beside it, so its columns are read the other way
    round."""
    if (measure.get("deployment") or {}).get("batch") == 1:
        other = measure["batch64"]
        return {"speed": other["speedup"], "speed_interval": other.get("interval"),
                "latency": measure["speedup_equal_work"]}
    return {"speed": measure["speedup_equal_work"],
            "speed_interval": measure.get("speedup_equal_work_interval"),  # (records before it: none)
            "latency": (measure.get("latency_batch1") or {}).get("speedup")}  # (records before it: none)


def rows(folder: str) -> List[Dict]:
    """The finished runs of a folder (FOLDER/*/compress.json with a report stage), slowest first."""
    out = []
    for path in sorted(glob.glob(os.path.join(folder, "*", RECORD))):
        try:
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
            if "report" in record.get("stages", {}):
                out.append(row(os.path.basename(os.path.dirname(path)), record))
        except (ValueError, KeyError, TypeError, AttributeError) as e:  # a file of another tool or version: one line
            raise UserError(f"{path}: not a finished compress record ({type(e).__name__}: {e})") from None
    return sorted(out, key=lambda r: (r["speed"], r["epochs"]))


def reported_sets(found: List[Dict]) -> List[str]:
    return list(dict.fromkeys(s for r in found for s in r["sets"]))


def significance(found: List[Dict]) -> str:
    """The significance settings of the runs, as their records say them (one sentence; several when they differ)."""
    return "Significance: " + "; ".join(dict.fromkeys(r["significance"] for r in found)) + "."


def control_files(folder: str) -> List[Tuple[str, Dict]]:
    """(path, content) of every FOLDER/control*-bleu.json of benchmarks/engine_bleu.py, by name."""
    out = []
    for path in sorted(glob.glob(os.path.join(folder, CONTROLS))):
        with open(path, encoding="utf-8") as f:
            out.append((path, json.load(f)))
    return out


def control_records(files: List[Tuple[str, Dict]]) -> Dict[str, Dict[str, Dict]]:
    """{control model: {set: engine_bleu's record}} of control_files; a name in two files is refused in one line."""
    out: Dict[str, Dict[str, Dict]] = {}
    for path, content in files:
        for name, sets in content["models"].items():
            if name in out:
                raise UserError(f"{path}: the control {name} is named in another control*-bleu.json too")
            out[name] = {s: v for s, v in sets.items() if isinstance(v, dict)}
    return out


def controls(folder: str) -> Dict[str, Dict[str, float]]:
    """{control model: {set: ΔBLEU}} from the folder's control*-bleu.json files, {} without one."""
    return {name: {s: v["bleu_delta"] for s, v in sets.items()}
            for name, sets in control_records(control_files(folder)).items()}


def controls_markdown(folder: str, sets: List[str]) -> str:
    """The controls as a table (ΔBLEU with its p where recorded) and each file's note, "" without one."""
    files = control_files(folder)
    found = control_records(files)
    if not found:
        return ""
    head = ["control"] + [f"{s} ΔBLEU (p)" for s in sets]

    def cell(record: Optional[Dict]) -> str:
        if record is None:
            return ""
        p = record.get("p")
        return f"{record['bleu_delta']:+.2f}" + (f" ({p:.3f})" if p is not None else "")

    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join([name] + [cell(m.get(s)) for s in sets]) + " |" for name, m in found.items()]
    lines += [f"\n{os.path.basename(path)}: {content['note']}" for path, content in files if content.get("note")]
    return "\n".join(lines)


def headers(sets: List[str]) -> List[str]:
    return (["run", "shape", "recovery epochs", "speed (equal work, 95% interval)", "FLOP ratio",
             "batch-1 latency speed-up"]
            + [f"{s} ΔBLEU (p); ΔchrF (p)" for s in sets])


def cells(found: List[Dict], sets: List[str]) -> List[List[str]]:
    out = []
    for r in found:
        extra = " (given by --shape)" if r["given"] else ""
        extra += f" (hidden-state term β {r['hidden']:g})" if r["hidden"] else ""
        extra += f" (--distill {r['distill']})" if r["other_signal"] else ""
        extra += " (vocabulary map)" if r["vocab_map"] and "vocabulary map" not in r["shape"] else ""  # (the
        # shape says so where the choice took the map)
        extra += (f" (+{r['distillation_set']['pairs']} pairs of --distill-source text)" if r["distillation_set"]
                  else "")
        latency = f"{r['latency']:.2f}x" if r["latency"] else "not measured"
        out.append([r["run"], r["shape"] + extra, str(r["epochs"]), speed_cell(r), f"{r['flops']:.2f}", latency]
                   + [set_cell(r, s) for s in sets])
    return out


def set_cell(r: Dict, s: str) -> str:
    """ΔBLEU (p) on a set, and ΔchrF (p) beside it where the run recorded chrF."""
    if s not in r["sets"]:
        return ""
    bleu = f"{r['sets'][s][0]:+.2f} ({r['sets'][s][1]:.3f})"
    chrf = (r.get("chrf") or {}).get(s)
    return bleu + (f"; chrF {chrf[0]:+.2f} ({chrf[1]:.3f})" if chrf else "")


def speed_cell(r: Dict) -> str:
    """The speed with its 95% interval (a run recorded before the measure stage kept one: the median alone)."""
    interval = r.get("speed_interval")
    if not interval:
        return f"{r['speed']:.2f}x (no interval recorded)"
    return f"{r['speed']:.2f}x ({interval['low']:.2f}-{interval['high']:.2f})"


def markdown(found: List[Dict], sets: List[str]) -> str:
    lines = ["| " + " | ".join(headers(sets)) + " |", "|" + "---|" * len(headers(sets))]
    return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in cells(found, sets)])
