"""``qveil experiments utility``: what the rigorous `fqi` release is worth, measured as served.

**LineWalk control** (docs/results.md section 7). For each seed and number of users N, N
LineWalk users are collected (one random-policy episode each, :func:`qveil.trainer.collect.
collect` with that seed), averager FQI is fitted on the public grid (:mod:`qveil.fqi`) for
each public variant (neighbour relation, gamma, smoother; the rest from
configs/linewalk-private.toml), sigma and beta come from the fqi accountant
(:func:`qveil.fqi_config.plan`) at each eps (delta 1e-5), and the release is evaluated
exactly as the server serves it:

    f_a(x) = (S Q_T)(x, a) interpolated on the grid (:class:`qveil.bundle.GridModel`)
             + g_a(x),   g_a an :class:`qveil.noise.OUSamplePath`(sigma, beta),

with g_a queried lazily at the states the episodes visit (the store's exact conditional
sampler), the greedy policy argmax_a f_a(x), on real LineWalk episodes
(:func:`qveil.trainer.served_eval.lockstep_returns`). The seeds (data collection, noise
generator, episodes) are the experiment's; a release draws its noise from OS entropy.
Beside it: non-private FQI (pooled averager, no smoother, no noise: the ceiling), the
uniformly random policy (the floor), and Algorithm 1's ``paper``, ``gdp`` and ``output``
modes at the same eps (:mod:`qveil.experiments.fig2`'s machinery, each by its own
accountant; a point whose accountant finds no guarantee is labelled so).

**Chain policy evaluation** (BGP16's chain MDP, :mod:`qveil.experiments.chain_mdp`): fitted Q
evaluation of the chain's fixed policy with the same private machinery, against DP-LSW and
DP-LSL at the same (eps, delta) and number of users m; see :func:`chain_fqe`.

Pure numpy except the evaluation (Gymnasium) and Algorithm 1 (torch, imported in its runs).
"""

from __future__ import annotations

import functools
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from qveil.experiments._util import mean_se, progress_map, write_csv

__all__ = [
    "Variant",
    "chain_fqe",
    "chain_fqe_release",
    "chain_sensitivity",
    "fit_variants",
    "run",
    "sample_chain",
]

FloatArray = npt.NDArray[np.float64]

ENV_ID = "qveil/LineWalk-v0"
PRIVATE_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "linewalk-private.toml"
ALG1_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "linewalk-quick.toml"
DELTA = 1e-5

USERS_FULL = (30, 100, 300, 1000, 3000)
USERS_QUICK = (30, 300)
EPS_FULL = (0.25, 0.5, 1.0, 2.0, 4.0)
EPS_QUICK = (1.0, 4.0)
GAMMAS = (0.3, 0.5, 0.9)
ALG1_MODES = ("paper", "gdp", "output")
#: Seeds of the (slow, torch) Algorithm 1 runs in the full experiment.
ALG1_SEEDS = 3
#: Episodes each release is scored on (per seed).
EPISODES_FULL = 100
EPISODES_QUICK = 30
#: Environment seeds of the evaluation episodes start here (collection uses the seed itself).
EVAL_SEED0 = 1_000_000


@dataclass(frozen=True)
class Variant:
    """One public configuration of the release (everything else: linewalk-private.toml)."""

    relation: str
    gamma: float
    smoother: float

    @property
    def name(self) -> str:
        return f"fqi {self.relation} g={self.gamma:g} s={self.smoother:g}"


def _variants(quick: bool) -> tuple[Variant, ...]:
    if quick:
        return (Variant("user", 0.3, 0.2), Variant("reward", 0.5, 0.1))
    grid = tuple(Variant(rel, g, 0.2) for rel in ("user", "reward") for g in GAMMAS)
    return grid + (Variant("user", 0.5, 0.1), Variant("reward", 0.5, 0.1))


