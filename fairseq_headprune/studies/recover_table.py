"""The recover study's table and its targets, read from the JSON benchmarks/recover_study.py writes: one
rendering for the study's own markdown and for the `report` section that shows it.

A row is a model scored on the study's subset (unpruned, shrink alone, shrink + recover after N epochs, a control:
the unpruned model put through the same recovery), with its BLEU, its difference to the unpruned model, the paired
bootstrap's p and interval, and for a recovery the difference minus its control's change after as many epochs.
"""
from __future__ import annotations

from typing import Dict, List, Optional

LEVEL = 0.01  # the project's significance level (results/recover-de-en/README.md)
# heads removed % -> the largest control-adjusted loss allowed within MAX_EPOCHS epochs
WITHIN = {50: 0.3, 75: 1.0}
MAX_EPOCHS = 4
NO_SIGNIFICANT_LOSS_AT = 30
CPU_MINUTES_PER_EPOCH, PEAK_GIB = 8.0, 4.0

HEADERS = ("model", "removed", "epochs", "BLEU", "vs unpruned", "p", "95% interval",
           "vs unpruned, minus the control's change")


def cells(result: Dict) -> List[List[str]]:
    out = []
    for r in result["rows"]:
        adjusted = (f"{r['delta_adjusted']:+.2f} (control {r['control_delta']:+.2f})"
                    if "delta_adjusted" in r else "")
        out.append([f"{r['label']} (`{r['key']}`)", f"{r['removed_percent']}%",
                    "" if r["epoch"] is None else str(r["epoch"]), f"{r['bleu']:.2f}",
                    f"{r['delta']:+.2f}" if "delta" in r else "", f"{r['p']:.3f}" if "p" in r else "",
                    f"[{r['interval'][0]:+.2f}, {r['interval'][1]:+.2f}]" if "interval" in r else "", adjusted])
    return out


def _per_epoch(cost: Dict) -> Optional[float]:
    epochs = len(cost.get("epochs") or [])
    return cost["cpu_minutes"] / epochs if epochs and cost.get("cpu_minutes") else None


def delivered_epoch(cost: Dict, within: int = MAX_EPOCHS) -> Optional[int]:
    """The epoch whose checkpoint `recover` hands back with this budget: fairseq's best by valid loss (never chosen
    on the scored set)."""
    epochs = [e for e in cost.get("epochs") or [] if e.get("valid_loss") is not None and e["epoch"] <= within]
    return min(epochs, key=lambda e: e["valid_loss"])["epoch"] if epochs else None


def targets(result: Dict) -> List[Dict]:
    """Each target with the row that answers it (None: not run) and whether it is met. A recovery is judged by
    the model it delivers within the budget (lowest valid loss), not by its best epoch on the scored set."""
    rows, costs, out = result["rows"], result.get("costs", {}), []
    for percent, allowed in WITHIN.items():
        delivered = [r for r in rows if r["removed_percent"] == percent and "delta_adjusted" in r
                     and r["epoch"] == delivered_epoch(costs.get(r["run"]) or {})]
        best = max(delivered, key=lambda r: r["delta_adjusted"], default=None)
        out.append({"target": f"{percent}% removed: within {allowed} BLEU of the unpruned model, control-adjusted, "
                              f"after at most {MAX_EPOCHS} epochs (the epoch of lowest valid loss)",
                    "best": best and best["key"], "figure": best and round(best["delta_adjusted"], 2),
                    "met": bool(best) and best["delta_adjusted"] >= -allowed})
    at = [r for r in rows if r["removed_percent"] == NO_SIGNIFICANT_LOSS_AT and "p" in r
          and (r["epoch"] == 0 or r["epoch"] == delivered_epoch(costs.get(r["run"]) or {}))]
    best = max(at, key=lambda r: (r["delta"] >= 0 or r["p"] >= LEVEL, r["delta"]), default=None)
    out.append({"target": f"{NO_SIGNIFICANT_LOSS_AT}% removed: no significant loss (p >= {LEVEL})",
                "best": best and best["key"], "figure": best and round(best["delta"], 2),
                "p": best and round(best["p"], 3), "met": bool(best) and (best["delta"] >= 0 or best["p"] >= LEVEL)})
    per_epoch = sorted((_per_epoch(c), run) for run, c in costs.items()
                       if c and c.get("default_recipe") and _per_epoch(c))
    peak = max((costs[run].get("peak_rss_gib") or 0 for _, run in per_epoch), default=None)
    median = per_epoch[len(per_epoch) // 2][0] if per_epoch else None
    out.append({"target": f"recover's cost with its defaults: at most {CPU_MINUTES_PER_EPOCH:g} CPU-minutes an "
                          f"epoch (median over its runs), peak memory at most {PEAK_GIB:g} GiB",
                "best": f"{len(per_epoch)} runs" if per_epoch else None, "figure": median and round(median, 1),
                "range": per_epoch and [round(per_epoch[0][0], 1), round(per_epoch[-1][0], 1)], "peak_gib": peak,
                "met": bool(per_epoch) and median <= CPU_MINUTES_PER_EPOCH and peak <= PEAK_GIB})
    return out


def target_lines(found: List[Dict]) -> List[str]:
    lines = []
    for t in found:
        if t["best"] is None:
            lines.append(f"{t['target']}: **not run**")
            continue
        if "peak_gib" in t:
            figure = (f"{t['best']}: median {t['figure']} CPU-min an epoch (range {t['range'][0]}-{t['range'][1]}); "
                      f"peak {t['peak_gib']} GiB")
        elif "p" in t:
            figure = f"best {t['best']}: {t['figure']:+.2f} (p {t['p']:.3f})"
        else:
            figure = f"best {t['best']}: {t['figure']:+.2f}"
        lines.append(f"{t['target']}: {figure}: **{'met' if t['met'] else 'missed'}**")
    return lines


def markdown(result: Dict) -> str:
    pair = result.get("pair", "de-en")
    lines = [f"# recover on the bundled {pair} model: '{result['subset']}'", "",
             f"Significance: {result['settings']}.", "",
             "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(row) + " |" for row in cells(result)]
    if (pair, result["subset"]) == ("de-en", "test"):  # the targets are test2016's; val only chose
        lines += ["", "Targets:", ""] + [f"- {line}" for line in target_lines(targets(result))]
    lines += ["", "| run | wall (min, all calls) | CPU (min) | peak RSS (GiB) | updates | valid loss per epoch |",
              "|---|---|---|---|---|---|"]
    for run, c in result["costs"].items():
        if not c:
            continue
        losses = ", ".join(f"{e['epoch']}: {e['valid_loss']:.3f}" for e in c.get("epochs") or [] if e.get("valid_loss"))
        values = [c.get(k, "") for k in ("wall_minutes", "cpu_minutes", "peak_rss_gib", "updates")]
        lines.append(f"| {run} | " + " | ".join(map(str, values)) + f" | {losses} |")
    return "\n".join(lines) + "\n"
