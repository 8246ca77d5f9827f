"""``qveil experiments multid-levers``: which public lever moves CartPole's private kernel fqi
release at epsilon = 1 (utility target; docs/results.md section 8.1), in process.

The measurement, built to be trusted at a fixed N (at most 1e5 users):

* **common random numbers.** The non-private estimator (the ceiling), the uniformly random
  policy (the floor) and every private release are scored on the *same* E episode seeds,
  and release r of every configuration uses the same noise seed (so a lever's effect is
  not hidden by different episodes or different noise draws);
* **many releases.** R independent releases (noise draws), each scored on all E episodes:
  an (R, E) table of returns per configuration;
* **a bootstrap CI.** Releases and episodes are resampled (paired: the ceiling and floor are
  resampled with the same episodes) for the fraction
  (private - random) / (non-private - random) and for the private return;
* **sigma from the accountant.** :func:`qveil.privacy.kfqi.calibrate_kernel_fqi` with the
  run's real parameters (users, actions, gamma, T, lam, ...) for every row.

Levers are public: tuning uses simulated datasets of a *different* collection seed
(``TUNE_SEED``) from the ones reported (``REPORT_SEEDS``). The expensive FQI operators
(:func:`qveil.kfqi.build_operators_nd`) depend only on the anchors, bandwidth, radius,
relation and state intervals, so gamma, T, the default, lam, beta_j and M reuse them; the
KRR map depends only on (beta_j, M, lam). Datasets are cached as npz files in
``QVEIL_LEVERS_CACHE`` (default /tmp/levers-data), never in the repository.

Seeds are for experiments only.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import numpy as np

from qveil.additive import AdditiveSamplePath, StateBox
from qveil.dataset import Dataset, load_npz, save_npz
from qveil.experiments._util import write_csv
from qveil.json_types import JSONObject, JSONValue
from qveil.kfqi import (
    Anchors,
    KernelFQIOperators,
    KernelFQISpec,
    additive_mean,
    build_operators_nd,
    inducing_grid,
    iterate_q_nd,
    krr_operator,
)
from qveil.kfqi_config import KernelFQIConfig, read_fqi_toml
from qveil.privacy.fqi import FQIPrivacyResult
from qveil.privacy.kfqi import KernelFQIPrivacyParams, calibrate_kernel_fqi

__all__ = [
    "BEFORE",
    "GRID",
    "COLUMNS",
    "LEVERS",
    "Scores",
    "Sweep",
    "bootstrap",
    "episodes_rows",
    "run",
    "score",
]

ENV_ID = "CartPole-v1"
CONFIG = Path(__file__).resolve().parents[3] / "configs" / "cartpole-private.toml"
DELTA = 1e-5
EPSILON = 1.0
TUNE_SEED = 1
REPORT_SEEDS = (0, 2)
#: The configuration on main before this sweep (configs/cartpole-private.toml
#: before the levers): the row every lever is compared with.
BEFORE: JSONObject = {
    "state_intervals": [[-0.3, 0.3], [-1.5, 1.5], [-0.2095, 0.2095], [-2.0, 2.0]],
    "reward_range": [0.0, 1.0],
    "neighbour": "user",
    "gamma": 0.7,
    "iterations": 15,
    "anchor_points": 6,
    "bandwidth": 0.2,
    "kernel_radius": 2.0,
    "inducing_points": 11,
    "lam": 0.2,
    "betas": [2.0, 2.0, 2.0, 2.0],
    "default_value": 0.0,
}
#: The 6^4-grid configuration chosen by this sweep (configs/cartpole-private.toml of sections
#: 8, 8.1, 9, 9.1, 9.3 and 9.4, before the visitation anchors of 9.5): the changes that turn
#: the config file into it, so those sections' rows stay reproducible.
GRID: JSONObject = {
    **BEFORE,
    "betas": [1024.0, 1024.0, 4.0, 4.0],
    "anchors": "grid",
    "anchor_file": None,
    "anchor_count": 4096,
    "neighbours": 16,
}
#: One-at-a-time changes from the chosen config (configs/cartpole-private.toml):
#: (lever, value, changes). KRR-only levers first, then the FQI iteration, then the
#: operators (each a new build). "before" is the beta lever at beta_j = 2 for all j.
LEVERS: list[tuple[str, float, JSONObject]] = [
    *[("lam", v, {"lam": v}) for v in (0.05, 0.1, 0.5, 1.0, 2.0)],
    *[("beta_x", v, {"betas": [v, v, 4.0, 4.0]}) for v in (4.0, 64.0, 256.0, 4096.0)],
    *[("beta_theta", v, {"betas": [1024.0, 1024.0, v, v]}) for v in (2.0, 8.0)],
    ("inducing_points", 6, {"inducing_points": 6}),
    *[
        ("gamma", g, {"gamma": g, "iterations": t})
        for g, t in ((0.5, 10), (0.6, 12), (0.8, 20), (0.9, 30))
    ],
    ("iterations", 8, {"iterations": 8}),
    ("default_value", float("nan"), {"default_value": None}),
    ("bandwidth", 0.15, {"bandwidth": 0.15}),
    ("anchor_points", 5, {"anchor_points": 5}),
]
COLUMNS = (
    "label",
    "lever",
    "value",
    "seed",
    "users",
    "samples",
    "epsilon",
    "sigma",
    "noise_to_value",
    "releases",
    "episodes",
    "private",
    "private_lo",
    "private_hi",
    "non_private",
    "random",
    "fraction",
    "fraction_lo",
    "fraction_hi",
    "release_min",
    "release_max",
    "gamma",
    "iterations",
    "lam",
    "beta",
    "inducing_points",
    "anchor_points",
    "bandwidth",
    "default_value",
)


def cache_dir() -> Path:
    return Path(os.environ.get("QVEIL_LEVERS_CACHE", "/tmp/levers-data"))


def load_config(**changes: JSONValue) -> JSONObject:
    """configs/cartpole-private.toml as a dict with ``changes`` applied (None values kept:
    a key set to None means "the spec's default", e.g. the midpoint default value)."""
    cfg = read_fqi_toml(CONFIG)
    cfg.update(changes)
    return cfg


def dataset(
    users: int, seed: int, *, episodes_per_user: int = 1, cache: Path | None = None
) -> Dataset:
    """N random-policy CartPole users (qveil.trainer.collect), cached as npz."""
    # here, not at the top: loads gymnasium only when this runs
    from qveil.trainer.collect import collect

    root = cache if cache is not None else cache_dir()
    k = "" if episodes_per_user == 1 else f"-k{episodes_per_user}"
    path = root / f"{ENV_ID}-{users}-s{seed}{k}.npz"
    if path.exists():
        return load_npz(path)
    ds = collect(ENV_ID, users, seed, episodes_per_user, reward_range=(0.0, 1.0))
    root.mkdir(parents=True, exist_ok=True)
    save_npz(ds, path)
    return ds


def _spec(cfg: JSONObject) -> KernelFQISpec:
    """The estimator's :class:`qveil.kfqi.KernelFQISpec` (through the config's own type)."""
    return KernelFQIConfig.from_dict(cfg).spec(len(cfg["betas"]))


def sigma_for(cfg: JSONObject, *, users: int, actions: int, epsilon: float) -> FQIPrivacyResult:
    """The accountant's calibration (qveil.privacy.kfqi.calibrate_kernel_fqi) for ``cfg``."""
    anchor_points = KernelFQIConfig.from_dict(cfg).anchor_points  # the spec's default if unset
    p = KernelFQIPrivacyParams(
        neighbour=cfg["neighbour"],
        users=users,
        reward_range=tuple(cfg["reward_range"]),
        gamma=cfg["gamma"],
        iterations=cfg["iterations"],
        actions=actions,
        dims=len(cfg["betas"]),
        betas=tuple(cfg["betas"]),
        lam=cfg["lam"],
        anchor_points=anchor_points,
        inducing_points=cfg["inducing_points"],
        delta=DELTA,
    )
    return calibrate_kernel_fqi(p, epsilon=epsilon)


