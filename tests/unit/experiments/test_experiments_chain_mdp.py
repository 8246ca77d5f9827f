"""The chain MDP of BGP16 Section 6 (qveil.experiments.chain_mdp): a batch's sufficient
statistics, the exact values against first-visit Monte Carlo, the chunked sampler, the
feature maps, and each bad parameter refused."""

from __future__ import annotations

import numpy as np
import pytest

from qveil.errors import InvalidArgument
from qveil.experiments.chain_mdp import Batch, ChainMDP, pairs_features, tabular_features


def test_signature_and_mean_returns() -> None:
    """Trajectory 1 visits states 0 and 1 with first-visit returns 0.5 and 0.8, trajectory 2
    state 0 only with 0.25: |X| = (2, 1, 0) and F_X = (0.375, 0.8, 0)."""
    b = Batch.from_returns(
        [[0.5, 0.8, 0.0], [0.25, 0.0, 0.0]], [[True, True, False], [True, False, False]]
    )
    assert b.m == 2
    assert b.counts.tolist() == [2, 1, 0]
    np.testing.assert_allclose(b.mean_returns(), [0.375, 0.8, 0.0])


def test_chain_values_and_monte_carlo_agree() -> None:
    mdp = ChainMDP(n_states=6, p_stay=0.5, gamma=0.9, start="first")
    v = mdp.true_values()
    assert v[-1] == 0.0
    assert v[-2] == pytest.approx(0.5 / (1 - 0.45))
    b = mdp.sample(20_000, np.random.default_rng(1))
    assert b.counts.tolist() == [20_000] * 6
    # the first-visit returns are unbiased: sd of a return < 1, so 5 sigma = 5/sqrt(2e4)
    np.testing.assert_allclose(b.mean_returns(), v, atol=0.035)
    # a wrong discount (0.95) would be off by far more than that
    assert np.max(np.abs(ChainMDP(n_states=6, gamma=0.95).true_values() - v)) > 0.1
    u = ChainMDP(n_states=6, start="uniform").sample(5000, np.random.default_rng(2))
    # state s is visited iff the start is <= s: counts increase along the chain
    assert np.all(np.diff(u.counts) >= 0) and u.counts[-1] == 5000


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"start": "middle"}, "start must be 'uniform' or 'first', got 'middle'"),
        ({"n_states": 1}, "n_states must be >= 2, got 1"),
        ({"p_stay": 1.0}, r"p_stay must be in \[0, 1\), got 1.0"),
        ({"gamma": 1.0}, r"gamma must be in \(0, 1\), got 1.0"),
    ],
)
def test_bad_parameters_are_refused(kw: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        ChainMDP(**kw)  # type: ignore[arg-type]


def test_bad_batches_are_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"returns \(2, 3\) and visited \(2, 2\)"):
        Batch.from_returns(np.zeros((2, 3)), np.zeros((2, 2), bool))
    with pytest.raises(InvalidArgument, match="batch size must be >= 1, got 0"):
        ChainMDP().sample(0, np.random.default_rng(0))


def test_the_sampler_works_in_chunks_and_shows_each() -> None:
    seen: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    mdp = ChainMDP(n_states=5, start="first")

    def shapes(hold: np.ndarray, visited: np.ndarray) -> None:
        seen.append((hold.shape, visited.shape))

    b = mdp.sample(25, np.random.default_rng(4), chunk=10, on_chunk=shapes)
    assert seen == [((10, 4), (10, 5)), ((10, 4), (10, 5)), ((5, 4), (5, 5))]
    assert b.m == 25 and b.counts.tolist() == [25] * 5 and b.return_sums[-1] == 0.0
    # p_stay 0: every holding time is 1, so the return of state s is gamma ** (N - 2 - s)
    sure = ChainMDP(n_states=4, p_stay=0.0, gamma=0.5, start="first").sample(
        3, np.random.default_rng(0)
    )
    np.testing.assert_allclose(sure.mean_returns(), [0.25, 0.5, 1.0, 0.0])


def test_feature_maps() -> None:
    np.testing.assert_array_equal(tabular_features(3), np.eye(3))
    phi = pairs_features(5)
    assert phi.shape == (5, 3)
    assert phi.argmax(axis=1).tolist() == [0, 0, 1, 1, 2] and phi.sum(axis=1).tolist() == [1] * 5
