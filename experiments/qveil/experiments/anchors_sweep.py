"""``qveil experiments anchors-sweep``: the visitation anchors of 9.4 combined with the other
public levers, CartPole at N = 1e4 users, epsilon 1 (docs/results.md 9.5).

Every combination of :data:`PLAN` runs on the tuning seed (1): the anchor count K and the
k-means source (:func:`qveil.experiments.anchors_lever.anchor_file`), the neighbours k, the
bandwidth h, gamma with T, lambda and beta_j (each a change from configs/cartpole-private.toml
with ``anchors = "file"``). The combination of best private return on seed 1 then runs on the
report seed (0) beside the config, which no choice here ever saw. Measured as
:mod:`qveil.experiments.multid_levers` measures (the accountant's sigma for each row's
gamma, T and lambda; seeded in-process noise of the exact law; common episodes and noise
seeds; bootstrap CIs), R x E = 10 x 20 on seed 1 and 20 x 30 on seed 0 as in 9.4.

Seeds are for experiments only.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from qveil.experiments._util import write_csv
from qveil.experiments.anchors_lever import COLUMNS as AL_COLUMNS
from qveil.experiments.anchors_lever import REPORT_SEED, TUNE_SEED, USERS, anchor_file, line
from qveil.experiments.multid_levers import EPSILON, GRID, Sweep, dataset, load_config, row
from qveil.json_types import JSONMapping, JSONObject
from qveil.kfqi_anchors import read_anchors

__all__ = ["COLUMNS", "PLAN", "last_step_factor", "plan_config", "plot", "run"]

#: Each combination tried on the tuning seed: (K, k-means states, changes from the config with
#: ``anchors = "file"``). ``neighbours`` and ``bandwidth`` are always given.
PLAN: list[tuple[int, int, JSONObject]] = [
    # K and k at the grid config's bandwidth 0.2, with gamma 0.7 / 0.5 / 0.3 (T 15 / 10 / 6)
    (256, 200_000, {"neighbours": 128, "bandwidth": 0.2}),
    (256, 200_000, {"neighbours": 128, "bandwidth": 0.2, "gamma": 0.5, "iterations": 10}),
    (256, 200_000, {"neighbours": 128, "bandwidth": 0.2, "gamma": 0.3, "iterations": 6}),
    (256, 200_000, {"neighbours": 64, "bandwidth": 0.2}),
    (256, 200_000, {"neighbours": 64, "bandwidth": 0.2, "gamma": 0.5, "iterations": 10}),
    (128, 200_000, {"neighbours": 64, "bandwidth": 0.2}),
    (128, 200_000, {"neighbours": 64, "bandwidth": 0.2, "gamma": 0.5, "iterations": 10}),
    (128, 200_000, {"neighbours": 32, "bandwidth": 0.2}),
    (512, 200_000, {"neighbours": 256, "bandwidth": 0.2}),
    (512, 200_000, {"neighbours": 256, "bandwidth": 0.2, "gamma": 0.5, "iterations": 10}),
    # around K 256, k 128 at gamma 0.3: gamma 0.2 and 0.4, lambda 0.5
    (256, 200_000, {"neighbours": 128, "bandwidth": 0.2, "gamma": 0.2, "iterations": 5}),
    (256, 200_000, {"neighbours": 128, "bandwidth": 0.2, "gamma": 0.4, "iterations": 8}),
    (
        256,
        200_000,
        {"neighbours": 128, "bandwidth": 0.2, "gamma": 0.3, "iterations": 6, "lam": 0.5},
    ),
]
COLUMNS = (
    "seed",
    "label",
    "anchor_count",
    "kmeans_states",
    "neighbours",
    "bandwidth",
    "gamma",
    "iterations",
    "lam",
    "beta",
    "anchor_sha256",
    # the scores, as anchors-lever writes them (without its comparison to the config)
    *(c for c in AL_COLUMNS[AL_COLUMNS.index("sigma") :] if c != "fraction_vs_config"),
)


def plan_config(count: int, states: int, changes: JSONMapping, *,
                public_users: int | None = None) -> JSONObject:  # fmt: skip
    """The 6^4-grid config (:data:`qveil.experiments.multid_levers.GRID`) with the visitation
    anchors of K = ``count`` (k-means of
    at most ``states`` public states) and ``changes``."""
    kw = {} if public_users is None else {"public_users": public_users}
    path = anchor_file(count, load_config(**GRID), max_states=states, **kw)
    return load_config(**{**GRID, "anchors": "file", "anchor_file": str(path), **changes})


def last_step_factor(gamma: float, iterations: int) -> float:
    """gamma D_{T-1} / D_T: the largest factor by which a sum-of-squares bound could divide
    sigma, when only the last step's injection is local and a user reaches no anchor at all
    (docs/privacy.md 2.6, "The sum of squares"); D_T of the user relation."""
    return gamma * (1.0 - gamma ** (iterations - 1)) / (1.0 - gamma**iterations)


def label(count: int, states: int, changes: JSONMapping) -> str:
    extra = " ".join(
        f"{k}={'/'.join(f'{x:g}' for x in v) if isinstance(v, list) else v}"
        for k, v in changes.items()
    )
    return f"K={count} states={states} {extra}"


def _row(seed: int, name: str, cfg: JSONObject, sweep: Sweep, count: int, states: int, *,
         releases: int, episodes: int, sigma_factor: float = 1.0) -> JSONObject:  # fmt: skip
    r = row(name, cfg, sweep, seed=seed, epsilon=EPSILON, releases=releases, episodes=episodes,
            sigma_factor=sigma_factor)  # fmt: skip
    is_file = cfg.get("anchors") == "file"
    return {
        **r,
        "anchor_count": count,
        "kmeans_states": states if is_file else "",
        "neighbours": cfg.get("neighbours", "") if is_file else "",
        "anchor_sha256": _sha(cfg) if is_file else "",
    }


def _sha(cfg: JSONMapping) -> str:
    return read_anchors(cfg["anchor_file"]).sha256


def run(*, out: Path, quick: bool = False, **_: object) -> dict[str, Path]:
    """Every combination of :data:`PLAN` on the tuning seed (10 x 20), then the best and the
    config on the report seed (20 x 30). ``--quick``: 200 private and 300 public users, K 16,
    two combinations, seed 0 only, 2 x 2 (seconds)."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    def say(text: str) -> None:
        print(f"anchors-sweep [{time.perf_counter() - t0:.0f} s] {text}", flush=True)

    public: int | None
    if quick:
        users, public = 200, 300
        plan = [(16, 200_000, {"neighbours": 8, "bandwidth": 0.2}),
                (16, 200_000, {"neighbours": 8, "bandwidth": 0.2, "gamma": 0.5,
                               "iterations": 10})]  # fmt: skip
        tune, report = (REPORT_SEED, 2, 2), (REPORT_SEED, 2, 2)
    else:
        users, public, plan = USERS, None, PLAN
        tune, report = (TUNE_SEED, 10, 20), (REPORT_SEED, 20, 30)
    rows: list[JSONObject] = []
    seed, rel, eps = tune
    sweep = Sweep(dataset(users, seed), progress=say)
    kw = {"releases": rel, "episodes": eps}
    rows.append(_row(seed, "config (6^4 grid)", load_config(**GRID), sweep, 1296, 0, **kw))
    say(line(rows[-1], 60))
    for count, states, ch in plan:
        cfg = plan_config(count, states, ch, public_users=public)
        rows.append(_row(seed, label(count, states, ch), cfg, sweep, count, states, **kw))
        say(line(rows[-1], 60))
    best = max(range(len(plan)), key=lambda i: rows[i + 1]["private"])
    seed, rel, eps = report
    sweep = Sweep(dataset(users, seed), progress=say)
    kw = {"releases": rel, "episodes": eps}
    rows.append(_row(seed, "config (6^4 grid)", load_config(**GRID), sweep, 1296, 0, **kw))
    say(line(rows[-1], 60))
    count, states, ch = plan[best]
    cfg = plan_config(count, states, ch, public_users=public)
    rows.append(_row(seed, label(count, states, ch), cfg, sweep, count, states, **kw))
    say(line(rows[-1], 60))
    # the sum-of-squares lever's best case (docs/privacy.md 2.6): not a release
    for name, c, k in (("config (6^4 grid)", load_config(**GRID), 1296),
                       (label(count, states, ch), cfg, count)):  # fmt: skip
        f = last_step_factor(float(c["gamma"]), int(c["iterations"]))
        rows.append(_row(seed, f"{name}, sigma x {f:.2f} (upper bound, not a release)", c,
                         sweep, k, states if c is cfg else 0, sigma_factor=f, **kw))  # fmt: skip
        say(line(rows[-1], 60))
    paths = {"csv": write_csv(out / "anchors_sweep.csv", rows, COLUMNS)}
    paths["png"] = plot(rows, out / "anchors_sweep.png")
    return paths