@dataclass(frozen=True)
class Fitted:
    """A released mean function (no noise): the additive coefficients per action."""

    alpha: np.ndarray
    centre: float
    inducing: np.ndarray
    betas: tuple[float, ...]
    box: StateBox

    def values(self, obs: np.ndarray) -> np.ndarray:
        """(n, m) mean values at raw observations (n, d)."""
        out: np.ndarray = additive_mean(
            self.box.to_unit(obs),
            alpha=self.alpha,
            centre=self.centre,
            inducing=self.inducing,
            betas=self.betas,
        )
        return out


class Sweep:
    """Fits configurations on one dataset, re-using the FQI operators and KRR maps."""

    def __init__(self, ds: Dataset, *, progress: Callable[[str], object] = print) -> None:
        self.ds = ds
        self._ops: dict[tuple[Hashable, ...], KernelFQIOperators] = {}
        self._krr: dict[tuple[Hashable, ...], np.ndarray] = {}
        self._progress = progress

    def fit(self, cfg: JSONObject, *, prior: np.ndarray | None = None) -> Fitted:
        """``cfg``'s released mean on the sweep's dataset (uncovered users vote the public
        ``prior`` (K, m) when given, else the config's default)."""
        spec = _spec(cfg)
        box = StateBox.of(cfg["state_intervals"])
        rr = (float(cfg["reward_range"][0]), float(cfg["reward_range"][1]))
        key = (
            tuple(map(tuple, cfg["state_intervals"])),
            rr,
            spec.anchor_points,
            spec.anchors,
            spec.anchor_count,
            spec.anchor_sha256,
            spec.neighbours,
            spec.bandwidth,
            spec.kernel_radius,
            spec.neighbour,
        )
        if key not in self._ops:
            t0 = time.perf_counter()
            ds = self.ds
            self._ops[key] = build_operators_nd(
                ds.transitions,
                n_actions=int(ds.n_actions),
                reward_range=rr,
                box=box,
                spec=spec,
            )
            self._progress(
                f"  operators {spec.anchors} K={spec.anchor_total} h={spec.bandwidth:g} built in "
                f"{time.perf_counter() - t0:.0f} s"
            )
        q = iterate_q_nd(self._ops[key], spec=spec, prior=prior)
        kk = (key[2:6], spec.betas, spec.inducing_points, spec.lam)
        if kk not in self._krr:
            self._krr[kk] = krr_operator(
                Anchors(spec).points,
                betas=spec.betas,
                inducing_points=spec.inducing_points,
                lam=spec.lam,
            )
        c0 = spec.default_value(rr)
        m = int(self.ds.n_actions)
        alpha = (self._krr[kk] @ (q - c0)).T.reshape(m, spec.dims, spec.inducing_points)
        return Fitted(
            alpha=alpha,
            centre=c0,
            inducing=inducing_grid(spec.inducing_points),
            betas=spec.betas,
            box=box,
        )


