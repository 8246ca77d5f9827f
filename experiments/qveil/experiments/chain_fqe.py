"""The chain part of ``qveil experiments utility``: private fitted Q evaluation of the fixed
policy of BGP16's chain MDP (:mod:`qveil.experiments.chain_mdp`) with the product's release
machinery, against non-private FQE, LSW/LSL and DP-LSW/DP-LSL at the same (eps, delta) and
number of users m, and the per-(start, method, eps, m) summary of its runs. The release map
is the grid smoother with a certified kappa of :mod:`qveil.release_map` (the map of the
retired 1-D grid fit): the chain's states are K integers, where a grid is the natural map."""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from qveil.experiments._util import mean_se
from qveil.experiments.bgp16 import lambda_schedule, lsl_fit, lsl_sigma, lsw_fit, lsw_sigma
from qveil.experiments.chain_mdp import Batch, ChainMDP, tabular_features
from qveil.json_types import JSONObject, JSONValue
from qveil.noise import OUSamplePath
from qveil.privacy.gaussian import analytic_gaussian_sigma
from qveil.release_map import (
    certified_kappa,
    kappa_certificate,
    release_quadratic_form,
    smoother,
    unit_grid,
)

__all__ = [
    "CHAIN_FIELDS",
    "ChainStats",
    "chain_fqe",
    "chain_fqe_release",
    "chain_job",
    "chain_sensitivity",
    "sample_chain",
    "summarise_chain",
]

FloatArray = npt.NDArray[np.float64]

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
    mdp: ChainMDP, m: int, rng: np.random.Generator, *, chunk: int = 50_000
) -> tuple[Batch, ChainStats]:
    """m trajectories of BGP16's chain (one per user) as both BGP16's first-visit
    :class:`~qveil.experiments.chain_mdp.Batch` and the per-user FQE statistics, from the same
    draws (:meth:`ChainMDP.sample`: holding times H_s ~ Geometric(1 - p))."""
    n = mdp.n_states
    visits, stay, move, samples = (np.zeros(n - 1) for _ in range(4))

    def add(hold: FloatArray, visited: npt.NDArray[np.bool_]) -> None:
        v = visited[:, : n - 1]
        visits[:] += v.sum(axis=0)
        stay[:] += np.where(v, (hold - 1.0) / hold, 0.0).sum(axis=0)
        move[:] += np.where(v, 1.0 / hold, 0.0).sum(axis=0)
        samples[:] += np.where(v, hold, 0.0).sum(axis=0)

    batch = mdp.sample(m, rng, chunk=chunk, on_chunk=add)
    return batch, ChainStats(m, visits, stay, move, samples)


