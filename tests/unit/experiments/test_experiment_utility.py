"""The utility experiment's own math: the gamma-shared FQI fit, and the chain's private FQE
(its sensitivity bound under one user's trajectory replaced, its non-private fixed point)."""

from __future__ import annotations

import numpy as np
import pytest

from qveil.experiments.chain_mdp import ChainMDP
from qveil.experiments.utility import (
    ChainStats,
    chain_fqe,
    chain_fqe_release,
    chain_sensitivity,
    fit_variants,
    sample_chain,
)


def test_fit_variants_equals_fitted_q() -> None:
    """Sharing the averaging operators across gammas changes nothing: equal to fitted_q to
    1e-12 for both relations (a wrong default weight would be off by ~0.1)."""
    pytest.importorskip("gymnasium")
    from qveil.fqi import FQISpec, fitted_q
    from qveil.fqi_config import FQIConfig
    from qveil.noise import StateInterval
    from qveil.trainer.collect import collect

    cfg = FQIConfig()
    ds = collect("qveil/LineWalk-v0", 60, 3)
    for rel in ("user", "reward"):
        fits = fit_variants(ds, relation=rel, gammas=[0.3, 0.9], cfg=cfg, reward_range=(0, 0.5))
        for g, q in fits.items():
            ref = fitted_q(
                ds.s,
                ds.a,
                ds.r,
                ds.s2,
                ds.terminal,
                ds.user,
                n_actions=2,
                reward_range=(0.0, 0.5),
                interval=StateInterval(0.0, 1.0),
                spec=FQISpec(gamma=g, iterations=cfg.iterations, neighbour=rel),
            )
            assert np.abs(ref - q).max() < 1e-12


def _one_user(n: int, hold: np.ndarray, visit: np.ndarray) -> ChainStats:
    v = visit.astype(float)
    return ChainStats(1, v, v * (hold - 1) / hold, v / hold, v * hold)


def _add(a: ChainStats, b: ChainStats) -> ChainStats:
    return ChainStats(
        a.m + b.m, a.visits + b.visits, a.stay + b.stay, a.move + b.move, a.samples + b.samples
    )


def test_chain_sensitivity_holds_for_adversarial_neighbours() -> None:
    """max |Q_T - Q_T'| <= D_T when one user's trajectory is replaced, over random and
    extreme users (visits nothing / everything, holding 1 or 1e6 steps). Users that follow
    the chain's structure reach about 6 % of D_T (the bound covers any data, e.g. targets
    pinned at 0 or f_max everywhere, which these statistics cannot express); a D_T computed
    with m replaced by m^2, or the contraction sum dropped (T = 1), would be exceeded."""
    mdp = ChainMDP()
    rng = np.random.default_rng(5)
    n = mdp.n_states
    worst = 0.0
    for m in (5, 50):
        _, rest = sample_chain(mdp, m - 1, rng)
        extremes = [
            _one_user(n, np.ones(n - 1), np.zeros(n - 1, bool)),
            _one_user(n, np.ones(n - 1), np.ones(n - 1, bool)),
            _one_user(n, np.full(n - 1, 1e6), np.ones(n - 1, bool)),
        ]
        for _ in range(20):
            extremes.append(
                _one_user(n, rng.integers(1, 9, n - 1).astype(float), rng.random(n - 1) < 0.5)
            )
        d_t = chain_sensitivity(users=m, gamma=mdp.gamma, iterations=80, f_max=1.0)
        qs = [chain_fqe(_add(rest, u), gamma=mdp.gamma, iterations=80, f_max=1.0) for u in extremes]
        for i in range(len(qs)):
            for j in range(i):
                gap = float(np.abs(qs[i] - qs[j]).max())
                assert gap <= d_t * (1 + 1e-12)
                worst = max(worst, gap / d_t)
    assert worst > 0.03


def test_chain_fqe_fixed_points() -> None:
    """With many users the pooled (non-private) FQE reaches the chain's true values, and the
    per-user averager settles at its own, biased, fixed point (reported in docs/results.md)."""
    mdp = ChainMDP(start="first")
    _, stats = sample_chain(mdp, 20_000, np.random.default_rng(1))
    v = mdp.true_values()
    pooled = chain_fqe(stats, gamma=mdp.gamma, iterations=400, f_max=1.0, pooled=True)
    per_user = chain_fqe(stats, gamma=mdp.gamma, iterations=400, f_max=1.0)
    assert np.sqrt(np.mean((pooled - v) ** 2)) < 0.01
    assert np.sqrt(np.mean((per_user - v) ** 2)) > 0.03
    est, mean, info = chain_fqe_release(
        stats, gamma=mdp.gamma, epsilon=1.0, delta=1e-5, rng=np.random.default_rng(2)
    )
    assert est.shape == (n := mdp.n_states,) and est[n - 1] == 0.0 and mean[n - 1] == 0.0
    assert info["sigma"] > 0 and info["kappa"] > 1