def _lockstep(
    policy: Callable[[np.ndarray], np.ndarray], seeds: Sequence[int], env_id: str = ENV_ID
) -> np.ndarray:
    """Returns of one episode per seed, run side by side (qveil.trainer.forecast.lockstep)."""
    # here, not at the top: loads gymnasium only when this runs
    from qveil.trainer.forecast import lockstep

    return lockstep(env_id, policy, seeds)


@dataclass(frozen=True)
class Scores:
    """Returns on common episodes: ceiling (E,), floor (E,), private (R, E)."""

    ceiling: np.ndarray
    floor: np.ndarray
    private: np.ndarray
    sigma: float
    noise_to_value: float


def score(
    fit: Fitted,
    *,
    sigma: float,
    noise_to_value: float = float("nan"),
    releases: int,
    episodes: int,
    eval_seed: int = 10_000,
    noise_seed: int = 0,
    with_baselines: bool = True,
    env_id: str = ENV_ID,
) -> Scores:
    """Ceiling, floor and R private releases (mean + additive GP noise of this sigma, one
    seeded :class:`qveil.additive.AdditiveSamplePath` per action, queried lazily at the
    visited states) on the same E episode seeds ``eval_seed + e``."""
    seeds = [eval_seed + e for e in range(episodes)]
    m = fit.alpha.shape[0]
    if with_baselines:
        ceiling = _lockstep(lambda o: np.argmax(fit.values(o), axis=1), seeds, env_id)
        rng = np.random.default_rng([eval_seed, 7])
        floor = _lockstep(lambda o: rng.integers(m, size=len(o)), seeds, env_id)
    else:
        ceiling = floor = np.full(episodes, np.nan)
    private = np.zeros((releases, episodes))
    for r in range(releases):
        paths = [
            AdditiveSamplePath(
                betas=fit.betas, sigma=sigma, rng=np.random.default_rng([noise_seed, r, a])
            )
            for a in range(m)
        ]

        def noisy(o: np.ndarray, paths: list[AdditiveSamplePath] = paths) -> np.ndarray:
            x = fit.box.to_unit(o)
            g = np.stack([p.sample(x) for p in paths], axis=1)
            best: np.ndarray = np.argmax(fit.values(o) + g, axis=1)
            return best

        private[r] = _lockstep(noisy, seeds, env_id)
    return Scores(
        ceiling=ceiling, floor=floor, private=private, sigma=sigma, noise_to_value=noise_to_value
    )