# ----------------------------------------------------------------------------- fitting
def fit_variants(
    dataset: Any,
    *,
    relation: str,
    gammas: Sequence[float],
    cfg: Any,
    reward_range: tuple[float, float],
) -> dict[float, FloatArray]:
    """Q_T (K, m) of :func:`qveil.fqi.fitted_q` for each gamma, sharing the averaging
    operators: (c, P) of equation (1) in qveil.fqi do not depend on gamma except through
    the public default value d (the midpoint of the gamma-dependent range), and c is
    affine in d: c(d) = c(0) + d w with w the weight of the default (per user: the share
    of users none of whose samples reaches the grid point; pooled: 1 where no sample
    does). Equal to fitted_q to round-off (tests/unit/experiments/test_experiment_utility.py)."""
    from qveil.fqi import _kernel_band, averaging_operators, q_range
    from qveil.release_map import unit_grid

    spec = cfg.spec(gamma=gammas[0], neighbour=relation)
    lo, hi = reward_range
    s = np.clip(np.asarray(dataset.s, dtype=np.float64).reshape(-1), 0.0, 1.0)
    s2 = np.clip(np.asarray(dataset.s2, dtype=np.float64).reshape(-1), 0.0, 1.0)
    r = np.clip(np.asarray(dataset.r, dtype=np.float64), lo, hi)
    a = np.asarray(dataset.a, dtype=np.int64)
    term = np.asarray(dataset.terminal, dtype=bool)
    _, uid = np.unique(np.asarray(dataset.user), return_inverse=True)
    users = int(uid.max()) + 1
    k = cfg.grid_points
    grid = unit_grid(k)
    ops: list[tuple[FloatArray, FloatArray, FloatArray]] = []
    for act in range(int(dataset.n_actions)):
        m = a == act
        c0, p = averaging_operators(
            s[m], r[m], s2[m], term[m], uid[m], users=users, spec=spec, default=0.0
        )
        kc, w = _kernel_band(s[m], grid, spec.bandwidth, spec.kernel_radius)
        if relation == "user":
            den = np.bincount(
                (uid[m][:, None] * k + kc).ravel(), weights=w.ravel(), minlength=users * k
            )
            covered = (den.reshape(users, k) > 0).sum(axis=0)
            wdef = (users - covered) / users
        else:
            den = np.bincount(kc.ravel(), weights=w.ravel(), minlength=k)
            wdef = (den <= 0).astype(np.float64)
        ops.append((c0, p, wdef))
    out: dict[float, FloatArray] = {}
    for g in gammas:
        qlo, qhi = q_range((lo, hi), g)
        d = 0.5 * (qlo + qhi)
        q = np.zeros((k, len(ops)))
        for _ in range(int(cfg.iterations)):
            v = q.max(axis=1)
            q = np.stack([c0 + d * wd + g * (p @ v) for c0, p, wd in ops], axis=1)
        out[float(g)] = q
    return out


# ----------------------------------------------------------------------------- evaluation
def _served_returns(
    values: FloatArray,
    *,
    sigma: float,
    beta: float,
    noise_seed: Sequence[int] | None,
    episodes: int,
    env_seed: int,
) -> list[float]:
    """Returns of argmax_a [GridModel mean + g_a] on LineWalk (state interval [0, 1] is the
    unit interval), g_a drawn lazily at the visited states as the store does."""
    from qveil.bundle import GridModel
    from qveil.noise import OUSamplePath
    from qveil.release_map import unit_grid
    from qveil.trainer.served_eval import lockstep_returns

    model = GridModel(grid=unit_grid(values.shape[0]), values=values)
    paths = (
        [
            OUSamplePath(sigma=sigma, beta=beta, rng=np.random.default_rng([*noise_seed, act]))
            for act in range(values.shape[1])
        ]
        if noise_seed is not None
        else []
    )

    def policy(states: FloatArray) -> npt.NDArray[np.int64]:
        x = np.clip(states[:, 0], 0.0, 1.0)
        f = model.q_values_unit(x)
        if paths:
            f = f + np.stack([np.asarray(p.sample(x)) for p in paths], axis=1)
        return np.asarray(np.argmax(f, axis=1), dtype=np.int64)

    return lockstep_returns(ENV_ID, policy, episodes=episodes, seed=env_seed, env_kwargs={})


def _random_returns(
    n_actions: int, *, seed: Sequence[int], episodes: int, env_seed: int
) -> list[float]:
    from qveil.trainer.served_eval import lockstep_returns

    rng = np.random.default_rng(list(seed))

    def policy(states: FloatArray) -> npt.NDArray[np.int64]:
        return rng.integers(0, n_actions, size=len(states)).astype(np.int64)

    return lockstep_returns(ENV_ID, policy, episodes=episodes, seed=env_seed, env_kwargs={})


