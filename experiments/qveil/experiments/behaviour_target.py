"""``qveil experiments behaviour-target``: kernel fqi on data from a public behaviour policy
(MountainCar-v0, the epsilon-greedy energy heuristic), against that behaviour policy's own
return (docs/results.md, "Data from a reasonable behaviour policy").

The private users are N simulated MountainCar-v0 users, one episode each, collected with
``mountaincar-energy`` mixed epsilon-greedy (:mod:`qveil.trainer.behaviour`; epsilon chosen
on public simulation so that about 80 % of episodes reach the goal). Each config of
:data:`PLAN` (changes from configs/mountaincar-private.toml) is fitted on the tuning seed
(1); the config file's own choice then runs on the report seed (0), never used for a choice.
Every row reports, on common episode seeds: the behaviour policy's return (the same
epsilon-greedy heuristic), a uniformly random policy's, the non-private fit's greedy policy
and R private releases (the mean plus seeded additive GP noise at the accountant's sigma for
N, epsilon 1, delta 1e-5, user relation), with bootstrap 95 % intervals.

Anchors of ``anchors = "file"`` come from public simulated visitation only: k-means of the
states of 2000 users of the same public heuristic, collection seed 100.

Seeds are for experiments only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from qveil.experiments._util import write_csv
from qveil.experiments.anchors_lever import anchor_file
from qveil.experiments.ceiling import dataset
from qveil.experiments.multid_levers import Scores, Sweep, bootstrap, score, sigma_for
from qveil.json_types import JSONMapping, JSONObject, JSONValue
from qveil.kfqi_config import read_fqi_toml

if TYPE_CHECKING:
    from qveil.trainer.behaviour import Behaviour

__all__ = ["COLUMNS", "PLAN", "behaviour_returns", "run"]

ENV_ID = "MountainCar-v0"
CONFIG = Path(__file__).resolve().parents[3] / "configs" / "mountaincar-private.toml"
TUNE_SEED = 1
REPORT_SEED = 0
PUBLIC_SEED = 100
PUBLIC_USERS = 2000
USERS = 10_000
EPSILON = 1.0

#: The behaviour policy's epsilons whose goal rates are measured (public simulation).
GOAL_EPSILONS = (0.0, 0.25, 0.3, 0.35, 0.5)

_PESSIMISTIC = {0.5: -2.0, 0.7: -10.0 / 3.0, 0.8: -5.0, 0.9: -10.0, 0.95: -20.0, 0.97: -100.0 / 3.0,
                0.99: -100.0, 0.995: -200.0}  # fmt: skip


def _c(gamma: float = 0.99, **changes: JSONValue) -> JSONObject:
    """A change from the config: gamma with the pessimistic end of its Q range as the
    default value, 12^2 grid anchors (the exploration's start), and ``changes``."""
    return {"gamma": gamma, "default_value": _PESSIMISTIC[gamma], "anchor_points": 12, **changes}


#: Non-private exploration on 1000 users of the tuning seed (label, changes from the config).
EXPLORE: list[tuple[str, JSONObject]] = [
    (
        "default 0 (the Q range's top), T 150, lam 0.2",
        {"iterations": 150, "lam": 0.2, "default_value": 0.0, "anchor_points": 12},
    ),
    (
        "default 0, gamma 0.95, T 100, lam 0.2",
        {"gamma": 0.95, "iterations": 100, "lam": 0.2, "default_value": 0.0, "anchor_points": 12},
    ),
    (
        "default 0, gamma 0.9, T 60, lam 0.2",
        {"gamma": 0.9, "iterations": 60, "lam": 0.2, "default_value": 0.0, "anchor_points": 12},
    ),
    ("T 150, lam 0.2", _c(iterations=150, lam=0.2)),
    (
        "midpoint default, T 150, lam 0.2",
        {"iterations": 150, "lam": 0.2, "default_value": -50.0, "anchor_points": 12},
    ),
    ("gamma 0.95, T 100, lam 0.2", _c(0.95, iterations=100, lam=0.2)),
    ("gamma 0.9, T 60, lam 0.2", _c(0.9, iterations=60, lam=0.2)),
    ("T 150, lam 0.2, betas 2/16", _c(iterations=150, lam=0.2, betas=[2.0, 16.0])),
    ("T 150, lam 0.2, betas 2/64", _c(iterations=150, lam=0.2, betas=[2.0, 64.0])),
    ("T 150, lam 0.2, bandwidth 0.05", _c(iterations=150, lam=0.2, bandwidth=0.05)),
    ("T 150, lam 0.2, 20^2 anchors", _c(iterations=150, lam=0.2, anchor_points=20)),
    ("T 150, lam 0.05", _c(iterations=150, lam=0.05)),
    ("T 150, lam 0.02", _c(iterations=150, lam=0.02)),
    ("T 150, lam 0.005", _c(iterations=150, lam=0.005)),
    ("T 300, lam 0.02", _c(iterations=300, lam=0.02)),
    ("T 60, lam 0.02", _c(iterations=60, lam=0.02)),
    ("T 30, lam 0.02", _c(iterations=30, lam=0.02)),
    ("T 15, lam 0.02", _c(iterations=15, lam=0.02)),
    ("T 150, lam 0.02, bandwidth 0.2", _c(iterations=150, lam=0.02, bandwidth=0.2)),
    ("gamma 0.97, T 150, lam 0.02", _c(0.97, iterations=150, lam=0.02)),
    ("gamma 0.5, T 8, lam 0.02", _c(0.5, iterations=8, lam=0.02)),
]

#: Changes from the config tried on the tuning seed at N = 1e4 with private releases.
PLAN: list[tuple[str, JSONObject]] = [
    ("T 15, lam 0.02", _c(iterations=15, lam=0.02)),
    ("T 30, lam 0.02", _c(iterations=30, lam=0.02)),
    ("T 5, lam 0.02", _c(iterations=5, lam=0.02)),
    ("T 15, lam 0.2", _c(iterations=15, lam=0.2)),
    ("T 150, lam 0.2", _c(iterations=150, lam=0.2)),
    ("gamma 0.9, T 15, lam 0.02", _c(0.9, iterations=15, lam=0.02)),
    ("gamma 0.8, T 15, lam 0.02", _c(0.8, iterations=15, lam=0.02)),
    ("gamma 0.8, T 8, lam 0.02", _c(0.8, iterations=8, lam=0.02)),
    ("gamma 0.8, T 8, lam 0.2", _c(0.8, iterations=8, lam=0.2)),
    ("gamma 0.7, T 6, lam 0.02", _c(0.7, iterations=6, lam=0.02)),
    ("gamma 0.5, T 8, lam 0.02", _c(0.5, iterations=8, lam=0.02)),
    ("gamma 0.5, T 4, lam 0.02", _c(0.5, iterations=4, lam=0.02)),
    ("gamma 0.5, T 4, lam 0.05", _c(0.5, iterations=4, lam=0.05)),
    ("gamma 0.5, T 4, lam 0.2", _c(0.5, iterations=4, lam=0.2)),
    ("gamma 0.5, T 3, lam 0.02", _c(0.5, iterations=3, lam=0.02)),
    ("T 3, lam 0.02", _c(iterations=3, lam=0.02)),
    ("T 5, lam 0.05", _c(iterations=5, lam=0.05)),
    ("T 5, lam 0.2", _c(iterations=5, lam=0.2)),
    ("T 8, lam 0.02", _c(iterations=8, lam=0.02)),
    ("gamma 0.95, T 5, lam 0.02", _c(0.95, iterations=5, lam=0.02)),
    ("gamma 0.995, T 5, lam 0.02", _c(0.995, iterations=5, lam=0.02)),
    ("T 5, lam 0.02, 8^2 anchors", _c(iterations=5, lam=0.02, anchor_points=8)),
    ("T 5, lam 0.02, 16^2 anchors", _c(iterations=5, lam=0.02, anchor_points=16)),
    ("T 5, lam 0.02, bandwidth 0.15", _c(iterations=5, lam=0.02, bandwidth=0.15)),
    ("T 5, lam 0.02, bandwidth 0.07", _c(iterations=5, lam=0.02, bandwidth=0.07)),
    ("T 3, lam 0.05", _c(iterations=3, lam=0.05)),
    ("T 2, lam 0.02", _c(iterations=2, lam=0.02)),
    ("T 1, lam 0.02", _c(iterations=1, lam=0.02)),
    ("T 3, lam 0.02, 8^2 anchors", _c(iterations=3, lam=0.02, anchor_points=8)),
    ("T 3, lam 0.05, 8^2 anchors", _c(iterations=3, lam=0.05, anchor_points=8)),
    ("T 2, lam 0.05", _c(iterations=2, lam=0.05)),
    ("T 2, lam 0.02, 8^2 anchors", _c(iterations=2, lam=0.02, anchor_points=8)),
    ("T 2, lam 0.2", _c(iterations=2, lam=0.2)),
    (
        "T 3, lam 0.02, visitation K 144 k 36",
        _c(iterations=3, lam=0.02, anchors="file", anchor_count=144, neighbours=36),
    ),
    (
        "T 3, lam 0.02, visitation K 144 k 72",
        _c(iterations=3, lam=0.02, anchors="file", anchor_count=144, neighbours=72),
    ),
]

COLUMNS = (
    "seed",
    "label",
    "users",
    "samples",
    "behaviour",
    "behaviour_return",
    "behaviour_lo",
    "behaviour_hi",
    "random",
    "non_private",
    "non_private_lo",
    "non_private_hi",
    "private",
    "private_lo",
    "private_hi",
    "fraction",
    "fraction_lo",
    "fraction_hi",
    "sigma",
    "releases",
    "episodes",
    "gamma",
    "iterations",
    "anchors",
    "anchor_count",
    "neighbours",
    "bandwidth",
    "lam",
    "default_value",
)


def _behaviour(name: str, epsilon: float) -> Behaviour:
    # here, not at the top: the trainer (gymnasium) loads only when this runs
    from qveil.trainer.behaviour import resolve_behaviour

    return resolve_behaviour(name, epsilon)


def behaviour_returns(name: str, epsilon: float, seeds: Sequence[int]) -> np.ndarray:
    """The returns of the epsilon-greedy behaviour policy on episodes ``seeds`` (the env
    reset with the episode seed, the actions drawn from a generator seeded by it)."""
    # here, not at the top: gymnasium loads only when episodes are run
    import gymnasium as gym

    beh = _behaviour(name, epsilon)
    env = gym.make(ENV_ID)
    total = np.zeros(len(seeds))
    try:
        for i, s in enumerate(seeds):
            rng = np.random.default_rng([int(s), 11])
            o = np.asarray(env.reset(seed=int(s))[0], dtype=np.float64)
            while True:
                o2, r, term, trunc, _ = env.step(beh.act(o, rng, 3))
                total[i] += float(r)
                o = np.asarray(o2, dtype=np.float64)
                if term or trunc:
                    break
    finally:
        env.close()
    return total


def load_config(**changes: JSONValue) -> JSONObject:
    cfg = read_fqi_toml(CONFIG)
    cfg.update(changes)
    return cfg


def _ci(x: np.ndarray) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    idx = rng.integers(len(x), size=(2000, len(x)))
    lo, hi = np.percentile(x[idx].mean(axis=1), [2.5, 97.5])
    return float(lo), float(hi)


def measure(
    label: str,
    cfg: JSONObject,
    sweep: Sweep,
    *,
    seed: int,
    releases: int,
    episodes: int,
    behaviour: tuple[str, float],
    private: bool = True,
) -> JSONObject:
    """One row: fit, score (behaviour, random, non-private, private), bootstrap."""
    ds = sweep.ds
    res = sigma_for(cfg, users=int(ds.users), actions=int(ds.n_actions), epsilon=EPSILON)
    fit = sweep.fit(cfg)
    eval_seed = 10_000 + 1000 * seed
    sc = score(
        fit,
        sigma=res.sigma,
        releases=releases if private else 0,
        episodes=episodes,
        eval_seed=eval_seed,
        env_id=ENV_ID,
    )
    if not private:
        sc = Scores(sc.ceiling, sc.floor, np.full((1, episodes), np.nan), res.sigma, math.nan)
    seeds = [eval_seed + e for e in range(episodes)]
    beh = behaviour_returns(*behaviour, seeds)
    b = bootstrap(sc) if private else {}
    blo, bhi = _ci(beh)
    nlo, nhi = _ci(sc.ceiling)
    return {
        "seed": seed,
        "label": label,
        "users": int(ds.users),
        "samples": int(ds.n),
        "behaviour": f"{behaviour[0]} (epsilon {behaviour[1]:g})",
        "behaviour_return": float(beh.mean()),
        "behaviour_lo": blo,
        "behaviour_hi": bhi,
        "random": float(sc.floor.mean()),
        "non_private": float(sc.ceiling.mean()),
        "non_private_lo": nlo,
        "non_private_hi": nhi,
        "private": b.get("private", math.nan),
        "private_lo": b.get("private_lo", math.nan),
        "private_hi": b.get("private_hi", math.nan),
        "fraction": b.get("fraction", math.nan),
        "fraction_lo": b.get("fraction_lo", math.nan),
        "fraction_hi": b.get("fraction_hi", math.nan),
        "sigma": float(res.sigma),
        "releases": releases if private else 0,
        "episodes": episodes,
        "gamma": cfg["gamma"],
        "iterations": cfg["iterations"],
        "anchors": cfg.get("anchors", "grid"),
        "anchor_count": cfg.get("anchor_count"),
        "neighbours": cfg.get("neighbours"),
        "bandwidth": cfg["bandwidth"],
        "lam": cfg["lam"],
        "default_value": cfg.get("default_value"),
    }


def line(r: JSONMapping) -> str:
    return (
        f"seed {r['seed']} {r['label']}: N {r['users']} behaviour {r['behaviour_return']:.1f} "
        f"random {r['random']:.1f} non-private {r['non_private']:.1f} "
        f"[{r['non_private_lo']:.1f}, {r['non_private_hi']:.1f}] private {r['private']:.1f} "
        f"fraction {r['fraction']:.2f} sigma {r['sigma']:.3g}"
    )


def _config(changes: JSONMapping, beh: tuple[str, float]) -> JSONObject:
    """The config with ``changes`` (a ``file`` layout gets its public visitation anchors)."""
    cfg = load_config(**changes)
    if cfg.get("anchors") == "file":
        cfg["anchor_file"] = str(
            anchor_file(
                int(cfg["anchor_count"]),
                cfg,
                public_users=PUBLIC_USERS,
                env_id=ENV_ID,
                behaviour=beh,
            )
        )
    return cfg


def run(
    *,
    out: Path,
    quick: bool = False,
    say: Callable[[str], object] = print,
    **_: object,
) -> dict[str, Path]:
    """Goal rates of the behaviour policy; :data:`EXPLORE` (non-private, 1000 users) and
    :data:`PLAN` (N = 1e4, private) on the tuning seed; the config on the report seed.
    Writes ``behaviour_goal.csv``, ``behaviour_target.csv`` and ``behaviour_target.png``."""
    out.mkdir(parents=True, exist_ok=True)
    base = load_config()
    beh = (str(base["behaviour_policy"]), float(base["behaviour_epsilon"]))
    goal_rows = []
    for e in GOAL_EPSILONS[:2] if quick else GOAL_EPSILONS:
        seeds = [20_000 + 1000 * TUNE_SEED + i for i in range(10 if quick else 400)]
        ret = behaviour_returns(beh[0], e, seeds)
        goal_rows.append(
            {
                "epsilon": e,
                "episodes": len(seeds),
                "goal": float((ret > -200.0).mean()),
                "return": float(ret.mean()),
            }  # fmt: skip
        )
        say(f"behaviour {beh[0]} epsilon {e:g}: goal {goal_rows[-1]['goal']:.3f}, return "
            f"{goal_rows[-1]['return']:.1f}")  # fmt: skip
    users = 50 if quick else USERS
    explore, plan = (EXPLORE[:1], PLAN[:1]) if quick else (EXPLORE, PLAN)
    rows: list[JSONObject] = []
    t0 = time.perf_counter()
    # (what the stage fits on, its seed, its rows, releases per row): the non-private
    # exploration, the tuning sweep, then the report seed on the pick alone
    stages: list[tuple[int, int, list[tuple[str, JSONObject]], int]] = [
        (50 if quick else 1000, TUNE_SEED, explore, 0),
        (users, TUNE_SEED, [("config", {}), *plan], 2 if quick else 10),
        (users, REPORT_SEED, [("config", {})], 2 if quick else 20),
    ]
    for n, seed, plan_rows, releases in stages:
        sweep = Sweep(dataset(ENV_ID, n, seed, behaviour=beh), progress=say)
        for label, changes in plan_rows:
            rows.append(
                measure(
                    label,
                    _config(changes, beh),
                    sweep,
                    seed=seed,
                    releases=releases,
                    episodes=3 if quick else 30,
                    behaviour=beh,
                    private=releases > 0,
                )  # fmt: skip
            )
            say(f"{line(rows[-1])} ({time.perf_counter() - t0:.0f} s)")
    return {
        "goal": write_csv(out / "behaviour_goal.csv", goal_rows),
        "csv": write_csv(out / "behaviour_target.csv", rows, COLUMNS),
        "png": plot(rows, out / "behaviour_target.png"),
    }


def plot(rows: Sequence[JSONMapping], path: Path) -> Path:
    """Non-private and private return of every N = 1e4 row, beside the behaviour policy's
    and the random policy's returns."""
    # matplotlib loads only when a plot is drawn (a heavy import)
    import matplotlib.pyplot as plt

    # here, not at the top: loads matplotlib only when this runs
    from qveil.experiments.plotting import save

    big = [r for r in rows if int(r["releases"]) > 0]
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(big) + 1.8), layout="constrained")
    y = np.arange(len(big))
    labels = [
        r["label"] if int(r["seed"]) == TUNE_SEED else f"REPORT SEED {r['seed']}: {r['label']}"
        for r in big
    ]
    ax.scatter([r["non_private"] for r in big], y, marker="o", color="C0", label="non-private")
    priv = np.array([r["private"] for r in big])
    err = np.array(
        [[p - r["private_lo"], r["private_hi"] - p] for p, r in zip(priv, big, strict=True)]
    ).T
    ax.errorbar(priv, y, xerr=err, fmt="s", color="C3", ms=4, label="private (95% CI)")
    b = float(np.mean([r["behaviour_return"] for r in big]))
    ax.axvline(b, color="C2", ls="--", label=f"behaviour policy ({b:.0f})")
    ax.axvline(-200.0, color="grey", ls=":", label="random (-200)")
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(
        "mean return over 30 episodes (MountainCar-v0, higher is better); rows: tuning seed 1"
    )
    fig.suptitle(
        f"MountainCar-v0: kernel fqi on {big[0]['users'] if big else 0} users of the "
        "epsilon-greedy energy heuristic, epsilon 1"
    )
    # the legend above the panel, under the title: it covers no point
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4, fontsize=8, frameon=False)
    return save(fig, path)
