"""BGP16's LSW / LSL / DP-LSW / DP-LSL on the chain MDP: estimators, noise scales by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qveil.errors import InvalidArgument
from qveil.experiments.bgp16 import (
    dp_lsw,
    lsl_fit,
    lsl_psi,
    lsl_sigma,
    lsw_fit,
    lsw_psi,
    lsw_sigma,
    smooth_params,
)
from qveil.experiments.chain_mdp import Batch, pairs_features, tabular_features

# A small dataset: N = 3 states, m = 2 trajectories; trajectory 1 visits states 0 and 1 with
# first-visit returns 0.5 and 0.8, trajectory 2 visits state 0 only with return 0.25. So the
# signature is |X| = (2, 1, 0) and F_X = (0.375, 0.8, 0).
RETURNS = np.array([[0.5, 0.8, 0.0], [0.25, 0.0, 0.0]])
VISITED = np.array([[True, True, False], [True, False, False]])
EPS, DELTA = 1.0, 0.1
R_MAX, GAMMA = 1.0, 0.5  # R_max / (1 - gamma) = 2


def small_batch() -> Batch:
    return Batch.from_returns(RETURNS, VISITED)


def test_smooth_params_closed_form() -> None:
    sp = smooth_params(epsilon=EPS, delta=DELTA, d=3)
    assert sp.alpha == pytest.approx(5 * math.sqrt(2 * math.log(20)))  # 12.2387...
    assert sp.beta == pytest.approx(1 / (4 * (3 + math.log(20))))  # 0.041696...
    assert sp.alpha == pytest.approx(12.23873, rel=1e-6)
    assert sp.beta == pytest.approx(0.0416963, rel=1e-5)


def test_dp_lsw_noise_scale_by_hand() -> None:
    """Tabular, w = 1: phi(k) = sum_s 1/max(|X_s| - k, 1)^2 over k = 0..K_X = 2:
    phi(0) = 1/4 + 1 + 1 = 2.25, phi(1) = 1 + 1 + 1 = 3, phi(2) = 3, so
    psi = max(2.25, 3 e^-beta, 3 e^-2beta) = 3 e^-beta; ||(Gamma^1/2 Phi)^+|| = 1 and
    sigma_X = alpha * 2 * sqrt(3 e^-beta)."""
    b = small_batch()
    alpha = 5 * math.sqrt(2 * math.log(20))
    beta = 1 / (4 * (3 + math.log(20)))
    w = np.ones(3)
    assert lsw_psi(b.counts, w, beta=beta) == pytest.approx(3 * math.exp(-beta))
    expected = alpha * 2.0 * math.sqrt(3 * math.exp(-beta))
    assert expected == pytest.approx(41.5216, rel=1e-5)  # the number, written out
    got = lsw_sigma(
        b.counts, tabular_features(3), w, epsilon=EPS, delta=DELTA, r_max=R_MAX, gamma=GAMMA
    )
    assert got == pytest.approx(expected, rel=1e-12)
    # weights scale out: Gamma -> 4 Gamma halves ||(Gamma^1/2 Phi)^+|| and quadruples psi
    assert lsw_sigma(
        b.counts, tabular_features(3), 4 * w, epsilon=EPS, delta=DELTA, r_max=R_MAX, gamma=GAMMA
    ) == pytest.approx(expected, rel=1e-12)
    # a public F_max replaces R_max / (1 - gamma) = 2 linearly
    assert lsw_sigma(
        b.counts,
        tabular_features(3),
        w,
        epsilon=EPS,
        delta=DELTA,
        r_max=R_MAX,
        gamma=GAMMA,
        f_max=1.0,
    ) == pytest.approx(expected / 2, rel=1e-12)


def test_dp_lsl_noise_scale_by_hand() -> None:
    """Tabular, rho = 1, lambda = 3, m = 2: ||Phi|| = 1, ||rho||_inf = 1, ||rho||_2 = sqrt 3,
    c = 1/sqrt(6); sum_s min(|X_s| + k, 2) = 3, 5, 6 for k = 0, 1, 2, so
    phi(k) = (sqrt(3/6) + sqrt 3)^2, (sqrt(5/6) + sqrt 3)^2, (1 + sqrt 3)^2 and
    sigma_X = 2 alpha * 2 * 1 / (3 - 1) * sqrt(max_k e^{-k beta} phi(k))."""
    b = small_batch()
    alpha = 5 * math.sqrt(2 * math.log(20))
    beta = 1 / (4 * (3 + math.log(20)))
    r3 = math.sqrt(3)
    phis = [(math.sqrt(3 / 6) + r3) ** 2, (math.sqrt(5 / 6) + r3) ** 2, (1 + r3) ** 2]
    psi = max(math.exp(-k * beta) * p for k, p in enumerate(phis))
    assert psi == pytest.approx(math.exp(-2 * beta) * (1 + r3) ** 2)  # k = 2 wins here
    assert lsl_psi(b.counts, np.ones(3), m=2, lam=3.0, phi_norm=1.0, beta=beta) == pytest.approx(
        psi
    )
    expected = 2 * alpha * 2.0 * 1.0 / (3.0 - 1.0) * math.sqrt(psi)
    assert expected == pytest.approx(64.1426, rel=1e-5)
    got = lsl_sigma(
        b.counts,
        tabular_features(3),
        np.ones(3),
        m=2,
        lam=3.0,
        epsilon=EPS,
        delta=DELTA,
        r_max=R_MAX,
        gamma=GAMMA,
    )
    assert got == pytest.approx(expected, rel=1e-12)


def test_dp_lsl_pairs_features_norms() -> None:
    """Pairs of 4 states: Phi has two ones per column, ||Phi|| = sqrt 2, floor = 2."""
    phi = pairs_features(4)
    assert np.linalg.norm(phi, 2) == pytest.approx(math.sqrt(2))
    counts = np.array([2, 2, 1, 1])
    with pytest.raises(InvalidArgument, match="lambda > "):
        lsl_sigma(
            counts, phi, np.ones(4), m=2, lam=2.0, epsilon=EPS, delta=DELTA, r_max=1, gamma=0.5
        )
    alpha = 5 * math.sqrt(2 * math.log(20))
    beta = 1 / (4 * (2 + math.log(20)))  # d = 2
    c = math.sqrt(2) / math.sqrt(2 * 4.0)
    phis = [(c * math.sqrt(min(2 + k, 2) * 2 + min(1 + k, 2) * 2) + 2.0) ** 2 for k in range(3)]
    psi = max(math.exp(-k * beta) * p for k, p in enumerate(phis))
    expected = 2 * alpha * 2.0 * math.sqrt(2) / (4.0 - 2.0) * math.sqrt(psi)
    got = lsl_sigma(
        counts, phi, np.ones(4), m=2, lam=4.0, epsilon=EPS, delta=DELTA, r_max=1, gamma=0.5
    )
    assert got == pytest.approx(expected, rel=1e-12)


def test_lsw_and_lsl_estimators() -> None:
    b = small_batch()
    # tabular LSW with any positive weights returns F_X itself
    np.testing.assert_allclose(
        lsw_fit(b, tabular_features(3), np.array([1.0, 2.0, 3.0])), [0.375, 0.8, 0.0], atol=1e-12
    )
    # LSL: the gradient of J_X(theta) + lambda/(2m) ||theta||^2 (eqs. (3), (10)) vanishes
    phi = pairs_features(3)
    theta = lsl_fit(b, phi, np.ones(3), lam=0.7)
    grad = np.zeros(phi.shape[1])
    for i in range(2):
        for s in range(3):
            if VISITED[i, s]:
                grad += -2 / 2 * (RETURNS[i, s] - phi[s] @ theta) * phi[s]
    grad += 0.7 / 2 * theta
    np.testing.assert_allclose(grad, 0.0, atol=1e-12)


def test_dp_lsw_noise_has_the_stated_scale() -> None:
    b = small_batch()
    rng = np.random.default_rng(3)
    draws = np.array(
        [
            dp_lsw(
                b,
                tabular_features(3),
                np.ones(3),
                epsilon=EPS,
                delta=DELTA,
                r_max=R_MAX,
                gamma=GAMMA,
                rng=rng,
            )[0]
            for _ in range(1000)
        ]
    )
    sd = (draws - [0.375, 0.8, 0.0]).std()
    assert sd == pytest.approx(41.5216, rel=0.05)  # 3000 draws: s.e. 1.3%; 1.3x would fail


def test_bad_privacy_parameters_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="epsilon"):
        smooth_params(epsilon=0.0, delta=0.1, d=3)
    with pytest.raises(InvalidArgument, match="delta"):
        smooth_params(epsilon=1.0, delta=1.0, d=3)