def bootstrap(s: Scores, *, draws: int = 2000, seed: int = 0) -> dict[str, float]:
    """Point estimates and 95% percentile intervals, resampling releases and (paired)
    episodes: the private return and the fraction (private - random) / (ceiling - random)."""
    rng = np.random.default_rng(seed)
    r, e = s.private.shape
    ri = rng.integers(r, size=(draws, r))
    ei = rng.integers(e, size=(draws, e))
    # the private mean over resampled releases x resampled episodes
    priv = np.array([s.private[ri[b]][:, ei[b]].mean() for b in range(draws)])
    top = s.ceiling[ei].mean(axis=1)
    low = s.floor[ei].mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = (priv - low) / (top - low)
    p, c, f = float(s.private.mean()), float(s.ceiling.mean()), float(s.floor.mean())
    lo, hi = np.nanpercentile(frac, [2.5, 97.5]) if np.isfinite(frac).any() else (math.nan,) * 2
    return {
        "private": p,
        "private_lo": float(np.percentile(priv, 2.5)),
        "private_hi": float(np.percentile(priv, 97.5)),
        "non_private": c,
        "random": f,
        "fraction": (p - f) / (c - f) if c != f else math.nan,
        "fraction_lo": float(lo),
        "fraction_hi": float(hi),
        "release_min": float(s.private.mean(axis=1).min()),
        "release_max": float(s.private.mean(axis=1).max()),
    }


class _Runs(TypedDict):
    """A row's data seed and its releases x episodes (:func:`row`'s keywords)."""

    seed: int
    releases: int
    episodes: int


def row(
    label: str,
    cfg: JSONObject,
    sweep: Sweep,
    *,
    seed: int,
    releases: int,
    episodes: int,
    epsilon: float = EPSILON,
    lever: str = "",
    value: float = math.nan,
    sigma_factor: float = 1.0,
    env_id: str = ENV_ID,
) -> JSONObject:
    """One table row: fit ``cfg`` on the sweep's dataset, calibrate sigma with the
    accountant for this config and dataset, score on common episodes of ``env_id``,
    bootstrap. ``sigma_factor`` scales the accountant's sigma (a what-if for a bound not
    adopted: such a row is not a release)."""
    ds = sweep.ds
    res = sigma_for(cfg, users=int(ds.users), actions=int(ds.n_actions), epsilon=epsilon)
    fit = sweep.fit(cfg)
    sc = score(
        fit,
        sigma=res.sigma * sigma_factor,
        noise_to_value=res.noise_to_value,
        releases=releases,
        episodes=episodes,
        eval_seed=10_000 + 1000 * seed,
        env_id=env_id,
    )
    b = cfg["betas"]
    return {
        "label": label,
        "lever": lever,
        "value": value,
        "seed": seed,
        "users": int(ds.users),
        "samples": int(ds.n),
        "epsilon": epsilon,
        "sigma": res.sigma * sigma_factor,
        "noise_to_value": res.noise_to_value,
        "releases": releases,
        "episodes": episodes,
        **bootstrap(sc),
        "gamma": cfg["gamma"],
        "iterations": cfg["iterations"],
        "lam": cfg["lam"],
        "beta": "/".join(f"{v:g}" for v in b),
        "inducing_points": cfg["inducing_points"],
        "anchor_points": cfg.get("anchor_points", ""),
        "bandwidth": cfg["bandwidth"],
        "default_value": "midpoint" if cfg.get("default_value") is None else cfg["default_value"],
    }


def episodes_rows(
    users: int,
    seeds: Sequence[int],
    episodes_per_user: Sequence[int],
    *,
    releases: int,
    episodes: int,
    say: Callable[[str], object] = print,
) -> list[JSONObject]:
    """The several-episodes lever: the chosen config on ``users`` users of k random-policy
    episodes each, for each seed and k (the same users' first episodes for every k)."""
    rows = []
    for seed in seeds:
        for k in episodes_per_user:
            ds = dataset(users, seed, episodes_per_user=k)
            r = row(f"episodes per user {k}", load_config(**GRID), Sweep(ds, progress=say),
                    seed=seed, releases=releases, episodes=episodes, lever="episodes",
                    value=float(k))  # fmt: skip
            say(f"{_line(r)} ({r['samples']} samples)")
            rows.append(r)
    return rows


def _line(r: JSONObject) -> str:
    return (
        f"{r['label']:<22} seed {r['seed']} sigma {r['sigma']:.3g}: private {r['private']:.0f} "
        f"[{r['private_lo']:.0f}, {r['private_hi']:.0f}] non-private {r['non_private']:.0f} "
        f"random {r['random']:.0f} fraction {r['fraction']:.2f} "
        f"[{r['fraction_lo']:.2f}, {r['fraction_hi']:.2f}]"
    )


#: The plot's panels: lever -> (the chosen config's value of it, axis label, log scale).
_PANELS = {
    "lam": ("lam", "lambda (kappa = 1 / (4 lambda))", True),
    "gamma": ("gamma", "gamma (T with it)", False),
    "beta_x": (None, "beta_j of cart position and velocity", True),
}


