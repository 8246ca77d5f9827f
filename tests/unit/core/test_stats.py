"""qveil.stats: insertion-order whitening is exactly Cholesky whitening in insertion order, and
normality_report accepts N(0, 1) and rejects near misses."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import linalg

from qveil.errors import InvalidArgument
from qveil.noise import OUSamplePath, ou_covariance
from qveil.stats import DEFAULT_PASS_LEVEL, chi2_bins, normality_report, whiten


def test_whiten_equals_cholesky_in_insertion_order() -> None:
    """The innovations in insertion order are L^-1 g for L = chol(C) with C in that order
    (chain rule): an independent check of the sorted-neighbour replay."""
    rng = np.random.default_rng(1)
    xs = rng.random(60)
    xs[7] = xs[3] + 1e-9
    beta, sigma = 12.0, 0.9
    gs = OUSamplePath(beta=beta, sigma=sigma, rng=2).sample(xs)
    chol = linalg.cholesky(ou_covariance(xs, beta=beta, sigma=sigma), lower=True)
    ref = linalg.solve_triangular(chol, gs, lower=True)
    np.testing.assert_allclose(whiten(xs, gs, beta=beta, sigma=sigma), ref, rtol=1e-6, atol=1e-6)


def test_whiten_a_big_path_passes_and_wrong_parameters_fail() -> None:
    """20k points in random order at beta = 2222: the true (beta, sigma) passes; sigma x 1.05
    or beta x 1.1 in the whitening is already rejected (var ~0.91, var_p ~1e-17)."""
    xs = np.random.default_rng(3).random(20_000)
    gs = OUSamplePath(beta=2222.0, sigma=0.5, rng=4).sample(xs)
    assert normality_report(whiten(xs, gs, beta=2222.0, sigma=0.5))["passed"]
    for beta, sigma in [(2222.0, 0.525), (2444.2, 0.5)]:
        rep = normality_report(whiten(xs, gs, beta=beta, sigma=sigma))
        assert not rep["passed"] and rep["var_p"] < 1e-12, rep


def test_whiten_rejects_bad_input() -> None:
    with pytest.raises(InvalidArgument):
        whiten([0.1, 0.1], [0.0, 0.0], beta=1.0, sigma=1.0)  # duplicate state
    with pytest.raises(InvalidArgument):
        whiten([0.1, 0.2], [0.0], beta=1.0, sigma=1.0)
    with pytest.raises(InvalidArgument):
        whiten([0.1, 0.2], [0.0, math.nan], beta=1.0, sigma=1.0)
    with pytest.raises(InvalidArgument):
        whiten([0.1, 0.2], [0.0, 0.0], beta=1.0, sigma=0.0)
    with pytest.raises(InvalidArgument):
        whiten([0.1, 1.2], [0.0, 0.0], beta=1.0, sigma=1.0)


def test_normality_report_fields_and_level() -> None:
    z = np.random.default_rng(5).standard_normal(5000)
    rep = normality_report(z)
    assert set(rep) >= {"n", "ks_p", "chi2_p", "mean", "var", "passed", "mean_p", "var_p"}
    assert rep["n"] == 5000 and rep["passed"] and rep["level"] == DEFAULT_PASS_LEVEL
    assert rep["bins"] == chi2_bins(5000) == 60
    assert not normality_report(z, level=0.999)["passed"]


@pytest.mark.parametrize(
    ("name", "transform"),
    [
        ("scale x 1.1", lambda z: 1.1 * z),
        ("scale x 0.9", lambda z: 0.9 * z),
        ("shift 0.1", lambda z: z + 0.1),
        ("t(5) tails", None),
    ],
)
def test_normality_report_rejects_near_misses(name: str, transform: object) -> None:
    rng = np.random.default_rng(6)
    z = (
        rng.standard_t(5, 20_000) * math.sqrt(3 / 5)
        if transform is None
        else transform(rng.standard_normal(20_000))
    )  # type: ignore[operator]
    assert not normality_report(z)["passed"], name


def test_normality_report_rejects_bad_input() -> None:
    for bad in [np.zeros(5), [math.nan] * 30]:
        with pytest.raises(InvalidArgument):
            normality_report(bad)
    with pytest.raises(InvalidArgument):
        normality_report(np.zeros(30), level=0.0)