@functools.lru_cache(maxsize=32)
def _best_beta(points: int, smoother_bandwidth: float) -> float:
    """:func:`qveil.release_map.best_beta` (what plan() uses when the config gives no beta),
    computed once per map: it is a public function of (K, smoother) and takes seconds."""
    from qveil.release_map import best_beta

    return best_beta(points, smoother_bandwidth)


# long-function: one job of the utility experiment (fit, release, evaluate), as docs/results.md
#   section 7 describes it
def linewalk_job(
    seed: int,
    users: int,
    variants: tuple[Variant, ...],
    epsilons: tuple[float, ...],
    episodes: int,
) -> list[dict[str, Any]]:
    """Every fqi variant at every eps, non-private FQI per gamma and random, for one
    (seed, N): one dataset, one set of evaluation episodes."""
    from qveil.fqi_config import REFUSE_RATIO, FQIConfig, plan
    from qveil.release_map import smoother
    from qveil.trainer.collect import collect

    base = FQIConfig.from_toml(PRIVATE_CONFIG)
    rr = base.reward_range or (0.0, 0.5)
    t0 = time.perf_counter()
    ds = collect(ENV_ID, users, seed, progress=False)
    env_seed = EVAL_SEED0 + 1000 * seed
    gammas_by_rel: dict[str, set[float]] = defaultdict(set)
    for v in variants:
        gammas_by_rel[v.relation].add(v.gamma)
    gammas_by_rel["reward"] |= {v.gamma for v in variants}  # pooled = the non-private fit
    fits = {
        rel: fit_variants(ds, relation=rel, gammas=sorted(gs), cfg=base, reward_range=rr)
        for rel, gs in gammas_by_rel.items()
    }
    common = {"users": users, "seed": seed, "delta": DELTA, "episodes": episodes}
    rows: list[dict[str, Any]] = []
    rnd = _random_returns(2, seed=[seed, users, 5], episodes=episodes, env_seed=env_seed)
    rows.append({**common, "method": "random", "return": float(np.mean(rnd)), "holds": ""})
    for g in sorted({v.gamma for v in variants}):
        ret = _served_returns(
            fits["reward"][g],
            sigma=0.0,
            beta=1.0,
            noise_seed=None,
            episodes=episodes,
            env_seed=env_seed,
        )
        rows.append(
            {
                **common,
                "method": "non-private FQI",
                "relation": "none",
                "gamma": g,
                "smoother": 0.0,
                "return": float(np.mean(ret)),
                "holds": False,
            }
        )
    for vi, v in enumerate(variants):
        values = smoother(base.grid_points, v.smoother) @ fits[v.relation][v.gamma]
        for ei, eps in enumerate(epsilons):
            cfg = base.replace(
                neighbour=v.relation,
                gamma=v.gamma,
                smoother_bandwidth=v.smoother,
                beta=_best_beta(base.grid_points, v.smoother),
                epsilon=eps,
                delta=DELTA,
            )
            res = plan(cfg, users=users, actions=2, reward_range=rr)
            ret = _served_returns(
                values,
                sigma=res.sigma,
                beta=res.beta,
                noise_seed=[seed, users, vi, ei, 7],
                episodes=episodes,
                env_seed=env_seed,
            )
            rows.append(
                {
                    **common,
                    "method": "fqi",
                    "variant": v.name,
                    "relation": v.relation,
                    "gamma": v.gamma,
                    "smoother": v.smoother,
                    "epsilon": eps,
                    "return": float(np.mean(ret)),
                    "sigma": res.sigma,
                    "beta": res.beta,
                    "kappa": res.kappa,
                    "sup_sensitivity": res.sup_sensitivity,
                    "sensitivity": res.sensitivity,
                    "noise_to_value": res.noise_to_value,
                    "holds": bool(res.holds),
                    "refused_without_force": bool(res.noise_to_value > REFUSE_RATIO),
                }
            )
    dt = time.perf_counter() - t0
    for row in rows:
        row["job_seconds"] = round(dt, 2)
    return rows


