"""Every figure of the package, matplotlib only (Agg backend: no display needed)."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fairseq_headprune.records.log import atomic_output  # noqa: E402


def _save(fig, path: str) -> str:
    with atomic_output(path, "wb") as f:
        fig.savefig(f, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def head_heatmap(
    values: Dict[Tuple[int, int], float],
    significant: Dict[Tuple[int, int], bool],
    title: str,
    colorbar_label: str,
    path: str,
) -> str:
    """A layers x heads grid of (layer, head) -> value, centred on 0; significant cells carry a star."""
    layers = sorted({layer for layer, _ in values})
    heads = sorted({head for _, head in values})
    grid = np.full((len(layers), len(heads)), np.nan)
    for (layer, head), v in values.items():
        grid[layers.index(layer), heads.index(head)] = v
    bound = float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 1.0
    fig, ax = plt.subplots(figsize=(1.0 + 0.55 * len(heads), 1.0 + 0.45 * len(layers)))
    im = ax.imshow(grid, cmap="RdBu", vmin=-bound or -1, vmax=bound or 1, aspect="auto")
    for (layer, head), v in values.items():
        mark = "*" if significant.get((layer, head)) else ""
        ax.text(heads.index(head), layers.index(layer), f"{v:.2f}{mark}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(heads)), [str(h) for h in heads])
    ax.set_yticks(range(len(layers)), [str(layer) for layer in layers])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, label=colorbar_label)
    return _save(fig, path)


def scatter_with_fit(
    x: Sequence[float], y: Sequence[float], xlabel: str, ylabel: str, title: str, path: str,
    labels: Optional[List[str]] = None,
) -> str:
    """Figure 2 of Michel et al.: one point per head, with a least-squares line."""
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.scatter(x, y, s=12, alpha=0.7)
    if len(x) > 1 and np.ptp(x) > 0:
        slope, intercept = np.polyfit(x, y, 1)
        xs = np.linspace(min(x), max(x), 2)
        ax.plot(xs, slope * xs + intercept, color="C3", lw=1)
    ax.axhline(0, color="grey", lw=0.5)
    ax.axvline(0, color="grey", lw=0.5)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    return _save(fig, path)


def pruning_curves(rows: List[dict], path: str, y: str = "bleu", ylabel: str = "BLEU") -> str:
    """Figures 3/4 of Michel et al.: one curve per pruning order and attention types, score vs % pruned."""
    curves: Dict[str, List[Tuple[float, float]]] = {}
    for row in rows:
        if "percent_pruned" in row:
            label = f"{row['order']} ({', '.join(row['types'])})"
            curves.setdefault(label, []).append((row["percent_pruned"], row[y]))
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for label, points in sorted(curves.items()):
        points.sort()
        ax.plot([p for p, _ in points], [v for _, v in points], marker="o", ms=3, label=label)
    ax.set_xlabel("% of heads pruned")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def dynamics_figure(rows: List[dict], path: str) -> str:
    """Figure 5 of Michel et al.: % of BLEU retained vs % of heads pruned, one curve per epoch; beside it,
    each epoch's unpruned BLEU."""
    by_epoch: Dict[int, List[Tuple[float, float, float]]] = {}
    for r in rows:
        if "epoch" in r:
            by_epoch.setdefault(r["epoch"], []).append((r["percent_pruned"], r["bleu_retained"], r["bleu"]))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [3, 2]})
    cmap = plt.get_cmap("viridis")
    epochs = sorted(by_epoch)
    for i, e in enumerate(epochs):
        pts = sorted(by_epoch[e])
        ax.plot([p for p, _, _ in pts], [v for _, v, _ in pts], marker="o", ms=3,
                color=cmap(i / max(1, len(epochs) - 1)), label=f"epoch {e}")
    ax.set_xlabel("% of heads pruned")
    ax.set_ylabel("% of the epoch's BLEU retained")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    base = [next(b for p, _, b in sorted(by_epoch[e]) if p == 0) if any(p == 0 for p, _, _ in by_epoch[e]) else np.nan
            for e in epochs]
    bx.plot(epochs, base, marker="o")
    bx.set_xlabel("epoch")
    bx.set_ylabel("BLEU (unpruned)")
    bx.grid(alpha=0.3)
    return _save(fig, path)


