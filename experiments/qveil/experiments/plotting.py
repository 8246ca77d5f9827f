"""Plots for the experiments (matplotlib, Agg backend; small PNGs). Pure presentation: every
function takes rows already computed and a path, and draws nothing else.

Each ``plot_X(rows, path, ...)`` saves ``X_figure(rows, ...)``, the figure itself (what the
tests inspect). Their layout: the figure's one legend below every panel, off the data
(:func:`legend_below`), titles wrapped to the figure's width (:func:`fit_title`), on
matplotlib's constrained layout so that nothing is cut off."""

from __future__ import annotations

import io
import textwrap
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import NotRequired, TypedDict, Unpack

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402
from matplotlib.artist import Artist  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.legend import Legend  # noqa: E402

from qveil.experiments._util import mean_se  # noqa: E402
from qveil.json_types import JSONMapping

__all__ = [
    "bgp16_figure",
    "curves_figure",
    "env_panels",
    "fit_title",
    "legend_below",
    "lines_figure",
    "panels",
    "plot_bgp16",
    "plot_curves",
    "plot_lines",
    "plot_utility",
    "plot_utility_chain",
    "save",
    "utility_chain_figure",
    "utility_figure",
]

DPI = 90


def save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as a small PNG (adaptive 256-colour palette, optimised)."""

    # Pillow (matplotlib's dependency) loads only when a PNG is written
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=DPI, format="png")
    plt.close(fig)
    buf.seek(0)
    with Image.open(buf) as im:
        im.convert("RGB").quantize(colors=256).save(path, format="PNG", optimize=True)
    return path


def panels(
    nrows: int, ncols: int, *, width: float, height: float
) -> tuple[Figure, np.ndarray]:  # an nrows x ncols array of Axes (matplotlib types it so)
    """A figure of nrows x ncols panels of width x height inches each, on the constrained
    layout (titles, labels and :func:`legend_below` fit in the figure): (figure, axes[i][j])."""
    return plt.subplots(
        nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False, layout="constrained"
    )


def fit_title(fig: Figure, text: str, *, fontsize: float, share: float = 1.0) -> str:
    """``text`` wrapped to lines that fit ``share`` of the figure's width at ``fontsize``."""
    chars = int(share * fig.get_figwidth() * 72 / (0.6 * fontsize))
    return textwrap.fill(text, width=max(20, chars), break_on_hyphens=False)


