"""GDP and analytic-Gaussian primitives: closed forms, inverses, and two independent
cross-checks (direct numerical integration of the privacy-loss integral, and a numerically
convolved privacy-loss distribution for composition)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

import qveil.privacy as qp
from qveil.errors import InvalidArgument
from qveil.privacy.gaussian import (
    analytic_gaussian_delta,
    analytic_gaussian_epsilon,
    analytic_gaussian_sigma,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
)


def test_public_api_sorted_and_complete() -> None:
    assert qp.__all__ == sorted(qp.__all__)
    for name in (
        "PrivacyParams",
        "PrivacyResult",
        "account",
        "calibrate",
        "PrivacyEvent",
        "compose",
        "check_budget",
    ):
        assert name in qp.__all__ and hasattr(qp, name)


def _delta_by_integration(eps: float, mu: float) -> float:
    """delta(eps) = int max(0, p0(y) - e^eps p1(y)) dy for P0 = N(0,1), P1 = N(mu,1): the
    definition of the tight delta (hockey-stick divergence), integrated numerically.
    p0 > e^eps p1 exactly for y < y* = mu/2 - eps/mu."""
    y_star = mu / 2.0 - eps / mu
    f = lambda y: stats.norm.pdf(y) - math.exp(eps) * stats.norm.pdf(y, loc=mu)  # noqa: E731
    val, err = integrate.quad(f, -np.inf, y_star, epsabs=0.0, epsrel=1e-11, limit=200)
    return val


@pytest.mark.parametrize("mu", [0.05, 0.3, 1.0, 2.5, 6.0])
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.9, 3.0])
def test_gdp_delta_matches_numerical_integration(eps: float, mu: float) -> None:
    want = _delta_by_integration(eps, mu)
    got = gdp_delta(epsilon=eps, mu=mu)
    if want < 1e-200:
        assert got < 1e-200
    else:
        assert got == pytest.approx(want, rel=1e-7)


def test_gdp_closed_form_values() -> None:
    # eps = 0: delta = total variation = 2 Phi(mu/2) - 1
    for mu in (0.1, 1.0, 4.0):
        assert gdp_delta(epsilon=0.0, mu=mu) == pytest.approx(
            2 * stats.norm.cdf(mu / 2) - 1, rel=1e-13
        )
    # mu = 1, eps = 1: Phi(-1/2) - e Phi(-3/2), hand-evaluable
    want = stats.norm.cdf(-0.5) - math.e * stats.norm.cdf(-1.5)
    assert gdp_delta(epsilon=1.0, mu=1.0) == pytest.approx(want, rel=1e-13)
    assert gdp_delta(epsilon=1.0, mu=0.0) == 0.0


def test_gdp_delta_extreme_arguments_are_finite() -> None:
    # the naive e^eps Phi(b) overflows (e^800 = inf); ours stays a number in [0, 1)
    for eps in (50.0, 800.0, 1e5):
        for mu in (1e-3, 1.0, 50.0):
            d = gdp_delta(epsilon=eps, mu=mu)
            assert 0.0 <= d <= 1.0 and math.isfinite(d)
    # tiny deltas keep relative precision: compare with 50-digit arithmetic (mpmath)
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    for eps, mu in ((30.0, 2.0), (100.0, 5.0), (8.0, 0.5), (1e-3, 1e-3)):
        e, m = mpmath.mpf(eps), mpmath.mpf(mu)
        want = mpmath.ncdf(-e / m + m / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2)
        assert gdp_delta(epsilon=eps, mu=mu) == pytest.approx(float(want), rel=1e-9)


def test_one_gaussian_mechanism_equals_gdp() -> None:
    """GDP with one step (mu = Delta/sigma) is the analytic Gaussian mechanism (BW18 Thm 8)."""
    for sens, sigma in ((1.0, 1.0), (0.3, 2.0), (5.0, 0.7)):
        for eps in (0.05, 0.5, 2.0):
            bw = stats.norm.cdf(sens / (2 * sigma) - eps * sigma / sens) - math.exp(
                eps
            ) * stats.norm.cdf(-sens / (2 * sigma) - eps * sigma / sens)
            a = analytic_gaussian_delta(epsilon=eps, sensitivity=sens, sigma=sigma)
            g = gdp_delta(epsilon=eps, mu=sens / sigma)
            assert a == g
            assert a == pytest.approx(bw, rel=1e-10)


@pytest.mark.parametrize("delta", [1e-12, 1e-8, 1e-5, 1e-3, 0.1])
def test_epsilon_inverse_round_trip_and_never_too_small(delta: float) -> None:
    for mu in np.geomspace(1e-3, 30.0, 23):
        eps = gdp_epsilon(delta=delta, mu=float(mu))
        assert gdp_delta(epsilon=eps, mu=float(mu)) <= delta  # verified, never overshoots
        if eps > 0:
            # tight: a slightly smaller epsilon violates delta
            assert gdp_delta(epsilon=eps * (1 - 1e-9), mu=float(mu)) > delta
            # and mu -> eps -> mu round-trips
            back = gdp_mu(epsilon=eps, delta=delta)
            assert back == pytest.approx(float(mu), rel=1e-8)
            assert gdp_delta(epsilon=eps, mu=back) <= delta


@pytest.mark.parametrize("eps", [0.01, 0.45, 0.9, 5.0, 40.0])
@pytest.mark.parametrize("delta", [1e-10, 1e-5, 1e-2])
def test_analytic_sigma_is_smallest_and_meets_target(eps: float, delta: float) -> None:
    for sens in (0.1, 1.0, 19.0):
        s = analytic_gaussian_sigma(epsilon=eps, delta=delta, sensitivity=sens)
        assert analytic_gaussian_delta(epsilon=eps, sensitivity=sens, sigma=s) <= delta
        assert analytic_gaussian_delta(epsilon=eps, sensitivity=sens, sigma=s * (1 - 1e-9)) > delta
        # eps(sigma) is the conservative end of a bisection to adjacent doubles
        assert analytic_gaussian_epsilon(delta=delta, sensitivity=sens, sigma=s) <= eps * (
            1 + 1e-12
        )


def test_analytic_beats_classic_gaussian_for_eps_below_one() -> None:
    """Sanity: the tight sigma is below Dwork & Roth's sqrt(2 ln(1.25/delta)) Delta / eps."""
    for eps in (0.1, 0.5, 0.9):
        classic = math.sqrt(2 * math.log(1.25 / 1e-5)) / eps
        assert analytic_gaussian_sigma(epsilon=eps, delta=1e-5, sensitivity=1.0) < classic


