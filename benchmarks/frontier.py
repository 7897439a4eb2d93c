"""The speed/BLEU frontier of the models `compress` built (issue 41's study): one table and one figure per folder of
runs, read from each run's compress.json (nothing is decoded or timed again).

  python benchmarks/frontier.py results/compress-de-en [results/compress-en-fr ...]

Writes FOLDER/frontier.md and FOLDER/frontier.png: for every run, the shape, the recovery epochs, the speed over the
unpruned model in the run's engine at equal work (and the FLOP ratio), and the BLEU difference to the unpruned model
on every reported set, with its paired-bootstrap p. Speeds come from different runs (and machine loads): read them
to about +-0.1. A control (the unpruned model through the same recovery), when the folder holds control-bleu.json
(benchmarks/engine_bleu.py), is drawn as horizontal marks at 1.0x.
"""
from __future__ import annotations

import glob
import json
import os
import sys
from typing import Dict, List

import logging

logging.getLogger("matplotlib").setLevel(logging.WARNING)  # the package's import leaves the root logger at DEBUG
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.append(ROOT)


def shape(record: Dict) -> str:
    from fairseq_headprune.compress.pipeline import shape_words

    return shape_words(record["stages"]["choice"]["chosen"])


def rows(folder: str) -> List[Dict]:
    out = []
    for path in sorted(glob.glob(os.path.join(folder, "*", "compress.json"))):
        record = json.load(open(path))
        st = record["stages"]
        report = st["report"]
        sets = {report["subset"]: report, **{a["subset"]: a for a in report.get("also") or []}}
        out.append({"run": os.path.basename(os.path.dirname(path)), "shape": shape(record),
                    "epochs": st["recover"].get("budget_epochs", 0), "given": bool(record["options"].get("shape")),
                    "hidden": (st["recover"].get("distill_hidden") or {}).get("weight"),
                    "speed": st["measure"]["speedup_equal_work"], "flops": st["measure"]["flop_ratio"],
                    "sets": {s: (r["bleu_delta"], r["p"]) for s, r in sets.items()}})
    return sorted(out, key=lambda r: (r["speed"], r["epochs"]))


def controls(folder: str) -> Dict[str, Dict[str, float]]:
    path = os.path.join(folder, "control-bleu.json")
    if not os.path.exists(path):
        return {}
    models = json.load(open(path))["models"]
    return {name: {s: v["bleu_delta"] for s, v in m.items() if isinstance(v, dict)} for name, m in models.items()}


def table(found: List[Dict], sets: List[str]) -> str:
    head = "| run | shape | recovery epochs | speed (equal work) | FLOP ratio | " + " | ".join(
        f"{s} ΔBLEU (p)" for s in sets) + " |"
    lines = [head, "|" + "---|" * (5 + len(sets))]
    for r in found:
        extra = " (given by --shape)" if r["given"] else ""
        extra += f" (hidden-state term β {r['hidden']:g})" if r["hidden"] else ""
        cells = [f"{r['sets'][s][0]:+.2f} ({r['sets'][s][1]:.3f})" if s in r["sets"] else "" for s in sets]
        lines.append(f"| {r['run']} | {r['shape']}{extra} | {r['epochs']} | {r['speed']:.2f}x | {r['flops']:.2f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(found: List[Dict], sets: List[str], ctl: Dict[str, Dict[str, float]], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sets), figsize=(5.6 * len(sets), 4.6), squeeze=False)
    for ax, s in zip(axes[0], sets):
        for r in found:
            if s not in r["sets"]:
                continue
            marker = "s" if "layers" in r["shape"] else "o"
            ax.scatter(r["speed"], r["sets"][s][0], marker=marker, s=20 + 8 * r["epochs"],
                       facecolors="none" if r["hidden"] else None)
            ax.annotate(f"{r['run']} ({r['epochs']} ep.)", (r["speed"], r["sets"][s][0]), fontsize=6,
                        xytext=(3, 3), textcoords="offset points")
        for name, deltas in ctl.items():
            if s in deltas:
                ax.scatter(1.0, deltas[s], marker="_", s=120, color="gray")
                ax.annotate(name, (1.0, deltas[s]), fontsize=6, xytext=(3, -8), textcoords="offset points")
        ax.axhline(0, color="black", lw=0.5)
        ax.axhline(-0.5, color="gray", lw=0.5, ls="--")
        ax.set_title(f"{s}: BLEU against the unpruned model")
        ax.set_xlabel("x the unpruned model, equal work (engine of the run)")
    axes[0][0].set_ylabel("ΔBLEU")
    fig.tight_layout()
    from fairseq_headprune.records.log import atomic_output

    with atomic_output(out, "wb") as f:  # whole or not at all
        fig.savefig(f, format="png", dpi=130)
    plt.close(fig)


def main(folders: List[str]) -> int:
    from fairseq_headprune.records.log import atomic_output

    for folder in folders:
        found = rows(folder)
        if not found:
            print(f"{folder}: no */compress.json", file=sys.stderr)
            return 2
        sets = list(dict.fromkeys(s for r in found for s in r["sets"]))
        ctl = controls(folder)
        text = (f"# The frontier of `compress` in {os.path.basename(folder.rstrip('/'))} (benchmarks/frontier.py)\n\n"
                "From each run's compress.json; speeds from different runs and loads (read to about +-0.1); ΔBLEU "
                "against the unpruned model in the same engine, paired-bootstrap p (1000 resamples, seed 1, "
                "one-sided).\n\n" + table(found, sets) + "\n\n![frontier](frontier.png)\n\n"
                "Squares: the decoder's depth cut; marker size: recovery epochs; open markers: the hidden-state "
                "term; gray dashes at 1.0x: the control (the unpruned model through the same recovery), where "
                "there is one; dashed line: -0.5.\n")
        with atomic_output(os.path.join(folder, "frontier.md")) as f:
            f.write(text)
        figure(found, sets, ctl, os.path.join(folder, "frontier.png"))
        print(f"wrote {folder}/frontier.md and frontier.png ({len(found)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
