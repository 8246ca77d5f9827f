"""The accountant of the d-coordinate estimator (qveil.privacy.kfqi): Delta = D_T
sqrt(m / (4 lam)), recomputable from the recorded parameters alone; sigma against an
independent solver of the analytic Gaussian mechanism (Balle & Wang 2018, Theorem 8, written
out with scipy). Its empirical audit over seeded releases: test_kfqi.py."""

from __future__ import annotations

import math

import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from qveil.errors import InvalidArgument
from qveil.kfqi import KernelFQISpec
from qveil.privacy.events import account_params
from qveil.privacy.kfqi import KernelFQIPrivacyParams, calibrate_kernel_fqi


def test_accountant_kernel_variant() -> None:
    p = KernelFQIPrivacyParams(
        neighbour="user",
        users=10_000,
        reward_range=(0.0, 1.0),
        gamma=0.8,
        iterations=20,
        actions=2,
        dims=4,
        betas=(2.0,) * 4,
        lam=0.05,
        anchor_points=6,
        inducing_points=11,
        delta=1e-5,
    )
    res = calibrate_kernel_fqi(p, epsilon=1.0)
    dt = (1 - 0.8**20) / (10_000 * 0.2**2)
    assert res.sup_sensitivity == pytest.approx(dt, rel=1e-12)
    assert res.kappa == pytest.approx(5.0)
    assert res.sensitivity == pytest.approx(dt * math.sqrt(2 * 5.0), rel=1e-8)
    assert res.epsilon == pytest.approx(1.0, rel=1e-6)
    assert res.noise_to_value == pytest.approx(res.sigma * 2 / 5.0)
    again = account_params(res.to_dict()["params"])  # recomputed from the record alone
    assert again.epsilon == pytest.approx(res.epsilon, rel=1e-12)
    assert "kernel" in again.basis and "clipped" in again.basis
    with pytest.raises(InvalidArgument):
        KernelFQIPrivacyParams.from_dict({**p.to_dict(), "betas": [1.0]})
    with pytest.raises(InvalidArgument):
        KernelFQISpec(gamma=0.5, iterations=1, betas=(1.0,) * 6, anchor_points=12)


def _independent_sigma(eps: float, delta: float, sens: float) -> float:
    """Balle & Wang 2018 Theorem 8 written out with scipy, solved by brentq on sigma."""

    def gap(sigma: float) -> float:
        a, b = sens / (2 * sigma), eps * sigma / sens
        return norm.cdf(a - b) - math.exp(eps) * norm.cdf(-a - b) - delta

    return brentq(gap, 1e-6 * sens, 1e4 * sens, xtol=1e-14, rtol=1e-13)


@pytest.mark.parametrize(
    "eps,delta,neighbour,users,gamma",
    [
        (1.0, 1e-5, "user", 300, 0.3),
        (0.25, 1e-5, "user", 1000, 0.5),
        (4.0, 1e-6, "reward", 100, 0.9),
        (0.5, 1e-3, "reward", 30, 0.0),
    ],
)
def test_kernel_sigma_matches_an_independent_solver(
    eps: float, delta: float, neighbour: str, users: int, gamma: float
) -> None:
    """The d = 1 release's sigma, as the analytic Gaussian mechanism written out with scipy
    gives it for Delta = D_T sqrt(m / (4 lam))."""
    p = KernelFQIPrivacyParams(
        neighbour=neighbour, users=users, reward_range=(0.0, 0.5), gamma=gamma, iterations=10,
        actions=2, dims=1, betas=(3.0,), lam=0.05, anchor_points=101, inducing_points=41,
        delta=delta,
    )  # fmt: skip
    r = calibrate_kernel_fqi(p, epsilon=eps)
    assert r.sigma == pytest.approx(_independent_sigma(eps, delta, r.sensitivity), rel=1e-7)
    assert r.epsilon == pytest.approx(eps, rel=1e-7) and r.holds
    assert r.sensitivity == pytest.approx(
        r.sup_sensitivity * math.sqrt(2 / (4 * 0.05)) * (1 + 1e-9), rel=1e-12
    )
    assert r.noise_to_value == pytest.approx(r.sigma / (0.5 / (1 - gamma)))