def alg1_job(mode: str, eps: float, seed: int, quick: bool, episodes: int) -> dict[str, Any]:
    """One Algorithm 1 run (fig2's machinery) at eps, delta 1e-5, its own accountant."""
    from qveil.experiments.fig2 import QUICK_CHANGES, method_spec
    from qveil.experiments.linewalk import load_cfg, run_spec

    config = None if quick else str(ALG1_CONFIG)
    changes: dict[str, Any] = dict(QUICK_CHANGES) if quick else {}
    cfg = load_cfg(config, **changes)
    spec, priv = method_spec(
        mode, epsilon=eps, delta=DELTA, cfg=cfg, config=config, changes=changes
    )
    res = run_spec({**spec, "seed": seed, "eval_episodes": episodes, "privacy": priv})
    return {
        "method": f"alg1 {mode}",
        "variant": "configs/linewalk.toml (quick changes)"
        if quick
        else "configs/linewalk-quick.toml",
        "relation": f"reward functions within Delta_r = {cfg.reward_sensitivity:g}",
        "gamma": cfg.gamma,
        "epsilon": eps,
        "delta": DELTA,
        "seed": seed,
        "episodes": episodes,
        "return": float(res["release_return"]),
        "sigma": float(priv["noise"]),
        "holds": bool(priv["holds"]),
        "reason": priv.get("reason") or "",
        "job_seconds": round(float(res["seconds"]), 2),
    }


# ----------------------------------------------------------------------------- chain FQE
CHAIN_SIZES_FULL = (10, 30, 100, 300, 1000, 3000, 10_000, 30_000, 100_000)
CHAIN_SIZES_QUICK = (30, 300)
#: (eps, delta): BGP16 section's setting (Section 1 of docs/results.md) and the product's.
CHAIN_PRIVACY = ((0.1, 0.1), (1.0, 1e-5))
#: FQE iterations: information moves one state per iteration along the 40-state chain.
CHAIN_ITERATIONS = 80
#: Smoother of the release map on the chain's 40-point grid (unit coordinates).
CHAIN_SMOOTHER = 0.1
#: The public bound on the chain's returns (BGP16's F_max = 1): targets are clipped to it.
CHAIN_F_MAX = 1.0


@dataclass(frozen=True)
class ChainStats:
    """Sufficient statistics of m chain trajectories for per-user FQE, per non-absorbing
    state k: ``visits[k]`` = users visiting k, ``stay[k]`` = sum over them of
    (H_uk - 1) / H_uk and ``move[k]`` = sum of 1 / H_uk (H_uk: u's holding time in k, so
    u's H_uk samples at k are H_uk - 1 self-transitions and one move to k + 1);
    ``samples[k]`` = sum of H_uk (for the pooled, non-private FQE)."""

    m: int
    visits: FloatArray
    stay: FloatArray
    move: FloatArray
    samples: FloatArray


def sample_chain(
    mdp: Any, m: int, rng: np.random.Generator, *, chunk: int = 50_000
) -> tuple[Any, ChainStats]:
    """m trajectories of BGP16's chain (one per user) as both BGP16's first-visit
    :class:`~qveil.experiments.chain_mdp.Batch` and the per-user FQE statistics, drawn as
    in :meth:`ChainMDP.sample` (holding times H_s ~ Geometric(1 - p))."""
    from qveil.experiments.chain_mdp import Batch

    n = mdp.n_states
    counts = np.zeros(n, dtype=np.int64)
    sums = np.zeros(n)
    visits, stay, move, samples = (np.zeros(n - 1) for _ in range(4))
    cols = np.arange(n)
    done = 0
    while done < m:
        b = min(chunk, m - done)
        done += b
        hold = rng.geometric(1.0 - mdp.p_stay, size=(b, n - 1)).astype(np.float64)
        if mdp.start == "uniform":
            start = rng.integers(0, n - 1, size=b)
        else:
            start = np.zeros(b, dtype=np.int64)
        suffix = np.cumsum(hold[:, ::-1], axis=1)[:, ::-1]
        visited = cols[None, :] >= start[:, None]
        counts += visited.sum(axis=0)
        sums[: n - 1] += np.where(visited[:, : n - 1], np.power(mdp.gamma, suffix - 1.0), 0.0).sum(
            axis=0
        )
        v = visited[:, : n - 1]
        visits += v.sum(axis=0)
        stay += np.where(v, (hold - 1.0) / hold, 0.0).sum(axis=0)
        move += np.where(v, 1.0 / hold, 0.0).sum(axis=0)
        samples += np.where(v, hold, 0.0).sum(axis=0)
    return Batch(m=m, counts=counts, return_sums=sums), ChainStats(m, visits, stay, move, samples)