def chain_fqe(
    stats: ChainStats, *, gamma: float, iterations: int, f_max: float, pooled: bool = False
) -> FloatArray:
    """Per-user averager FQE of the chain's policy on the grid of its N states (Q_0 = 0):

        Q_{t+1}(k) = (1/m) [ sum_{u visits k} A_u(k) + (m - visits_k) f_max / 2 ],
        A_u(k) = ((H_uk - 1) y_stay(k) + y_move(k)) / H_uk,
        y_stay(k) = clip(gamma Q_t(k), 0, f_max),  y_move(k) = clip(r_k + gamma Q_t(k+1), 0, f_max)

    with r_k = 1 and no bootstrap on the move into the absorbing state N - 1, whose value is
    0 (terminal: public). This is the per-user averager of the fqi mode with one action on a
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


@functools.lru_cache(maxsize=32)
def best_beta_cached(points: int, smoother_bandwidth: float) -> float:
    """The beta that minimises the row-sum kappa of the chain's release map (a public
    function of K and the smoother; bounded search on log beta over [0.1, 1000], rounded to 4
    significant digits), computed once per map."""
    # scipy.optimize loads only when a map's certificate is computed
    from scipy.optimize import minimize_scalar

    def row_sum(lb: float) -> float:
        a = release_quadratic_form(points, smoother_bandwidth, float(np.exp(lb)))
        return kappa_certificate(a, sdp=False).kappa

    res = minimize_scalar(
        row_sum, bounds=(math.log(0.1), math.log(1000.0)), method="bounded", options={"xatol": 1e-3}
    )
    return float(f"{math.exp(res.x):.4g}")


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

    k = len(stats.visits)
    q = chain_fqe(stats, gamma=gamma, iterations=iterations, f_max=f_max)
    mean = np.append(smoother(k, smoother_bandwidth) @ q[:k], 0.0)
    beta = best_beta_cached(k, smoother_bandwidth)
    kappa = certified_kappa(k, smoother_bandwidth, beta)
    d_t = chain_sensitivity(users=stats.m, gamma=gamma, iterations=iterations, f_max=f_max)
    sens = d_t * math.sqrt(kappa) * (1.0 + 1e-9)
    sigma = analytic_gaussian_sigma(epsilon=epsilon, delta=delta, sensitivity=sens)
    path = OUSamplePath(sigma=sigma, beta=beta, rng=rng)
    est = mean + np.append(np.asarray(path.sample(unit_grid(k))), 0.0)
    return est, mean, {"sigma": sigma, "beta": beta, "kappa": kappa, "sup_sensitivity": d_t}


def chain_job(sizes: tuple[int, ...], run_id: int) -> list[JSONObject]:
    """One run: for each start distribution and m, the same trajectories scored by
    non-private FQE, private FQE, LSW/LSL and DP-LSW/DP-LSL (tabular features, F_max = 1
    and as written) at each (eps, delta) of :data:`CHAIN_PRIVACY`."""

    rows: list[JSONObject] = []
    for si, start in enumerate(("uniform", "first")):
        mdp = ChainMDP(start=start)
        phi = tabular_features(mdp.n_states)
        ones = np.ones(mdp.n_states)
        rng = np.random.default_rng([13, run_id, si])
        v_true = mdp.true_values()
        for m in sizes:
            batch, stats = sample_chain(mdp, m, rng)
            fit = _ChainFit(
                mdp=mdp,
                batch=batch,
                stats=stats,
                phi=phi,
                ones=ones,
                lam=lambda_schedule(m, phi, ones),
                v_true=v_true,
                base={"start": start, "m": m, "run": run_id},
            )
            th_w = lsw_fit(batch, phi, ones)
            th_l = lsl_fit(batch, phi, ones, lam=fit.lam)
            g, t, f = mdp.gamma, CHAIN_ITERATIONS, CHAIN_F_MAX
            for name, est in (
                (
                    "FQE pooled (non-private)",
                    chain_fqe(stats, pooled=True, gamma=g, iterations=t, f_max=f),
                ),
                ("FQE per-user (non-private)", chain_fqe(stats, gamma=g, iterations=t, f_max=f)),
                ("LSW", phi @ th_w),
                ("LSL", phi @ th_l),
            ):
                rows.append(
                    fit.row(name, est, f_max="", epsilon="", delta="", sigma=0.0),
                )
            for eps, delta in CHAIN_PRIVACY:
                rows += _private_rows(fit, th_w, th_l, eps, delta, rng)
    return rows


@dataclass(frozen=True)
class _ChainFit:
    """What one (start, m) cell of :func:`chain_job` shares between its rows."""

    mdp: ChainMDP
    batch: Batch
    stats: ChainStats
    phi: FloatArray
    ones: FloatArray
    lam: float
    v_true: FloatArray
    base: JSONObject

    def row(self, method: str, est: FloatArray, **cols: JSONValue) -> JSONObject:
        rmse = float(np.sqrt(np.mean((est - self.v_true) ** 2)))
        return {**self.base, "method": method, **cols, "rmse": rmse}


def _private_rows(
    fit: _ChainFit,
    th_w: FloatArray,
    th_l: FloatArray,
    eps: float,
    delta: float,
    rng: np.random.Generator,
) -> list[JSONObject]:
    """Private FQE, then DP-LSW and DP-LSL with F_max = 1 and as written, at (eps, delta)."""

    mdp, phi, ones = fit.mdp, fit.phi, fit.ones
    priv = {"epsilon": eps, "delta": delta}
    est, _mean, info = chain_fqe_release(
        fit.stats, gamma=mdp.gamma, epsilon=eps, delta=delta, rng=rng
    )
    rows = [
        fit.row("DP-FQE (qveil fqi)", est, **priv, f_max=f"{CHAIN_F_MAX:g}", sigma=info["sigma"])
    ]
    for f_max in (CHAIN_F_MAX, None):
        label = "R_max/(1-gamma)" if f_max is None else f"{f_max:g}"
        s_w = lsw_sigma(
            fit.batch.counts,
            phi,
            ones,
            epsilon=eps,
            delta=delta,
            r_max=mdp.r_max,
            gamma=mdp.gamma,
            f_max=f_max,
        )
        s_l = lsl_sigma(
            fit.batch.counts,
            phi,
            ones,
            m=fit.batch.m,
            lam=fit.lam,
            epsilon=eps,
            delta=delta,
            r_max=mdp.r_max,
            gamma=mdp.gamma,
            f_max=f_max,
        )
        eta = rng.standard_normal((2, mdp.n_states))
        rows.append(fit.row("DP-LSW", phi @ (th_w + s_w * eta[0]), **priv, f_max=label, sigma=s_w))
        rows.append(fit.row("DP-LSL", phi @ (th_l + s_l * eta[1]), **priv, f_max=label, sigma=s_l))
    return rows


# ----------------------------------------------------------------------------- summaries
CHAIN_KEYS = ("start", "method", "f_max", "epsilon", "delta", "m")
CHAIN_FIELDS = [*CHAIN_KEYS, "runs", "rmse_mean", "rmse_se", "sigma"]


def summarise_chain(rows: Sequence[JSONObject]) -> list[JSONObject]:
    groups: dict[tuple[Hashable, ...], list[JSONObject]] = defaultdict(list)
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
