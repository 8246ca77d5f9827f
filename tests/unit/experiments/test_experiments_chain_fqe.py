"""The utility experiment's chain part: the private FQE's sensitivity bound under one user's
trajectory replaced, its non-private fixed points, and that its statistics and BGP16's batch
come from the same draws as ChainMDP.sample."""

from __future__ import annotations

import numpy as np

from qveil.experiments.chain_fqe import (
    ChainStats,
    chain_fqe,
    chain_fqe_release,
    chain_sensitivity,
    sample_chain,
)
from qveil.experiments.chain_mdp import ChainMDP


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


def test_sample_chain_draws_what_chain_mdp_samples() -> None:
    """The per-user statistics come with BGP16's batch of the very same trajectories: the
    batch equals ChainMDP.sample's from the same generator, and every trajectory visiting a
    non-absorbing state counts in both."""
    for start in ("uniform", "first"):
        mdp = ChainMDP(start=start)
        batch, stats = sample_chain(mdp, 123, np.random.default_rng(3), chunk=50)
        ref = mdp.sample(123, np.random.default_rng(3), chunk=50)
        assert np.array_equal(batch.counts, ref.counts)
        assert np.array_equal(batch.return_sums, ref.return_sums)
        assert np.array_equal(stats.visits, batch.counts[:-1])
        assert stats.m == 123 and np.all(stats.samples >= stats.visits)