def chain_fqe(
    stats: ChainStats, *, gamma: float, iterations: int, f_max: float, pooled: bool = False
) -> FloatArray:
    """Per-user averager FQE of the chain's policy on the grid of its N states (Q_0 = 0):

        Q_{t+1}(k) = (1/m) [ sum_{u visits k} A_u(k) + (m - visits_k) f_max / 2 ],
        A_u(k) = ((H_uk - 1) y_stay(k) + y_move(k)) / H_uk,
        y_stay(k) = clip(gamma Q_t(k), 0, f_max),  y_move(k) = clip(r_k + gamma Q_t(k+1), 0, f_max)

    with r_k = 1 and no bootstrap on the move into the absorbing state N - 1, whose value is
    0 (terminal: public). This is :mod:`qveil.fqi`'s per-user averager with one action on a
    grid through the chain's states (a bandwidth below the grid spacing), except that each
    target is clipped to the public return bound [0, f_max] (BGP16's F_max): clipping is
    1-Lipschitz, so the gamma-contraction survives, and each user's average now lies in an
    interval of width f_max (see :func:`chain_sensitivity`).

    The per-user average weighs users, not samples: a user who leaves k quickly weighs
    its move more (E[1/H] = ln 2 = 0.69 against the move probability 0.5 at p = 0.5), so its
    fixed point is not the chain's value even with infinite data (measured, and reported).
    ``pooled=True`` is the ordinary (sample-weighted, non-private) FQE, whose fixed point
    is the true value."""
    n = len(stats.visits) + 1
    m = float(stats.m)
    r = np.zeros(n - 1)
    r[-1] = 1.0
    q = np.zeros(n)
    for _ in range(int(iterations)):
        nxt = np.append(q[1 : n - 1], 0.0)  # Q(k+1); the absorbing state is terminal
        y_stay = np.clip(gamma * q[: n - 1], 0.0, f_max)
        y_move = np.clip(r + gamma * nxt, 0.0, f_max)
        new = np.zeros(n)
        if pooled:
            tot = stats.samples
            avg = ((tot - stats.visits) * y_stay + stats.visits * y_move) / np.maximum(tot, 1.0)
            new[: n - 1] = np.where(tot > 0, avg, 0.5 * f_max)
        else:
            new[: n - 1] = (
                stats.stay * y_stay + stats.move * y_move + (m - stats.visits) * 0.5 * f_max
            ) / m
        q = new
    return q


def chain_sensitivity(*, users: int, gamma: float, iterations: int, f_max: float) -> float:
    """D_T of :func:`chain_fqe` under BGP16's relation (one user's trajectory replaced):
    every user's average and the default lie in [0, f_max], so one user moves a step by at
    most f_max / m beyond the contraction: D_T = f_max (1 - gamma^T) / (m (1 - gamma)).
    (qveil.privacy.fqi's user-relation formula, with r0 / (1 - gamma) replaced by f_max.)"""
    return f_max * (1.0 - gamma ** int(iterations)) / (users * (1.0 - gamma))


def chain_fqe_release(
    stats: ChainStats,
    *,
    gamma: float,
    epsilon: float,
    delta: float,
    rng: np.random.Generator,
    iterations: int = CHAIN_ITERATIONS,
    smoother_bandwidth: float = CHAIN_SMOOTHER,
    f_max: float = CHAIN_F_MAX,
) -> tuple[FloatArray, FloatArray, dict[str, float]]:
    """(private value estimate at the N states, its un-noised mean S Q_T, privacy numbers):
    the release map of :mod:`qveil.release_map` (smoother, certified kappa, best beta) on
    the grid of the N - 1 non-absorbing states (the absorbing state's value is 0 by
    definition, public, and not released), Delta = D_T sqrt(kappa) (one action), sigma from
    the analytic Gaussian mechanism, and the noise an exact OU path queried at the states."""
    from qveil.noise import OUSamplePath
    from qveil.privacy.gaussian import analytic_gaussian_sigma
    from qveil.release_map import certified_kappa, smoother, unit_grid

    k = len(stats.visits)
    q = chain_fqe(stats, gamma=gamma, iterations=iterations, f_max=f_max)
    mean = np.append(smoother(k, smoother_bandwidth) @ q[:k], 0.0)
    beta = _best_beta(k, smoother_bandwidth)
    kappa = certified_kappa(k, smoother_bandwidth, beta)
    d_t = chain_sensitivity(users=stats.m, gamma=gamma, iterations=iterations, f_max=f_max)
    sens = d_t * math.sqrt(kappa) * (1.0 + 1e-9)
    sigma = analytic_gaussian_sigma(epsilon=epsilon, delta=delta, sensitivity=sens)
    path = OUSamplePath(sigma=sigma, beta=beta, rng=rng)
    est = mean + np.append(np.asarray(path.sample(unit_grid(k))), 0.0)
    return est, mean, {"sigma": sigma, "beta": beta, "kappa": kappa, "sup_sensitivity": d_t}


