"""Plots for the experiments (matplotlib, Agg backend; small PNGs). Pure presentation: every
function takes rows already computed and a path, and draws nothing else."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

__all__ = ["plot_bgp16", "plot_curves", "plot_lines", "save"]

DPI = 90


def save(fig: Any, path: Path) -> Path:
    """Write ``fig`` as a small PNG (adaptive 256-colour palette, optimised)."""
    import io

    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=DPI, format="png")
    plt.close(fig)
    buf.seek(0)
    with Image.open(buf) as im:
        im.convert("RGB").quantize(colors=256).save(path, format="PNG", optimize=True)
    return path


def _mean_se(values: Sequence[float]) -> tuple[float, float]:
    a = np.asarray(values, dtype=np.float64)
    se = float(a.std(ddof=1) / np.sqrt(a.size)) if a.size > 1 else 0.0
    return float(a.mean()), se


def plot_bgp16(rows: Iterable[Mapping[str, Any]], path: Path, *, title: str) -> Path:
    """RMSE vs batch size: columns = features, rows = start distribution; mean +- s.e.
    Non-private LSW/LSL solid, DP with F_max = 1 dashed, DP with F_max as written dotted."""
    rows = list(rows)
    feats = sorted({str(r["features"]) for r in rows}, reverse=True)
    starts = sorted({str(r["start"]) for r in rows}, reverse=True)
    fig, axes = plt.subplots(
        len(starts), len(feats), figsize=(5.4 * len(feats), 3.9 * len(starts)), squeeze=False
    )
    lines = [
        ("LSW", "", "C0", "-"),
        ("LSL", "", "C1", "-"),
        ("DP-LSW", "1", "C0", "--"),
        ("DP-LSL", "1", "C1", "--"),
        ("DP-LSW", "R_max/(1-gamma)", "C0", ":"),
        ("DP-LSL", "R_max/(1-gamma)", "C1", ":"),
    ]
    for i, start in enumerate(starts):
        for j, feat in enumerate(feats):
            ax = axes[i][j]
            for method, fm, color, ls in lines:
                groups: dict[int, list[float]] = defaultdict(list)
                for r in rows:
                    if (
                        r["features"] == feat
                        and r["method"] == method
                        and str(r["start"]) == start
                        and str(r["f_max"]) == fm
                    ):
                        groups[int(r["m"])].append(float(r["rmse"]))
                if not groups:
                    continue
                ms = sorted(groups)
                stats = [_mean_se(groups[m]) for m in ms]
                mu = np.array([s[0] for s in stats])
                se = np.array([s[1] for s in stats])
                label = method if not fm else f"{method} (F_max={fm})"
                ax.errorbar(
                    ms, mu, yerr=se, color=color, ls=ls, marker="o", ms=2.5, label=label, capsize=2
                )
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("batch size m (trajectories)")
            ax.set_ylabel("RMSE over states")
            ax.set_title(f"{feat} features; start = {start}", fontsize=9)
            ax.grid(True, which="major", alpha=0.3)
            ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    return save(fig, path)


def plot_lines(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: Path,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    logy: bool = False,
    bands: Mapping[str, Sequence[float]] | None = None,
    styles: Mapping[str, str] | None = None,
) -> Path:
    """One panel of labelled (x, y) lines, optional +- bands per label."""
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    for label, (x, y) in series.items():
        fmt = (styles or {}).get(label, "-o")
        ax.plot(x, y, fmt, label=label, ms=3)
        if bands and label in bands:
            yy = np.asarray(y, dtype=np.float64)
            bb = np.asarray(bands[label], dtype=np.float64)
            ax.fill_between(x, yy - bb, yy + bb, alpha=0.2)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return save(fig, path)


def plot_curves(
    panels: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float]]]],
    path: Path,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    ncols: int = 2,
) -> Path:
    """Several panels of mean +- std curves: panels[name][label] = (x, mean, std)."""
    n = len(panels)
    ncols = min(ncols, n)
    nrows = (n + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.4 * ncols, 3.6 * nrows), squeeze=False)
    for idx, (pname, curves) in enumerate(panels.items()):
        ax = axes[idx // ncols][idx % ncols]
        for label, (x, mu, sd) in curves.items():
            xx = np.asarray(x, dtype=np.float64)
            m = np.asarray(mu, dtype=np.float64)
            s = np.asarray(sd, dtype=np.float64)
            ax.plot(xx, m, label=label)
            ax.fill_between(xx, m - s, m + s, alpha=0.15)
        ax.set_title(pname, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for idx in range(n, nrows * ncols):
        axes[idx // ncols][idx % ncols].axis("off")
    fig.suptitle(title, fontsize=9)
    return save(fig, path)