def legend_below(fig: Figure, axes: Iterable[Axes], *, fontsize: float = 7) -> Legend | None:
    """One legend for the whole figure, below its panels, where it covers no curve: every
    label the panels drew, once, in the order they first drew it, in as many columns as the
    figure's width holds. None when nothing is labelled."""
    entries: dict[str, Artist] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    if not entries:
        return None
    widest = max(len(label) for label in entries) * 0.6 * fontsize + 40  # points
    ncols = max(1, min(len(entries), int(fig.get_figwidth() * 72 // widest)))
    return fig.legend(
        list(entries.values()),
        list(entries),
        loc="outside lower center",
        ncols=ncols,
        fontsize=fontsize,
        frameon=False,
    )


def env_panels(
    rows: Sequence[JSONMapping],
    *,
    width: float = 5.0,
    height: float = 3.6,
    columns: int = 3,
) -> tuple[Figure, list[tuple[Axes, str, list[JSONMapping]]]]:
    """One panel per environment, at most ``columns`` to a row (a figure people can read
    whatever the number of environments), with the constrained layout that
    :func:`legend_below` places its legend in: the figure and (axes, env, that env's rows) in
    env order (draw, then :func:`legend_below` and :func:`save`). Unused panels are hidden."""
    envs = sorted({str(r["env"]) for r in rows})
    ncols = max(1, min(columns, len(envs)))
    nrows = -(-len(envs) // ncols)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(width * ncols, height * nrows + 0.6),
        squeeze=False,
        layout="constrained",
    )
    flat = list(axes.flat)
    for ax in flat[len(envs) :]:
        ax.set_visible(False)
    panels = [
        (ax, env, [r for r in rows if r["env"] == env]) for ax, env in zip(flat, envs, strict=False)
    ]
    return fig, panels


def plot_bgp16(rows: Iterable[JSONMapping], path: Path, *, title: str) -> Path:
    """Save :func:`bgp16_figure` as ``path``."""
    return save(bgp16_figure(rows, title=title), path)


def bgp16_figure(rows: Iterable[JSONMapping], *, title: str) -> Figure:
    """RMSE vs batch size: columns = features, rows = start distribution; mean +- s.e.
    Non-private LSW/LSL solid, DP with F_max = 1 dashed, DP with F_max as written dotted."""
    rows = list(rows)
    feats = sorted({str(r["features"]) for r in rows}, reverse=True)
    starts = sorted({str(r["start"]) for r in rows}, reverse=True)
    fig, axes = panels(len(starts), len(feats), width=5.4, height=3.9)
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
    legend_below(fig, axes.flat)
    fig.suptitle(fit_title(fig, title, fontsize=9), fontsize=9)
    return fig


class _LinesOptions(TypedDict):
    """:func:`lines_figure`'s keywords."""

    title: str
    xlabel: str
    ylabel: str
    logx: NotRequired[bool]
    logy: NotRequired[bool]
    bands: NotRequired[Mapping[str, Sequence[float]] | None]
    styles: NotRequired[Mapping[str, str] | None]


def plot_lines(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: Path,
    **kw: Unpack[_LinesOptions],
) -> Path:
    """Save :func:`lines_figure` as ``path``."""
    return save(lines_figure(series, **kw), path)


def lines_figure(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    logy: bool = False,
    bands: Mapping[str, Sequence[float]] | None = None,
    styles: Mapping[str, str] | None = None,
) -> Figure:
    """One panel of labelled (x, y) lines, optional +- bands per label."""
    fig, axes = panels(1, 1, width=6.0, height=4.0)
    ax = axes[0][0]
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
    ax.set_title(fit_title(fig, title, fontsize=9, share=0.85), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    legend_below(fig, [ax])
    return fig


#: one curve of :func:`curves_figure`: (x, mean, std)
Curve = tuple[npt.ArrayLike, npt.ArrayLike, npt.ArrayLike]


class _CurvesOptions(TypedDict):
    """:func:`curves_figure`'s keywords."""

    title: str
    xlabel: str
    ylabel: str
    ncols: NotRequired[int]


def plot_curves(
    curves: Mapping[str, Mapping[str, Curve]],
    path: Path,
    **kw: Unpack[_CurvesOptions],
) -> Path:
    """Save :func:`curves_figure` as ``path``."""
    return save(curves_figure(curves, **kw), path)


def curves_figure(
    curves: Mapping[str, Mapping[str, Curve]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    ncols: int = 2,
) -> Figure:
    """Several panels of mean +- std curves: curves[panel][label] = (x, mean, std)."""
    n = len(curves)
    ncols = min(ncols, n)
    nrows = (n + ncols - 1) // ncols
    fig, axes = panels(nrows, ncols, width=5.4, height=3.6)
    for idx, (pname, panel) in enumerate(curves.items()):
        ax = axes[idx // ncols][idx % ncols]
        for label, (x, mu, sd) in panel.items():
            xx = np.asarray(x, dtype=np.float64)
            m = np.asarray(mu, dtype=np.float64)
            s = np.asarray(sd, dtype=np.float64)
            ax.plot(xx, m, label=label)
            ax.fill_between(xx, m - s, m + s, alpha=0.15)
        ax.set_title(pname, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    for idx in range(n, nrows * ncols):
        axes[idx // ncols][idx % ncols].axis("off")
    legend_below(fig, axes.flat)
    fig.suptitle(fit_title(fig, title, fontsize=9), fontsize=9)
    return fig


def _f(v: object) -> float:
    try:
        return float(v)  # type: ignore[arg-type]  # a number, or NaN for anything else
    except (TypeError, ValueError):
        return float("nan")


# long-function: one four-panel figure; each panel's drawing is a few lines of the same data
def plot_utility(summary: Sequence[JSONMapping], path: Path, *, title: str) -> Path:
    """Save :func:`utility_figure` as ``path``."""
    return save(utility_figure(summary, title=title), path)


def utility_figure(summary: Sequence[JSONMapping], *, title: str) -> Figure:
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

    fig, axes = panels(2, 2, width=5.5, height=3.8)
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
    legend_below(fig, axes.flat)
    fig.suptitle(fit_title(fig, title, fontsize=9), fontsize=9)
    return fig


def plot_utility_chain(chain: Sequence[JSONMapping], path: Path, *, title: str) -> Path:
    """Save :func:`utility_chain_figure` as ``path``."""
    return save(utility_chain_figure(chain, title=title), path)


def utility_chain_figure(chain: Sequence[JSONMapping], *, title: str) -> Figure:
    """RMSE of the value estimate against m on BGP16's chain: rows = start distribution,
    columns = (eps, delta); private FQE red, DP-LSW/DP-LSL blue/orange (F_max = 1 dashed,
    as written dotted), non-private references thin."""
    rows = list(chain)
    starts = sorted({str(r["start"]) for r in rows}, reverse=True)
    privs = sorted({(_f(r["epsilon"]), _f(r["delta"])) for r in rows if str(r["epsilon"])})
    fig, axes = panels(len(starts), len(privs), width=5.6, height=3.9)
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
    legend_below(fig, axes.flat)
    fig.suptitle(fit_title(fig, title, fontsize=9), fontsize=9)
    return fig