# long-function: one job of the utility experiment (fit, release, evaluate), as docs/results.md
#   section 7 describes it
def chain_job(sizes: tuple[int, ...], run_id: int) -> list[dict[str, Any]]:
    """One run: for each start distribution and m, the same trajectories scored by
    non-private FQE, private FQE, LSW/LSL and DP-LSW/DP-LSL (tabular features, F_max = 1
    and as written) at each (eps, delta) of :data:`CHAIN_PRIVACY`."""
    from qveil.experiments.bgp16 import (
        lambda_schedule,
        lsl_fit,
        lsl_sigma,
        lsw_fit,
        lsw_sigma,
    )
    from qveil.experiments.chain_mdp import ChainMDP, tabular_features

    rows: list[dict[str, Any]] = []
    for si, start in enumerate(("uniform", "first")):
        mdp = ChainMDP(start=start)
        v_true = mdp.true_values()
        n = mdp.n_states
        phi = tabular_features(n)
        ones = np.ones(n)
        rng = np.random.default_rng([13, run_id, si])

        def rmse(est: FloatArray, _v: FloatArray = v_true) -> float:
            return float(np.sqrt(np.mean((est - _v) ** 2)))

        for m in sizes:
            batch, stats = sample_chain(mdp, m, rng)
            base = {"start": start, "m": m, "run": run_id}
            kw_q: dict[str, Any] = {
                "gamma": mdp.gamma,
                "iterations": CHAIN_ITERATIONS,
                "f_max": CHAIN_F_MAX,
            }
            q_user = chain_fqe(stats, **kw_q)
            q_pool = chain_fqe(stats, pooled=True, **kw_q)
            th_w = lsw_fit(batch, phi, ones)
            lam = lambda_schedule(m, phi, ones)
            th_l = lsl_fit(batch, phi, ones, lam=lam)
            for name, est in (
                ("FQE pooled (non-private)", q_pool),
                ("FQE per-user (non-private)", q_user),
                ("LSW", phi @ th_w),
                ("LSL", phi @ th_l),
            ):
                rows.append(
                    {
                        **base,
                        "method": name,
                        "f_max": "",
                        "epsilon": "",
                        "delta": "",
                        "sigma": 0.0,
                        "rmse": rmse(est),
                    }
                )
            for eps, delta in CHAIN_PRIVACY:
                priv = {"epsilon": eps, "delta": delta}
                est, _mean, info = chain_fqe_release(
                    stats, gamma=mdp.gamma, epsilon=eps, delta=delta, rng=rng
                )
                rows.append(
                    {
                        **base,
                        **priv,
                        "method": "DP-FQE (qveil fqi)",
                        "f_max": f"{CHAIN_F_MAX:g}",
                        "sigma": info["sigma"],
                        "rmse": rmse(est),
                    }
                )
                for f_max in (CHAIN_F_MAX, None):
                    label = "R_max/(1-gamma)" if f_max is None else f"{f_max:g}"
                    kw: dict[str, Any] = {
                        "epsilon": eps,
                        "delta": delta,
                        "r_max": mdp.r_max,
                        "gamma": mdp.gamma,
                        "f_max": f_max,
                    }
                    s_w = lsw_sigma(batch.counts, phi, ones, **kw)
                    s_l = lsl_sigma(batch.counts, phi, ones, m=m, lam=lam, **kw)
                    eta = rng.standard_normal((2, n))
                    rows.append(
                        {
                            **base,
                            **priv,
                            "method": "DP-LSW",
                            "f_max": label,
                            "sigma": s_w,
                            "rmse": rmse(phi @ (th_w + s_w * eta[0])),
                        }
                    )
                    rows.append(
                        {
                            **base,
                            **priv,
                            "method": "DP-LSL",
                            "f_max": label,
                            "sigma": s_l,
                            "rmse": rmse(phi @ (th_l + s_l * eta[1])),
                        }
                    )
    return rows


