"""Plots for the experiments (matplotlib, Agg backend; small PNGs). Pure presentation: every
function takes rows already computed and a path, and draws nothing else."""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from qveil.experiments._util import mean_se  # noqa: E402

__all__ = [
    "env_panels",
    "plot_bgp16",
    "plot_curves",
    "plot_lines",
    "plot_utility",
    "plot_utility_chain",
    "save",
]

DPI = 90


def save(fig: Any, path: Path) -> Path:
    """Write ``fig`` as a small PNG (adaptive 256-colour palette, optimised)."""

    # Pillow (matplotlib's dependency) loads only when a PNG is written
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


def env_panels(
    rows: Sequence[Mapping[str, Any]], *, width: float = 5.5, height: float = 3.8
) -> tuple[Any, list[tuple[Any, str, list[Mapping[str, Any]]]]]:
    """One panel per environment side by side: the figure and (axes, env, that env's rows)
    in env order (draw, then :func:`save`)."""
    envs = sorted({str(r["env"]) for r in rows})
    fig, axes = plt.subplots(1, len(envs), figsize=(width * len(envs), height), squeeze=False)
    panels = [
        (ax, env, [r for r in rows if r["env"] == env])
        for ax, env in zip(axes[0], envs, strict=True)
    ]
    return fig, panels


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
                stats = [mean_se(groups[m]) for m in ms]
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