def _function_colour(labels: Sequence[str]) -> str:
    """One colour per kind of head function (Voita et al. Figure 1): positional, rare, syntactic, none."""
    kinds = {label.split()[0] for label in labels}
    if len(kinds) > 1:
        return "tab:purple"
    return {"positional": "tab:blue", "rare": "tab:orange", "syntactic": "tab:green"}.get(kinds.pop() if kinds else "",
                                                                                         "tab:gray")


def head_confidence_relevance(layers: List[dict], attn_type: str, path: str) -> str:
    """Per layer, bars of each head's confidence (top row) and LRP relevance share (bottom row); in encoder
    self-attention the relevance bars are coloured by the head's function."""
    n = len(layers)
    fig, axes = plt.subplots(2, n, figsize=(2.1 * n + 1, 4.6), sharey="row", squeeze=False)
    for j, entry in enumerate(layers):
        heads = entry["heads"]
        x = np.arange(len(heads))
        axes[0, j].bar(x, [h["confidence"] for h in heads], color="tab:cyan")
        colours = [_function_colour(h.get("labels", [])) for h in heads]
        axes[1, j].bar(x, [h["relevance"] for h in heads], color=colours)
        for ax in axes[:, j]:
            ax.set_xticks(x, [str(h["head"]) for h in heads], fontsize=7)
            ax.grid(axis="y", alpha=0.3)
        axes[0, j].set_title(f"layer {entry['layer']}", fontsize=9)
        axes[1, j].set_xlabel("head", fontsize=8)
    axes[0, 0].set_ylabel("confidence")
    axes[1, 0].set_ylabel("relevance share")
    axes[0, 0].set_ylim(0, 1)
    if attn_type == "enc-self":
        from matplotlib.patches import Patch

        kinds = [("positional", "tab:blue"), ("rare", "tab:orange"), ("syntactic", "tab:green"),
                 ("several", "tab:purple"), ("none", "tab:gray")]
        fig.legend(handles=[Patch(color=c, label=k) for k, c in kinds], loc="lower center", ncol=5, fontsize=8,
                   bbox_to_anchor=(0.5, -0.04))
    fig.suptitle(f"{attn_type}: confidence and LRP relevance per head", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def head_function_map(layers: List[dict], baselines: Optional[Dict[str, float]], path: str) -> str:
    """Encoder self-attention heads (layers x heads): the share of tokens whose maximum attention goes to
    position -1, +1 and the rarest token, and (with parses) the best syntactic accuracy above its positional
    baseline. Starred cells carry the label."""
    heads = sorted({h["head"] for e in layers for h in e["heads"]})
    panels = [("prev", "max weight on position -1", "positional -1"),
              ("next", "max weight on position +1", "positional +1"),
              ("rare", "max weight on the rarest token", "rare")]
    if baselines is not None:
        panels.append(("syntactic", "best syntactic accuracy - baseline", "syntactic"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 0.45 * len(layers) + 1.6), squeeze=False)
    for ax, (field, title, label) in zip(axes[0], panels):
        grid = np.full((len(layers), len(heads)), np.nan)
        starred = np.zeros_like(grid, dtype=bool)
        for i, entry in enumerate(layers):
            for h in entry["heads"]:
                fn = h["functions"]
                if field == "syntactic":
                    margins = [acc - baselines.get(name, 0.0) for name, acc in fn.get("syntactic", {}).items()]
                    value = max(margins) if margins else np.nan
                else:
                    value = fn[field]
                grid[i, heads.index(h["head"])] = value
                starred[i, heads.index(h["head"])] = any(x.startswith(label) for x in h["labels"])
        vmin = -0.5 if field == "syntactic" else 0.0
        vmax = 0.5 if field == "syntactic" else 1.0
        im = ax.imshow(grid, cmap="RdBu" if field == "syntactic" else "Blues", vmin=vmin, vmax=vmax, aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.2f}" + ("*" if starred[i, j] else ""), ha="center", va="center", fontsize=6,
                        color="white" if (v > 0.6 * vmax or v < 0.6 * vmin) else "black")
        ax.set_xticks(range(len(heads)), [str(h) for h in heads], fontsize=7)
        ax.set_yticks(range(len(layers)), [str(e["layer"]) for e in layers], fontsize=7)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle("encoder self-attention head functions (* = labelled)", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def l0_vs_importance(rows: Sequence[Dict], total: int, tolerance: float, path: str) -> str:
    """BLEU vs heads kept: Voita's L0-gated runs against Michel's I_h masks at the same sizes (`compare`)."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    base = next(r["bleu"] for r in rows if r["key"] == "baseline")
    ax.axhline(base, color="grey", ls="--", lw=1, label=f"unpruned ({base:.2f})")
    ax.axhline(base - tolerance, color="grey", ls=":", lw=1, label=f"unpruned - {tolerance}")
    for method, label, marker in (("l0", "L0 gates (fine-tuned)", "o"), ("michel", "Michel I_h (no fine-tuning)", "s")):
        pts = sorted((r["heads_kept"], r["bleu"], r.get("l0_lambda")) for r in rows if r.get("method") == method)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, ms=4, label=label)
            for x, y, lam in pts:
                if lam is not None:
                    ax.annotate(f"λ={lam:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.axvline(total / 2, color="C3", lw=0.5)
    ax.set_xlim(0, total * 1.1)  # room for the labels of the points near the full model
    ax.set_xlabel(f"heads kept (of {total})")
    ax.set_ylabel("BLEU")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def survivors_figure(rows: Sequence[Dict], functions: Sequence[str], path: str) -> str:
    """Voita et al.'s view of an L0 sweep: heads kept per type against heads kept overall, heads kept per layer of
    each type across λ, and (with an `analyze` result) the functions of the encoder self-attention heads kept."""
    types = list(rows[0]["kept_per_layer"])
    with_functions = "functions_kept" in rows[0]
    n = 1 + len(types) + with_functions
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.8), squeeze=False)
    axes = axes[0]
    xs = [r["kept"] for r in rows]
    for t in types:
        axes[0].plot(xs, [r["kept_per_type"][t] for r in rows], marker="o", ms=4, label=t)
    axes[0].set_xlabel(f"heads kept (of {rows[0]['total']})")
    axes[0].set_ylabel("heads kept of the type")
    axes[0].invert_xaxis()
    axes[0].grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    labels = [f"λ={r['l0_lambda']:g}" for r in rows]
    for ax, t in zip(axes[1:], types):
        grid = np.array([r["kept_per_layer"][t] for r in rows], dtype=float)
        im = ax.imshow(grid, cmap="Blues", vmin=0, vmax=max(1.0, grid.max()), aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            ax.text(j, i, f"{int(v)}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(grid.shape[1]), [str(i + 1) for i in range(grid.shape[1])], fontsize=7)
        ax.set_yticks(range(len(rows)), labels, fontsize=7)
        ax.set_xlabel("layer")
        ax.set_title(f"{t}: heads kept per layer", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046)
    if with_functions:
        ax = axes[-1]
        bottom = np.zeros(len(rows))
        for f in functions:
            counts = np.array([r["functions_kept"][f] for r in rows], dtype=float)
            ax.barh(range(len(rows)), counts, left=bottom, label=f)
            bottom += counts
        ax.set_yticks(range(len(rows)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("encoder self-attention heads kept")
        ax.set_title("their functions (analyze, before fine-tuning)", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def pareto_frontier(points: Sequence[Tuple[float, float]]) -> List[Tuple[float, float]]:
    """The (speed, quality) points no other point beats on both, by increasing speed (the shapes compress chooses
    among: compress.choice.fisher_frontier)."""
    front, best = [], float("-inf")
    for speed, quality in sorted(points, key=lambda p: (-p[0], -p[1])):
        if quality > best:
            front.append((speed, quality))
            best = quality
    return front[::-1]


def deploy_frontier(rows: Sequence[Dict], path: str, speed_key: str = "x_unpruned_fairseq_natural-batch",
                    ceilings: Sequence[Dict] = (), target: Optional[Tuple[float, float]] = None) -> str:
    """Left: BLEU against speed (relative to the unpruned model in fairseq) of every model x engine, the frontier
    drawn. Right: the CTranslate2 int8 models at equal work over the unpruned int8, the `target` (speed-up, BLEU
    loss to the unpruned fairseq model) shaded and each ceiling (a shape's speed) as a vertical line."""
    markers = {"fairseq": "o", "ct2-float32": "s", "ct2-int8": "^"}
    fig, (ax, right) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [7, 5]})
    for engine, marker in markers.items():
        mine = [r for r in rows if r["engine"] == engine]
        ax.scatter([r[speed_key] for r in mine], [r["bleu"] for r in mine], marker=marker, label=engine, zorder=3)
        for r in mine:
            ax.annotate(r["model"], (r[speed_key], r["bleu"]), fontsize=7, xytext=(4, 3), textcoords="offset points")
    front = pareto_frontier([(r[speed_key], r["bleu"]) for r in rows])
    ax.plot([p[0] for p in front], [p[1] for p in front], "k--", lw=1, label="frontier", zorder=2)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%gx"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%gx"))
    ax.set_xlabel("sentences/s relative to the unpruned model in fairseq (batched, one thread, log scale)")
    ax.set_ylabel("BLEU")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    key = "x_unpruned_same_engine_forced-batch"
    int8 = [r for r in rows if r["engine"] == "ct2-int8"]
    right.scatter([r[key] for r in int8], [r["bleu"] for r in int8], marker="^", color="C2", zorder=3)
    for r in int8:
        right.annotate(r["model"], (r[key], r["bleu"]), fontsize=7, xytext=(4, 3), textcoords="offset points")
    front = pareto_frontier([(r[key], r["bleu"]) for r in int8])
    right.plot([p[0] for p in front], [p[1] for p in front], "k--", lw=1, zorder=2)
    for i, c in enumerate(sorted(ceilings, key=lambda c: c[key])):  # labels at three heights: neighbours overlap
        right.axvline(c[key], color="0.6", lw=0.8, ls=":")
        right.annotate(c["shape"], (c[key], 1.0 - 0.17 * (i % 3)), xycoords=("data", "axes fraction"), fontsize=6,
                       rotation=90, ha="right", va="top", color="0.35")
    unpruned = next((r["bleu"] for r in rows if r["shape"] == "unpruned" and r["engine"] == "fairseq"), None)
    if target is not None and unpruned is not None:  # the quadrant that meets both targets, shaded
        right.axvline(target[0], color="C2", lw=0.8, ls="--")
        right.axhline(unpruned - target[1], color="C2", lw=0.8, ls="--")
        xlim, ylim = right.get_xlim(), right.get_ylim()
        xlim, ylim = (xlim[0], max(xlim[1], target[0] * 1.1)), (ylim[0], max(ylim[1], unpruned - target[1] + 0.2))
        right.fill_between([target[0], xlim[1]], unpruned - target[1], ylim[1], color="C2", alpha=0.08, lw=0)
        right.set_xlim(*xlim)
        right.set_ylim(*ylim)
        right.annotate(f"target: >= {target[0]:g}x and within {target[1]:g} BLEU of unpruned fairseq",
                       (0.01, 0.01), xycoords="axes fraction", fontsize=7, color="C2")
    right.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%gx"))
    right.set_xlabel("CTranslate2 int8: x the unpruned int8 at equal work (batched); dotted: ceilings")
    right.set_ylabel("BLEU")
    right.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def compress_frontier(found: Sequence[Dict], sets: Sequence[str], controls: Dict[str, Dict[str, float]],
                      path: str) -> str:
    """ΔBLEU against speed of compress runs (studies.frontier rows), one panel per reported set: squares cut the
    decoder's depth, marker size grows with the recovery epochs, open markers used the hidden-state term, orange
    ones another --distill than logits; the controls as gray dashes at 1.0x; -0.5 dashed."""
    fig, axes = plt.subplots(1, len(sets), figsize=(5.6 * len(sets), 4.6), squeeze=False)
    for ax, s in zip(axes[0], sets):
        for r in found:
            if s not in r["sets"]:
                continue
            marker = "s" if "layers" in r["shape"] else "o"
            color = "C1" if r.get("other_signal") else "C0"
            ax.scatter(r["speed"], r["sets"][s][0], marker=marker, s=20 + 8 * r["epochs"],
                       facecolors="none" if r["hidden"] else color, edgecolors=color)
            ax.annotate(f"{r['run']} ({r['epochs']} ep.)", (r["speed"], r["sets"][s][0]), fontsize=6,
                        xytext=(3, 3), textcoords="offset points")
        for name, deltas in controls.items():
            if s in deltas:
                ax.scatter(1.0, deltas[s], marker="_", s=120, color="gray")
                ax.annotate(name, (1.0, deltas[s]), fontsize=6, xytext=(3, -8), textcoords="offset points")
        ax.axhline(0, color="black", lw=0.5)
        ax.axhline(-0.5, color="gray", lw=0.5, ls="--")
        ax.set_title(f"{s}: BLEU against the unpruned model")
        ax.set_xlabel("x the unpruned model, equal work (engine of the run)")
    axes[0][0].set_ylabel("ΔBLEU")
    fig.tight_layout()
    return _save(fig, path)
