"""qveil.experiments.plotting's figures on small synthetic rows, read through matplotlib's
objects: every title and axis label inside the canvas (a long title wraps instead of being
cut off), and the one legend below the panels, on no panel and no data point."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pytest
from plot_helpers import assert_legends_off_the_data, assert_texts_inside

from qveil.experiments import plotting

LONG = (
    "Proposition 10: random MDPs (2 actions, Dirichlet(1) rows, r~U[0,1]), sigma=0.3, "
    "gamma=0.9, and a title longer than any panel is wide"
)


def lines() -> Any:
    xs = [4.0, 16.0, 64.0, 256.0, 1024.0]
    return plotting.lines_figure(
        {
            "measured E[(1/n)||v'-v*||_1]": (xs, [1.3, 0.9, 0.75, 0.72, 0.74]),
            "stated bound 2sqrt2 sigma/(sqrt(n pi)(1-gamma))": (xs, [2.4, 1.2, 0.6, 0.3, 0.15]),
            "bound without sqrt(n)": (xs, [4.8] * 5),
        },
        title=LONG,
        xlabel="number of states n",
        ylabel="utility loss",
        logx=True,
        logy=True,
        styles={"bound without sqrt(n)": "--k"},
    )


def curves() -> Any:
    x = np.arange(0, 5000, 50.0)
    rng = np.random.default_rng(0)
    labels = [
        "non-private DQN (sigma=0)",
        "Alg.1 paper's sigma (paper's parameters; guarantee not reproduced)",
        "Alg.1 qveil paper mode",
        "Alg.1 qveil gdp mode",
        "Alg.1 qveil output mode",
        "DP-SGD (no amplification)",
        "input perturbation",
    ]
    panel = {lab: (x, 8 + 4 * rng.standard_normal(x.size), np.full(x.size, 3.0)) for lab in labels}
    return plotting.curves_figure(
        {"target eps = 0.9, delta = 0.0001": panel, "target eps = 0.45, delta = 0.0001": panel},
        title="Fig. 2: training-episode returns on LineWalk (mean +- sd over seeds); output "
        "mode trains without noise, so its curve is the non-private one",
        xlabel="samples",
        ylabel="training episode return",
    )


def utility() -> Any:
    rows: list[dict[str, Any]] = []
    for rel in ("user", "reward"):
        for variant in ("g=0.3 s=0.2", "g=0.9 s=0.2"):
            for n in (30, 100, 300, 1000):
                for eps in (0.25, 1.0, 4.0):
                    rows.append(
                        {
                            "method": "fqi",
                            "variant": f"fqi {rel} {variant}",
                            "relation": rel,
                            "users": n,
                            "epsilon": eps,
                            "gamma": "",
                            "return_mean": 10 + 3 * np.log10(n * eps),
                            "return_se": 1.0,
                        }
                    )
    for gamma in ("0.3", "0.9"):
        for n in (30, 100, 300, 1000):
            rows.append({"method": "non-private FQI", "gamma": gamma, "users": n,
                         "return_mean": 20.7, "return_se": 0.1})  # fmt: skip
    rows.append({"method": "random", "return_mean": 10.9, "return_se": 0.3})
    for mode in ("alg1 paper", "alg1 gdp"):
        for eps in (0.25, 1.0, 4.0):
            rows.append({"method": mode, "epsilon": eps, "return_mean": 5.0, "return_se": 2.0})
    return plotting.utility_figure(rows, title="fqi release on LineWalk, served; 10 seeds")


def chain() -> Any:
    rows = []
    for start in ("uniform", "first"):
        for method, fm in (("FQE pooled (non-private)", ""), ("LSW", ""),
                           ("DP-FQE (qveil fqi)", "1"), ("DP-LSW", "1"),
                           ("DP-LSL", "R_max/(1-gamma)")):  # fmt: skip
            for m in (10, 100, 1000, 10000):
                rows.append(
                    {
                        "start": start,
                        "method": method,
                        "f_max": fm,
                        "epsilon": 1.0 if fm else "",
                        "delta": 1e-5 if fm else "",
                        "m": m,
                        "rmse_mean": 100 / m**0.5 * (10 if fm else 1),
                        "rmse_se": 0.1,
                    }
                )
    return plotting.utility_chain_figure(rows, title="chain FQE against BGP16 (eps 1)")


def bgp16() -> Any:
    rows = []
    for feats in ("tabular", "pairs"):
        for start in ("uniform", "first"):
            for method, fm in (("LSW", ""), ("LSL", ""), ("DP-LSW", "1"),
                               ("DP-LSL", "R_max/(1-gamma)")):  # fmt: skip
                for m in (10, 100, 1000):
                    rows.append({"features": feats, "start": start, "method": method,
                                 "f_max": fm, "m": m, "rmse": 1e3 / m})  # fmt: skip
    return plotting.bgp16_figure(rows, title="BGP16 chain MDP: N=40, eps=0.1; 20 runs")


FIGURES: dict[str, Callable[[], Any]] = {
    "lines (theory_prop10)": lines,
    "curves (fig2_curves, fig2_replay_sgd_curves)": curves,
    "utility": utility,
    "utility_chain": chain,
    "bgp16": bgp16,
}


@pytest.fixture(params=list(FIGURES))
def figure(request: pytest.FixtureRequest) -> Iterator[Any]:
    fig = FIGURES[request.param]()
    yield fig
    plt.close(fig)


def test_titles_fit_and_one_legend_lies_below_the_panels(figure: Any) -> None:
    assert_texts_inside(figure)
    assert not [ax for ax in figure.axes if ax.get_legend() is not None]
    (legend,) = figure.legends
    assert len({t.get_text() for t in legend.get_texts()}) == len(legend.get_texts())
    assert_legends_off_the_data(figure)


def test_a_long_title_wraps() -> None:
    fig = lines()
    try:
        title = fig.axes[0].get_title()
        assert "\n" in title and " ".join(title.split()) == " ".join(LONG.split())
    finally:
        plt.close(fig)


def test_plot_writes_the_figure(tmp_path: Path) -> None:
    xs = [1.0, 2.0]
    path = plotting.plot_lines(
        {"a": (xs, xs)}, tmp_path / "a.png", title="t", xlabel="x", ylabel="y"
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