def _f(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


# long-function: one four-panel figure; each panel's drawing is a few lines of the same data
def plot_utility(summary: Sequence[Mapping[str, Any]], path: Path, *, title: str) -> Path:
    """The fqi utility figure: top row, return against users N at eps = 1 (user relation,
    reward relation); bottom row, return against eps at N = 300 (user) and N = 100 (reward),
    with Algorithm 1's modes. Non-private FQI dashed, random grey, the 18.6 target dotted.
    Error bars: standard error over seeds."""
    rows = list(summary)
    fqi = [r for r in rows if r["method"] == "fqi"]
    all_n = sorted({int(r["users"]) for r in fqi})
    all_e = sorted({_f(r["epsilon"]) for r in fqi})
    e_ref = 1.0 if 1.0 in all_e else all_e[len(all_e) // 2]

    def nearest(n: int) -> int:
        return min(all_n, key=lambda v: abs(np.log(v / n)))

    fig, axes = plt.subplots(2, 2, figsize=(11.0, 7.6), squeeze=False)
    for j, rel in enumerate(("user", "reward")):
        n_ref = nearest(300 if rel == "user" else 100)
        mine = [r for r in fqi if r["relation"] == rel]
        for k, v in enumerate(dict.fromkeys(str(r["variant"]) for r in mine)):
            for i, (xkey, fixed_key, fixed) in enumerate(
                (("users", "epsilon", e_ref), ("epsilon", "users", n_ref))
            ):
                pts = sorted(
                    (_f(r[xkey]), _f(r["return_mean"]), _f(r["return_se"]))
                    for r in mine
                    if r["variant"] == v and _f(r[fixed_key]) == _f(fixed)
                )
                if pts:
                    x, y, e = (np.array(c) for c in zip(*pts, strict=True))
                    axes[i][j].errorbar(
                        x, y, yerr=e, fmt="-o", ms=3, capsize=2, color=f"C{k}", label=v
                    )
        for r0 in sorted({str(r["gamma"]) for r in rows if r["method"] == "non-private FQI"}):
            ref = sorted(
                (int(r["users"]), _f(r["return_mean"]))
                for r in rows
                if r["method"] == "non-private FQI" and str(r["gamma"]) == r0
            )
            xs, ys = zip(*ref, strict=True)
            axes[0][j].plot(xs, ys, "--", color="k", alpha=0.4 + 0.2 * min(2, len(r0)) / 2, lw=1)
            yy = dict(ref).get(n_ref)
            if yy is not None:
                axes[1][j].axhline(yy, ls="--", color="k", lw=1, alpha=0.5)
        axes[0][j].plot([], [], "--", color="k", lw=1, label="non-private FQI (per gamma)")
        rnd = [_f(r["return_mean"]) for r in rows if r["method"] == "random"]
        for i in range(2):
            ax = axes[i][j]
            if rnd:
                ax.axhline(float(np.mean(rnd)), color="grey", lw=1.5, label="random")
            ax.axhline(18.6, color="r", ls=":", lw=1, label="target 18.6")
            ax.set_xscale("log")
            ax.grid(True, which="both", alpha=0.3)
            ax.set_ylabel("return of the served release")
        if j == 0:
            for k, mode in enumerate(
                dict.fromkeys(str(r["method"]) for r in rows if str(r["method"]).startswith("alg1"))
            ):
                pts = sorted(
                    (_f(r["epsilon"]), _f(r["return_mean"]), _f(r["return_se"]))
                    for r in rows
                    if r["method"] == mode
                )
                x, y, e = (np.array(c) for c in zip(*pts, strict=True))
                axes[1][j].errorbar(
                    x,
                    y,
                    yerr=e,
                    fmt=":s",
                    ms=3,
                    capsize=2,
                    color=f"C{6 + k}",
                    label=f"{mode} (online)",
                )
        for i, ticks in ((0, all_n), (1, all_e)):
            axes[i][j].set_xticks(ticks, [f"{t:g}" for t in ticks])
            axes[i][j].minorticks_off()
        axes[0][j].set_title(f"{rel} relation, eps = {e_ref:g}", fontsize=9)
        axes[0][j].set_xlabel("users N")
        axes[1][j].set_title(f"{rel} relation, N = {n_ref}", fontsize=9)
        axes[1][j].set_xlabel("epsilon")
        for i in range(2):
            axes[i][j].legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    return save(fig, path)


def plot_utility_chain(chain: Sequence[Mapping[str, Any]], path: Path, *, title: str) -> Path:
    """RMSE of the value estimate against m on BGP16's chain: rows = start distribution,
    columns = (eps, delta); private FQE red, DP-LSW/DP-LSL blue/orange (F_max = 1 dashed,
    as written dotted), non-private references thin."""
    rows = list(chain)
    starts = sorted({str(r["start"]) for r in rows}, reverse=True)
    privs = sorted({(_f(r["epsilon"]), _f(r["delta"])) for r in rows if str(r["epsilon"])})
    fig, axes = plt.subplots(
        len(starts), len(privs), figsize=(5.6 * len(privs), 3.9 * len(starts)), squeeze=False
    )
    lines = [
        ("FQE pooled (non-private)", "", "k", "-", 1.0),
        ("FQE per-user (non-private)", "", "C3", "-", 1.0),
        ("LSW", "", "C0", "-", 1.0),
        ("DP-FQE (qveil fqi)", "1", "C3", "--", 2.0),
        ("DP-LSW", "1", "C0", "--", 2.0),
        ("DP-LSL", "1", "C1", "--", 2.0),
        ("DP-LSW", "R_max/(1-gamma)", "C0", ":", 1.5),
        ("DP-LSL", "R_max/(1-gamma)", "C1", ":", 1.5),
    ]
    for i, start in enumerate(starts):
        for j, (eps, delta) in enumerate(privs):
            ax = axes[i][j]
            for method, fm, color, ls, lw in lines:
                pts = sorted(
                    (int(r["m"]), _f(r["rmse_mean"]), _f(r["rmse_se"]))
                    for r in rows
                    if r["start"] == start
                    and r["method"] == method
                    and str(r["f_max"]) == fm
                    and (not fm or (_f(r["epsilon"]), _f(r["delta"])) == (eps, delta))
                )
                if not pts:
                    continue
                x, y, e = (np.array(c) for c in zip(*pts, strict=True))
                label = method + (f" F_max={fm}" if fm and method.startswith("DP-LS") else "")
                ax.errorbar(x, y, yerr=e, fmt=ls, color=color, lw=lw, capsize=2, label=label)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"start {start}, eps = {eps:g}, delta = {delta:g}", fontsize=9)
            ax.set_xlabel("users m (one trajectory each)")
            ax.set_ylabel("RMSE of V estimate")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    return save(fig, path)
