"""Every figure of the package, matplotlib only (Agg backend: no display needed)."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fairseq_headprune.store import atomic_output  # noqa: E402


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