def _plot(rows: list[JSONObject], path: Path) -> Path:
    # matplotlib loads only when a plot is drawn (a heavy import)
    import matplotlib

    matplotlib.use("Agg")
    # pyplot after matplotlib.use('Agg') above: no display is needed
    import matplotlib.pyplot as plt

    # here, not at the top: loads matplotlib only when this runs
    from qveil.experiments.plotting import save

    chosen = next(r for r in rows if r["label"] == "chosen")
    fig, axes = plt.subplots(1, len(_PANELS), figsize=(4.6 * len(_PANELS), 3.8), dpi=100)
    for ax, (lever, (key, name, log)) in zip(axes, _PANELS.items(), strict=True):
        here = float(chosen[key]) if key else float(chosen["beta"].split("/")[0])
        sel = [r for r in rows if r["lever"] == lever] + [{**chosen, "value": here}]
        sel.sort(key=lambda r: float(r["value"]))
        xs = [float(r["value"]) for r in sel]
        ax.errorbar(
            xs,
            [r["private"] for r in sel],
            yerr=[
                [r["private"] - r["private_lo"] for r in sel],
                [r["private_hi"] - r["private"] for r in sel],
            ],
            marker="o",
            capsize=3,
            label="private, eps 1 (95% CI)",
        )
        ax.plot(xs, [r["non_private"] for r in sel], "k-", marker=".", lw=2, label="non-private")
        ax.plot(xs, [r["random"] for r in sel], "k:", label="random")
        ax.axvline(here, color="grey", lw=0.8, ls="--")
        if log:
            ax.set_xscale("log")
        ax.set_xlabel(name)
        ax.set_ylabel("return")
        ax.set_ylim(0, 520)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(
        f"CartPole-v1, N = {chosen['users']} users (tuning seed {chosen['seed']}), eps 1, "
        "delta 1e-5; dashed: chosen",
        fontsize=10,
    )
    fig.tight_layout()
    return save(fig, path)


def run(
    *, out: Path, quick: bool = False, seeds: int | None = None, **_: object
) -> dict[str, Path]:
    """The lever table: on the tuning seed, the config before, the chosen config and each
    lever alone (20 releases x 40 episodes each); then both configs on the report seeds
    (40 releases x 50 episodes). ``--seeds`` caps the report seeds. ``--quick``: 300
    users, one lever, seed 0 only (seconds)."""
    out.mkdir(parents=True, exist_ok=True)
    report: tuple[int, ...]
    if quick:
        users, (rel, eps), (rep_rel, rep_eps), levers, report = (
            300,
            (2, 2),
            (2, 2),
            LEVERS[:1],
            (0,),
        )
    else:
        users, (rel, eps), (rep_rel, rep_eps), levers = 100_000, (20, 40), (40, 50), LEVERS
        report = REPORT_SEEDS[: seeds or len(REPORT_SEEDS)]
    chosen = load_config(**GRID)
    before = {**chosen, **BEFORE}
    rows: list[JSONObject] = []

    def emit(r: JSONObject) -> None:
        rows.append(r)
        print(f"levers [{time.perf_counter() - t0:.0f} s] {_line(r)}", flush=True)

    def note(text: str) -> None:
        print(f"levers [{time.perf_counter() - t0:.0f} s] {text}", flush=True)

    t0 = time.perf_counter()
    note(f"tuning seed {TUNE_SEED}: {users} users")
    sweep = Sweep(dataset(users, TUNE_SEED), progress=note)
    kw: _Runs = {"seed": TUNE_SEED, "releases": rel, "episodes": eps}
    emit(row("before", before, sweep, **kw))
    emit(row("chosen", chosen, sweep, **kw))
    for lever, value, ch in levers:
        label = f"{lever} {value:g}" if lever != "default_value" else "default midpoint"
        emit(row(label, {**chosen, **ch}, sweep, lever=lever, value=value, **kw))
    del sweep
    for s in report:
        note(f"report seed {s}: {users} users")
        sweep = Sweep(dataset(users, s), progress=note)
        kw = {"seed": s, "releases": rep_rel, "episodes": rep_eps}
        emit(row("before", before, sweep, **kw))
        emit(row("chosen", chosen, sweep, **kw))
        del sweep
    note(f"{len(rows)} rows")
    csv_path = write_csv(out / "multid_levers.csv", rows, COLUMNS)
    png = _plot([r for r in rows if r["seed"] == TUNE_SEED], out / "multid_levers.png")
    return {"csv": csv_path, "png": png}