def _short(label: str) -> str:
    """A row's label for a plot axis."""
    for a, b in (
        (" states=200000", ""),
        (" bandwidth=0.2", ""),
        ("neighbours=", "k="),
        ("iterations=", "T="),
        ("(upper bound, not a release)", "(bound, no release)"),
    ):
        label = label.replace(a, b)
    return label


def plot(rows: list[JSONObject], path: Path) -> Path:
    """Private return (95% CI) and the non-private fit of every row, one panel per
    collection seed (tuning, then report), one row per combination."""
    # matplotlib loads only when a plot is drawn (a heavy import)
    import matplotlib.pyplot as plt

    # here, not at the top: loads matplotlib only when this runs
    from qveil.experiments.plotting import legend_below, save

    seeds = sorted({int(r["seed"]) for r in rows}, key=lambda s: s != TUNE_SEED)
    sizes = [sum(int(r["seed"]) == s for r in rows) for s in seeds]
    fig, axes = plt.subplots(
        len(seeds), 1, figsize=(8.5, 0.32 * sum(sizes) + 2.2), squeeze=False,
        gridspec_kw={"height_ratios": sizes}, layout="constrained",
    )  # fmt: skip
    for ax, seed in zip(axes[:, 0], seeds, strict=True):
        rs = [r for r in rows if int(r["seed"]) == seed]
        y = np.arange(len(rs))[::-1]
        p = np.array([float(r["private"]) for r in rs])
        lo = p - np.array([float(r["private_lo"]) for r in rs])
        hi = np.array([float(r["private_hi"]) for r in rs]) - p
        ax.errorbar(p, y, xerr=np.stack([lo, hi]), fmt="o", capsize=3,
                    label="private, epsilon 1 (95% CI)")  # fmt: skip
        ax.plot([float(r["non_private"]) for r in rs], y, "k|", ms=10, label="non-private")
        ax.plot([float(r["random"]) for r in rs], y, "kx", ms=5, label="random")
        ax.set_yticks(y, [_short(str(r["label"])) for r in rs], fontsize=7)
        ax.set_xlim(0, 520)
        ax.grid(axis="x", alpha=0.3)
        ax.set_title(f"collection seed {seed} ({'tuning' if seed == TUNE_SEED else 'report'})",
                     fontsize=9)  # fmt: skip
    axes[-1, 0].set_xlabel("return (CartPole-v1, max 500), 1e4 users")
    fig.suptitle("Visitation anchors with gamma, T, lambda, K and k: CartPole-v1, epsilon 1",
                 fontsize=10)  # fmt: skip
    legend_below(fig, axes[:, 0])
    return save(fig, path)