def _composed_delta_by_pld(eps: float, mu_step: float, n: int) -> float:
    """Independent check of exact composition: discretise one Gaussian mechanism's privacy
    loss L = log p0/p1 ~ N(mu^2/2, mu^2) (under P0) on a fine grid, convolve it n times by
    FFT, and evaluate delta(eps) = E[(1 - e^(eps - L))_+] (the hockey-stick divergence).
    Does not use the GDP composition theorem or its closed form."""
    h = 2e-4
    total_mean, total_sd = n * mu_step**2 / 2, math.sqrt(n) * mu_step
    half = total_mean + 14 * total_sd + 14 * mu_step
    size = 1 << int(math.ceil(math.log2(2 * half / h + 1)))
    # one-step pmf on the grid l_j = j h (circular, centred at 0), by cdf differences
    j = np.arange(size)
    j = np.where(j < size // 2, j, j - size).astype(np.float64)
    edges_lo, edges_hi = (j - 0.5) * h, (j + 0.5) * h
    m, s = mu_step**2 / 2, mu_step
    pmf = stats.norm.cdf(edges_hi, m, s) - stats.norm.cdf(edges_lo, m, s)
    total = np.fft.irfft(np.fft.rfft(pmf) ** n, n=size)
    total = np.clip(total, 0.0, None)
    losses = j * h
    return float(np.sum(total * np.clip(-np.expm1(eps - losses), 0.0, None)))


@pytest.mark.parametrize(("mu_step", "n"), [(0.27 / math.sqrt(80), 80), (0.25, 10), (0.9, 4)])
def test_exact_composition_matches_numerical_pld(mu_step: float, n: int) -> None:
    mu = math.sqrt(n) * mu_step
    for eps in (0.2, 0.9, 2.0):
        want = _composed_delta_by_pld(eps, mu_step, n)
        got = gdp_delta(epsilon=eps, mu=mu)
        assert got == pytest.approx(want, rel=2e-3, abs=1e-12)
    # what a wrong composition would score: basic composition of n per-step epsilons at the
    # same delta is far larger than the exact one
    d = 1e-5
    per_step = gdp_epsilon(delta=d / n, mu=mu_step)
    assert n * per_step > 1.5 * gdp_epsilon(delta=d, mu=mu)


@pytest.mark.parametrize(
    ("fn", "kwargs", "fragment"),
    [
        (gdp_delta, {"epsilon": -0.1, "mu": 1.0}, "-0.1"),
        (gdp_delta, {"epsilon": 1.0, "mu": float("nan")}, "nan"),
        (gdp_epsilon, {"delta": 0.0, "mu": 1.0}, "delta"),
        (gdp_epsilon, {"delta": 1.0, "mu": 1.0}, "1.0"),
        (gdp_epsilon, {"delta": 1e-5, "mu": -2.0}, "-2.0"),
        (gdp_mu, {"epsilon": 0.0, "delta": 1e-5}, "0.0"),
        (gdp_mu, {"epsilon": float("inf"), "delta": 1e-5}, "inf"),
        (analytic_gaussian_delta, {"epsilon": 1.0, "sensitivity": 1.0, "sigma": 0.0}, "sigma"),
        (analytic_gaussian_sigma, {"epsilon": 1.0, "delta": 1e-5, "sensitivity": True}, "True"),
    ],
)
def test_bad_input_names_the_value(fn, kwargs, fragment) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgument, match=None) as exc:
        fn(**kwargs)
    assert fragment in str(exc.value)


def test_keyword_only() -> None:
    with pytest.raises(TypeError):
        gdp_delta(1.0, 1.0)  # type: ignore[misc]
