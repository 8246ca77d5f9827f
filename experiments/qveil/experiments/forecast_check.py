"""The utility forecast (qveil.trainer.forecast) against measured served releases.

For every environment with a public fqi config in configs/ (LineWalk, CartPole, Acrobot,
LunarLander, Reach16, MountainCar) at epsilon 1 and several N, the forecast's fraction of the
way from random to non-private and its 95% interval, beside the fraction measured through the
server on other datasets (docs/results.md: LineWalk section 7, CartPole, Acrobot and Reach16
section 8, LunarLander section 10, MountainCar 9.7). The forecast simulates its own users
(collection seed 1, the tuning seed; the served measurements used report seeds).

Writes forecast.csv and forecast.png under ``out``.
"""

from __future__ import annotations

import time
from pathlib import Path

from qveil.experiments._util import write_table_and_plot
from qveil.experiments.plotting import env_panels, legend_below, save
from qveil.json_types import JSONObject
from qveil.kfqi_config import load_fqi_config

__all__ = ["MEASURED", "run"]

REPO = Path(__file__).resolve().parents[3]

#: Served fractions at epsilon 1 measured through the server (docs/results.md), by (env, N).
#: LineWalk's are (served - random) / (non-private - random) of section 7's returns;
#: CartPole's is the anchors config's (section 8, "with the anchors config").
MEASURED: dict[tuple[str, int], float] = {
    ("CartPole-v1", 10_000): 1.00,
    ("qveil/LineWalk-v0", 300): (20.3 - 11.3) / (20.7 - 11.3),
    ("qveil/LineWalk-v0", 1000): (20.7 - 11.3) / (20.71 - 11.3),
    ("Acrobot-v1", 1000): 0.12,
    ("LunarLander-v3", 2000): -1.65,
    ("LunarLander-v3", 10_000): -3.29,
    ("LunarLander-v3", 30_000): 0.42,  # configs/lunarlander-private.toml (9.6)
    ("qveil/Reach16-v0", 1000): -0.50,
    ("qveil/Reach16-v0", 10_000): -0.54,
    ("MountainCar-v0", 10_000): 0.94,
}
PLAN: list[tuple[str, str, list[int]]] = [
    ("qveil/LineWalk-v0", "linewalk-private.toml", [30, 100, 300, 1000]),
    ("CartPole-v1", "cartpole-private.toml", [10_000]),
    ("Acrobot-v1", "acrobot-private.toml", [1000]),
    ("LunarLander-v3", "lunarlander-sobol.toml", [2000, 10_000]),
    ("LunarLander-v3", "lunarlander-private.toml", [30_000]),
    ("qveil/Reach16-v0", "reach16-private.toml", [1000, 10_000]),
    ("MountainCar-v0", "mountaincar-private.toml", [10_000]),
]
QUICK: list[tuple[str, str, list[int]]] = [
    ("qveil/LineWalk-v0", "linewalk-private.toml", [100, 300]),
]


def run(
    *,
    out: Path,
    quick: bool = False,
    plan: list[tuple[str, str, list[int]]] | None = None,
    **_: object,
) -> dict[str, Path]:
    # the trainer's modules load gymnasium: only when this runs
    from qveil.trainer.forecast import forecast

    out.mkdir(parents=True, exist_ok=True)
    rows: list[JSONObject] = []
    t0 = time.perf_counter()
    for env, config, sizes in plan or (QUICK if quick else PLAN):
        cfg = load_fqi_config(REPO / "configs" / config)
        for n in sizes:
            fc = forecast(cfg, users=n, epsilon=1.0, releases=8, episodes=20)
            rows.append(
                {
                    "env": env,
                    "users": n,
                    "sigma": fc.sigma,
                    "forecast": fc.fraction,
                    "forecast_lo": fc.fraction_lo,
                    "forecast_hi": fc.fraction_hi,
                    "measured_served": MEASURED.get((env, n), float("nan")),
                    "near_random": fc.near_random,
                }
            )
            print(
                f"forecast [{time.perf_counter() - t0:.0f} s] {env} N={n}: "
                f"{fc.fraction:.2f} [{fc.fraction_lo:.2f}, {fc.fraction_hi:.2f}] "
                f"measured {rows[-1]['measured_served']:.2f}",
                flush=True,
            )
    return write_table_and_plot(out, "forecast", rows, _plot)


def _plot(rows: list[JSONObject], path: Path) -> None:

    fig, panels = env_panels(rows)
    for ax, env, rs in panels:
        n = [r["users"] for r in rs]
        f = [r["forecast"] for r in rs]
        lo = [r["forecast"] - r["forecast_lo"] for r in rs]
        hi = [r["forecast_hi"] - r["forecast"] for r in rs]
        ax.errorbar(n, f, yerr=[lo, hi], marker="o", capsize=3, label="forecast (95% CI)")
        ax.plot(n, [r["measured_served"] for r in rs], "s--", label="measured, served")
        ax.set_xscale("log")
        ax.axhline(0.0, color="grey", lw=0.5)
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_title(f"{env}: eps 1")
        ax.set_xlabel("users N")
        ax.set_ylabel("fraction of the way from random to non-private")
    legend_below(fig, [ax for ax, _, _ in panels])
    save(fig, path)
