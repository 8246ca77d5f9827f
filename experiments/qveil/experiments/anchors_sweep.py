"""``qveil experiments anchors-sweep [--env ENV] [--config FILE]``: the visitation anchors
of 9.4 combined with the other public levers at N = 1e4 users, epsilon 1: CartPole-v1
(docs/results.md 9.5, the default) and LunarLander-v3 (9.6).

Each environment has a :class:`Target`: a reference config (``--config`` replaces it; its
``env_id`` names the environment) and a plan. Every combination of the plan runs on the
tuning seed (1): the anchor count K and the k-means source
(:func:`qveil.experiments.anchors_lever.anchor_file`, public simulated users of the same
env, collection seed 100), the neighbours k, the bandwidth h, gamma with T (and the
default value with them, where the plan says so), lambda and beta_j (each a change from the
reference, with ``anchors = "file"`` where a K is given). The combination of best private
return on seed 1 (the first of equals) then runs on the report seed (0) beside the
reference, which no choice here ever saw. Measured as :mod:`qveil.experiments.multid_levers`
measures (the accountant's sigma for each row's gamma, T and lambda; seeded in-process
noise of the exact law; common episodes and noise seeds; bootstrap CIs), R x E = 10 x 20 on
seed 1 and 20 x 30 on seed 0 as in 9.4.

Seeds are for experiments only.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qveil.experiments._util import write_csv
from qveil.experiments.anchors_lever import COLUMNS as AL_COLUMNS
from qveil.experiments.anchors_lever import (
    PUBLIC_USERS,
    REPORT_SEED,
    TUNE_SEED,
    USERS,
    anchor_file,
    line,
)
from qveil.experiments.ceiling import dataset
from qveil.experiments.multid_levers import EPSILON, GRID, Sweep, load_config, row
from qveil.json_types import JSONMapping, JSONObject, JSONValue
from qveil.kfqi_anchors import read_anchors
from qveil.kfqi_config import read_fqi_toml
from qveil.kfqi_spec import q_range

__all__ = [
    "COLUMNS",
    "LUNAR_PLAN",
    "LUNAR_SOBOL",
    "PLAN",
    "TARGETS",
    "Target",
    "last_step_factor",
    "lower_gamma",
    "plan_config",
    "plot",
    "run",
]

#: One combination: (K of the visitation anchors, or None for the reference's own anchors;
#: at most this many public states in the k-means; changes from the reference config).
Combo = tuple[int | None, int, JSONObject]

#: CartPole's combinations, tried on the tuning seed: (K, k-means states, changes from the
#: grid config with ``anchors = "file"``). ``neighbours`` and ``bandwidth`` are always given.
PLAN: list[Combo] = [
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

#: configs/lunarlander-sobol.toml, the LunarLander config of sections 8.2, 9, 9.1 and 9.2
#: (4096 Sobol anchors, gamma 0.5, T 10, default -200): the reference, pinned so this sweep's
#: reference stays reproducible whatever the config files become.
LUNAR_SOBOL: JSONObject = {
    "mode": "fqi",
    "estimator": "kernel",
    "env_id": "LunarLander-v3",
    "state_intervals": [
        [-0.9, 0.9],
        [-0.1, 1.7],
        [-1.5, 1.5],
        [-1.6, 0.4],
        [-1.6, 1.4],
        [-1.1, 1.0],
        [0.0, 1.0],
        [0.0, 1.0],
    ],  # fmt: skip
    "reward_range": [-100.0, 100.0],
    "neighbour": "user",
    "gamma": 0.5,
    "iterations": 10,
    "anchors": "sobol",
    "anchor_count": 4096,
    "neighbours": 32,
    "bandwidth": 0.25,
    "kernel_radius": 2.0,
    "inducing_points": 11,
    "lam": 0.2,
    "betas": [4.0] * 8,
    "default_value": -200.0,
    "epsilon": 1.0,
    "delta": 1e-5,
}


def lower_gamma(gamma: float, iterations: int, reward_range: tuple[float, float]) -> JSONObject:
    """gamma and T with the default at the pessimistic end of their Q range
    [min(lo, 0), max(hi, 0)] / (1 - gamma) (the rule of LunarLander's config: -200 at 0.5)."""
    return {
        "gamma": gamma,
        "iterations": iterations,
        "default_value": q_range(reward_range, gamma)[0],
    }


_LL = (-100.0, 100.0)
#: LunarLander's combinations, tried on the tuning seed: gamma below 0.5 (the default at its
#: pessimistic end) on the Sobol anchors, and the visitation anchors of 9.2's probe (K 1024,
#: k 128: the pair that kept the non-private fit at 2000 users) with the same gammas.
LUNAR_PLAN: list[Combo] = [
    (None, 0, lower_gamma(0.3, 6, _LL)),
    (None, 0, lower_gamma(0.2, 5, _LL)),
    (1024, 200_000, {"neighbours": 128}),
    (1024, 200_000, {"neighbours": 128, **lower_gamma(0.3, 6, _LL)}),
    (1024, 200_000, {"neighbours": 128, **lower_gamma(0.2, 5, _LL)}),
    # around the best of them (K 1024, k 128, gamma 0.2), added after they ran (seed 1 only):
    # gamma 0.1; beta_j 16 and 64 (rougher noise, free for privacy); lambda 0.5; k 64;
    (1024, 200_000, {"neighbours": 128, **lower_gamma(0.1, 4, _LL)}),
    (1024, 200_000, {"neighbours": 128, **lower_gamma(0.2, 5, _LL), "betas": [16.0] * 8}),
    (1024, 200_000, {"neighbours": 128, **lower_gamma(0.2, 5, _LL), "betas": [64.0] * 8}),
    (1024, 200_000, {"neighbours": 128, **lower_gamma(0.2, 5, _LL), "lam": 0.5}),
    (1024, 200_000, {"neighbours": 64, **lower_gamma(0.2, 5, _LL)}),
    # the two best of those together
    (1024, 200_000, {"neighbours": 128, **lower_gamma(0.1, 4, _LL), "betas": [16.0] * 8}),
]


@dataclass(frozen=True)
class Target:
    """One environment's sweep: the reference config (the first row on each seed; the
    plan's changes apply to it), its label, the plan, the private and public users, and the
    tuning and report (seed, releases, episodes)."""

    env_id: str
    reference: Callable[[], JSONObject]
    reference_label: str
    plan: list[Combo]
    users: int = USERS
    public_users: int = PUBLIC_USERS
    tune: tuple[int, int, int] = (TUNE_SEED, 10, 20)
    report: tuple[int, int, int] = (REPORT_SEED, 20, 30)
    bound_rows: bool = False
    """The sum-of-squares lever's best case (sigma x gamma D_{T-1} / D_T) on the report
    seed: not releases."""
    max_return: float | None = None
    """The plot's right end (None: the data's)."""


#: The environments with a plan (``--env``).
TARGETS: dict[str, Target] = {
    "CartPole-v1": Target(
        "CartPole-v1",
        lambda: load_config(**GRID),
        "config (6^4 grid)",
        PLAN,
        bound_rows=True,
        max_return=520.0,
    ),  # fmt: skip
    # public users: 2000 (185038 states, all in the k-means), as 9.2's probe
    "LunarLander-v3": Target(
        "LunarLander-v3",
        lambda: dict(LUNAR_SOBOL),
        "Sobol 4096 (9.2)",
        LUNAR_PLAN,
        public_users=2000,
    ),  # fmt: skip
}
COLUMNS = (
    "env",
    "users",
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
    "default_value",
    "anchor_sha256",
    # the scores, as anchors-lever writes them (without its comparison to the config)
    *(c for c in AL_COLUMNS[AL_COLUMNS.index("sigma") :] if c != "fraction_vs_config"),
)


def plan_config(count: int | None, states: int, changes: JSONMapping, *,
                public_users: int | None = None, base: JSONMapping | None = None,
                env_id: str = "CartPole-v1") -> JSONObject:  # fmt: skip
    """``base`` (default: the 6^4-grid config,
    :data:`qveil.experiments.multid_levers.GRID`) with ``changes`` and, for a ``count``, the
    visitation anchors of K = ``count`` (k-means of at most ``states`` public states of
    ``env_id``)."""
    ref = dict(base) if base is not None else load_config(**GRID)
    if count is None:
        return {**ref, **changes}
    path = anchor_file(
        count,
        ref,
        max_states=states,
        env_id=env_id,
        public_users=PUBLIC_USERS if public_users is None else public_users,
    )
    return {**ref, "anchors": "file", "anchor_file": str(path), **changes}


def last_step_factor(gamma: float, iterations: int) -> float:
    """gamma D_{T-1} / D_T: the largest factor by which a sum-of-squares bound could divide
    sigma, when only the last step's injection is local and a user reaches no anchor at all
    (docs/privacy.md 2.6, "The sum of squares"); D_T of the user relation."""
    return gamma * (1.0 - gamma ** (iterations - 1)) / (1.0 - gamma**iterations)


def label(count: int | None, states: int, changes: JSONMapping) -> str:
    extra = " ".join(
        f"{k}={'/'.join(f'{x:g}' for x in v) if isinstance(v, list) else _num(v)}"
        for k, v in changes.items()
    )
    where = "reference anchors" if count is None else f"K={count} states={states}"
    return f"{where} {extra}".strip()


def _num(v: JSONValue) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _row(seed: int, name: str, cfg: JSONObject, sweep: Sweep, count: int, states: int,
         env_id: str, *, releases: int, episodes: int,
         sigma_factor: float = 1.0) -> JSONObject:  # fmt: skip
    r = row(name, cfg, sweep, seed=seed, epsilon=EPSILON, env_id=env_id, releases=releases,
            episodes=episodes, sigma_factor=sigma_factor)  # fmt: skip
    is_file = cfg.get("anchors") == "file"
    return {
        **r,
        "env": env_id,
        "anchor_count": count,
        "kmeans_states": states if is_file else "",
        "neighbours": cfg.get("neighbours", "") if cfg.get("anchors") != "grid" else "",
        "anchor_sha256": _sha(cfg) if is_file else "",
    }


def _sha(cfg: JSONMapping) -> str:
    return read_anchors(cfg["anchor_file"]).sha256


def _reference_count(cfg: JSONMapping) -> int:
    """K of the reference's own anchors."""
    if cfg.get("anchors") == "file":
        return int(len(read_anchors(cfg["anchor_file"]).points))
    if cfg.get("anchors") == "sobol":
        return int(cfg["anchor_count"])
    return int(int(cfg.get("anchor_points", 6)) ** len(cfg["betas"]))


def run(*, out: Path, quick: bool = False, env: str | None = None, config: Path | None = None,
        **_: object) -> dict[str, Path]:  # fmt: skip
    """Every combination of the target's plan on the tuning seed (10 x 20), then the best
    and the reference on the report seed (20 x 30). ``env``: the target (default CartPole-v1,
    or ``config``'s env_id); ``config``: a reference config file instead of the target's.
    ``--quick``: 200 private and 300 public users, K 16, two combinations, seed 0 only, 2 x 2
    (seconds)."""
    target = TARGETS[env or "CartPole-v1"]
    ref = target.reference()
    ref_label = target.reference_label
    if config is not None:
        ref = read_fqi_toml(config)
        target = TARGETS[env or str(ref.get("env_id"))]
        if ref.get("env_id") != target.env_id:
            raise ValueError(f"{config} is a config of {ref.get('env_id')}, not {target.env_id}")
        ref_label = f"reference ({config.name})"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    def say(text: str) -> None:
        print(f"anchors-sweep [{time.perf_counter() - t0:.0f} s] {text}", flush=True)

    plan: list[Combo]
    if quick:
        users, public = 200, 300
        gamma_t = {"gamma": 0.5, "iterations": 10}
        if target.env_id != "CartPole-v1":
            rr = tuple(ref["reward_range"])
            gamma_t = lower_gamma(0.3, 6, (float(rr[0]), float(rr[1])))
        plan = [(16, 200_000, {"neighbours": 8, "bandwidth": 0.2}),
                (16, 200_000, {"neighbours": 8, "bandwidth": 0.2, **gamma_t})]  # fmt: skip
        tune, report = (REPORT_SEED, 2, 2), (REPORT_SEED, 2, 2)
    else:
        users, public, plan = target.users, target.public_users, target.plan
        tune, report = target.tune, target.report
    env_id = target.env_id
    ref_k = _reference_count(ref)

    def config_of(combo: Combo) -> JSONObject:
        count, states, ch = combo
        return plan_config(count, states, ch, public_users=public, base=ref, env_id=env_id)

    def one(seed: int, name: str, cfg: JSONObject, sweep: Sweep, combo: Combo | None,
            sigma_factor: float = 1.0) -> JSONObject:  # fmt: skip
        count, states = ref_k, 0
        if combo is not None and combo[0] is not None:
            count, states = combo[0], combo[1]
        r = _row(seed, name, cfg, sweep, count, states, env_id, releases=rel, episodes=eps,
                 sigma_factor=sigma_factor)  # fmt: skip
        say(line(r, 60))
        return r

    rows: list[JSONObject] = []
    seed, rel, eps = tune
    sweep = Sweep(dataset(env_id, users, seed), progress=say)
    rows.append(one(seed, ref_label, ref, sweep, None))
    for combo in plan:
        rows.append(one(seed, label(*combo), config_of(combo), sweep, combo))
    best = max(range(len(plan)), key=lambda i: rows[i + 1]["private"])
    say(f"the pick (best private return on seed {seed}): {label(*plan[best])}")
    del sweep
    seed, rel, eps = report
    sweep = Sweep(dataset(env_id, users, seed), progress=say)
    rows.append(one(seed, ref_label, ref, sweep, None))
    cfg = config_of(plan[best])
    rows.append(one(seed, label(*plan[best]), cfg, sweep, plan[best]))
    if target.bound_rows:
        # the sum-of-squares lever's best case (docs/privacy.md 2.6): not a release
        for name, c, which in ((ref_label, ref, None), (label(*plan[best]), cfg, plan[best])):
            f = last_step_factor(float(c["gamma"]), int(c["iterations"]))
            rows.append(one(seed, f"{name}, sigma x {f:.2f} (upper bound, not a release)", c,
                            sweep, which, sigma_factor=f))  # fmt: skip
    paths = {"csv": write_csv(out / "anchors_sweep.csv", rows, COLUMNS)}
    paths["png"] = plot(rows, out / "anchors_sweep.png", max_return=target.max_return)
    return paths


def _short(label: str) -> str:
    """A row's label for a plot axis."""
    for a, b in (
        (" states=200000", ""),
        (" bandwidth=0.2", ""),
        ("neighbours=", "k="),
        ("iterations=", "T="),
        ("default_value=", "default="),
        ("(upper bound, not a release)", "(bound, no release)"),
    ):
        label = label.replace(a, b)
    # betas=v/v/.../v (one value for every coordinate) -> betas=v
    return re.sub(r"betas=([^/ ]+)(?:/\1)+(?=[ ,]|$)", r"betas=\1", label)


def plot(rows: list[JSONObject], path: Path, *, max_return: float | None = 520.0) -> Path:
    """Private return (95% CI) and the non-private fit of every row, one panel per
    collection seed (tuning, then report), one row per combination; the x axis from 0 to
    ``max_return`` (None: the data's range)."""
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
        if max_return is not None:
            ax.set_xlim(0, max_return)
        ax.grid(axis="x", alpha=0.3)
        ax.set_title(f"collection seed {seed} ({'tuning' if seed == TUNE_SEED else 'report'})",
                     fontsize=9)  # fmt: skip
    env = str(rows[0].get("env") or "CartPole-v1")
    users = f", {int(rows[0]['users'])} users" if rows[0].get("users") else ""
    cap = ", max 500" if env == "CartPole-v1" else ""
    axes[-1, 0].set_xlabel(f"return ({env}{cap}){users}")
    fig.suptitle(f"Visitation anchors with gamma, T, lambda, K and k: {env}, epsilon 1",
                 fontsize=10)  # fmt: skip
    legend_below(fig, axes[:, 0])
    return save(fig, path)