# ----------------------------------------------------------------------------- summaries
SUMMARY_KEYS = ("method", "variant", "relation", "gamma", "smoother", "users", "epsilon")
SUMMARY_FIELDS = [
    *SUMMARY_KEYS,
    "delta",
    "seeds",
    "return_mean",
    "return_se",
    "sigma",
    "noise_to_value",
    "holds",
    "refused_without_force",
    "reason",
]
CHAIN_KEYS = ("start", "method", "f_max", "epsilon", "delta", "m")
CHAIN_FIELDS = [*CHAIN_KEYS, "runs", "rmse_mean", "rmse_se", "sigma"]


def summarise(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and standard error of the return over seeds, per (method, variant, N, eps)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[tuple(r.get(k, "") for k in SUMMARY_KEYS)].append(r)
    out = []
    for key, rs in groups.items():
        mean, se = mean_se([float(r["return"]) for r in rs])
        first = rs[0]
        out.append(
            {
                **dict(zip(SUMMARY_KEYS, key, strict=True)),
                "delta": first.get("delta", ""),
                "seeds": len(rs),
                "return_mean": mean,
                "return_se": se,
                "sigma": first.get("sigma", ""),
                "noise_to_value": first.get("noise_to_value", ""),
                "holds": first.get("holds", ""),
                "refused_without_force": first.get("refused_without_force", ""),
                "reason": first.get("reason", ""),
            }
        )
    return out


def summarise_chain(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[tuple(r[k] for k in CHAIN_KEYS)].append(r)
    out = []
    for key, rs in groups.items():
        mean, se = mean_se([float(r["rmse"]) for r in rs])
        out.append(
            {
                **dict(zip(CHAIN_KEYS, key, strict=True)),
                "runs": len(rs),
                "rmse_mean": mean,
                "rmse_se": se,
                "sigma": float(np.mean([float(r["sigma"]) for r in rs])),
            }
        )
    return out


def _pm(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    s = f"{row['return_mean']:.1f} +- {row['return_se']:.1f}"
    if row.get("method") == "fqi" and _truthy(row.get("refused_without_force")):
        s += " (r)"
    if row.get("method", "").startswith("alg1") and not _truthy(row.get("holds")):
        s += " (no guarantee)"
    return s


def _truthy(v: Any) -> bool:
    return v is True or str(v).lower() == "true"


def markdown_tables(summary: Sequence[dict[str, Any]], chain: Sequence[dict[str, Any]]) -> str:
    """The tables docs/results.md shows: fqi return (mean +- s.e.) by variant and N at each
    eps, the references, Algorithm 1's modes, and the chain RMSE at each m."""
    lines: list[str] = []
    fqi = [r for r in summary if r["method"] == "fqi"]
    users = sorted({int(r["users"]) for r in fqi})
    eps_list = sorted({float(r["epsilon"]) for r in fqi})
    variants = list(dict.fromkeys(str(r["variant"]) for r in fqi))
    idx = {(str(r["variant"]), int(r["users"]), float(r["epsilon"])): r for r in fqi}
    head = "| variant | eps | " + " | ".join(f"N = {n}" for n in users) + " |"
    lines += [head, "|" + "---|" * (2 + len(users))]
    for v in variants:
        for e in eps_list:
            cells = [_pm(idx.get((v, n, e))) for n in users]
            lines.append(f"| {v} | {e:g} | " + " | ".join(cells) + " |")
    refs = [r for r in summary if r["method"] in ("non-private FQI", "random")]
    for r0 in sorted({(r["method"], str(r["gamma"])) for r in refs}):
        byn = {int(r["users"]): r for r in refs if (r["method"], str(r["gamma"])) == r0}
        name = r0[0] if r0[0] == "random" else f"{r0[0]} g={float(r0[1]):g}"
        lines.append(f"| {name} | - | " + " | ".join(_pm(byn.get(n)) for n in users) + " |")
    alg = [r for r in summary if str(r["method"]).startswith("alg1")]
    if alg:
        lines += ["", "| Algorithm 1 mode | " + " | ".join(f"eps {e:g}" for e in eps_list) + " |"]
        lines.append("|" + "---|" * (1 + len(eps_list)))
        for mode in dict.fromkeys(str(r["method"]) for r in alg):
            bye = {float(r["epsilon"]): r for r in alg if r["method"] == mode}
            cells = []
            for e in eps_list:
                r = bye.get(e)
                cells.append("-" if r is None else f"{_pm(r)}; sigma {float(r['sigma']):.3g}")
            lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    if chain:
        lines.append("")
        ms = sorted({int(r["m"]) for r in chain})
        lines += ["| start | method | eps, delta | " + " | ".join(f"m = {m}" for m in ms) + " |"]
        lines.append("|" + "---|" * (3 + len(ms)))
        keys = list(
            dict.fromkeys(
                (r["start"], r["method"], str(r["f_max"]), str(r["epsilon"]), str(r["delta"]))
                for r in chain
            )
        )
        for k in keys:
            bym = {
                int(r["m"]): r
                for r in chain
                if (r["start"], r["method"], str(r["f_max"]), str(r["epsilon"]), str(r["delta"]))
                == k
            }
            name = k[1] + (f" (F_max {k[2]})" if k[2] and k[1].startswith("DP-LS") else "")
            ed = "-" if not k[3] else f"{float(k[3]):g}, {float(k[4]):g}"
            cells = ["-" if m not in bym else f"{bym[m]['rmse_mean']:.3g}" for m in ms]
            lines.append(f"| {k[0]} | {name} | {ed} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- run
def run(
    *,
    out: Path,
    quick: bool = False,
    seeds: int | None = None,
    workers: int = 1,
) -> dict[str, Path]:
    """The LineWalk table and plot, Algorithm 1's modes, and the chain variant (see the
    module docstring). Writes utility_runs.csv, utility.csv, utility.md, utility.png,
    utility_chain.csv, utility_chain_runs.csv and utility_chain.png into ``out``."""
    from qveil.experiments import plotting

    out.mkdir(parents=True, exist_ok=True)
    n_seeds = seeds if seeds is not None else (2 if quick else 10)
    users = USERS_QUICK if quick else USERS_FULL
    epsilons = EPS_QUICK if quick else EPS_FULL
    variants = _variants(quick)
    episodes = EPISODES_QUICK if quick else EPISODES_FULL
    # biggest jobs first, so that the pool's tail is short
    jobs: list[tuple[Any, ...]] = [
        (s, n, variants, epsilons, episodes)
        for n in sorted(users, reverse=True)
        for s in range(n_seeds)
    ]
    rows = [
        r
        for part in progress_map(linewalk_job, jobs, workers=workers, desc="utility: fqi")
        for r in part
    ]
    alg1_eps = (1.0,) if quick else epsilons
    alg1_seeds = 1 if quick else min(n_seeds, ALG1_SEEDS)
    a_jobs = [
        (mode, e, 200 + s, quick, 20)
        for e in alg1_eps
        for mode in ALG1_MODES
        for s in range(alg1_seeds)
    ]
    rows += progress_map(alg1_job, a_jobs, workers=workers, desc="utility: Algorithm 1")
    summary = summarise(rows)
    paths = {
        "runs_csv": write_csv(out / "utility_runs.csv", rows),
        "csv": write_csv(out / "utility.csv", summary, SUMMARY_FIELDS),
    }
    sizes = CHAIN_SIZES_QUICK if quick else CHAIN_SIZES_FULL
    c_runs = 2 if quick else 20
    crows = [
        r
        for part in progress_map(
            chain_job, [(sizes, i) for i in range(c_runs)], workers=workers, desc="utility: chain"
        )
        for r in part
    ]
    chain = summarise_chain(crows)
    paths["chain_runs_csv"] = write_csv(out / "utility_chain_runs.csv", crows)
    paths["chain_csv"] = write_csv(out / "utility_chain.csv", chain, CHAIN_FIELDS)
    md = out / "utility.md"
    md.write_text(markdown_tables(summary, chain))
    paths["md"] = md
    paths["png"] = plotting.plot_utility(
        summary,
        out / "utility.png",
        title=f"fqi release on LineWalk, served (OU noise at visited states), delta {DELTA:g}; "
        f"{n_seeds} seeds x {episodes} episodes (mean +- s.e.)",
    )
    paths["chain_png"] = plotting.plot_utility_chain(
        chain,
        out / "utility_chain.png",
        title=f"BGP16 chain (N=40, p=0.5, gamma=0.99): private FQE vs DP-LSW/DP-LSL, tabular; "
        f"{c_runs} runs (mean +- s.e.)",
    )
    return paths
