"""Shared helpers for the noise tests (qveil.noise, qveil.keyed) and the tests of served noise:
independent reference implementations and deliberately wrong samplers.

* :func:`dense_conditional` -- GP conditioning by dense linear algebra in 60-digit arithmetic
  (mpmath), the reference every exact conditional is compared with; it knows nothing of the
  Markov property or of expm1.
* :func:`dense_whiten` -- whitening by the Cholesky factor of the exact dense covariance.
* :func:`conformance` -- the statistical conformance run: many independent seeded paths, each
  sampled at the same fixed states in its own random order (random batch sizes), judged by KS +
  chi-square (+ mean, variance) on the dense-whitened values, by the empirical covariance
  against sigma^2 exp(-beta |x - y|) with a bound derived from the number of paths, and by
  insertion-order whitening (:func:`qveil.stats.whiten`).
* :func:`assert_unseeded_law` -- the one verdict for noise that no seed fixes (OS entropy:
  a release key from ``new_key``), at :data:`UNSEEDED_LAW_LEVEL`, with its power shown on the
  same points under a wrong law.
* :class:`PaperEq2Path` -- Algorithm 1, line 16 with the paper's Appendix A equation (2) *as
  printed* (swapped weights, variance that goes negative, phantom neighbours g(0) = g(1) = 0,
  variance sigma * d): a wrong sampler the tests must reject. :class:`ScaledPath` makes the
  other wrong samplers (sigma x 1.3, sigma x 0.7, beta x 2) out of the real one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import mpmath
import numpy as np
import numpy.typing as npt
from scipy import linalg
from scipy.stats import norm

from qveil.noise import OUSamplePath, conditional_moments, ou_covariance
from qveil.stats import normality_report, whiten

FloatArray = npt.NDArray[np.float64]
MP_DPS = 60

#: Pass level per p-value for a statistical verdict on noise that no seed fixes (OS entropy:
#: qveil.rng.OSEntropy, or the values of a release whose key came from qveil.keyed.new_key).
#: A correct sampler fails one verdict (four p-values) with probability <= 4 x 2e-7 = 8e-7,
#: under the suite's bound of 1e-6 per test for a test with one verdict. (The audit's own
#: 1e-3 is a production setting for one look at one store; asserted on unseeded noise, it
#: would fail a correct release about once in 250 looks.)
UNSEEDED_LAW_LEVEL = 2e-7


class Sampler(Protocol):
    def sample(self, xs: npt.ArrayLike) -> FloatArray: ...

    def points(self) -> tuple[FloatArray, FloatArray]: ...


def assert_unseeded_law(
    xs: npt.ArrayLike, gs: npt.ArrayLike, *, beta: float, sigma: float, wrong: float = 1.3
) -> dict[str, Any]:
    """Assert that a stored path, replayed in insertion order, whitens to iid N(0, 1) at
    :data:`UNSEEDED_LAW_LEVEL`, and that the same points judged under a wrong law (sigma x
    ``wrong``: what a sampler with the wrong variance would store) fail at that level, so the
    verdict has power at this n. Returns the passing report."""
    rep = normality_report(whiten(xs, gs, beta=beta, sigma=sigma), level=UNSEEDED_LAW_LEVEL)
    assert rep["passed"], f"the GP law is rejected: {rep}"
    bad = normality_report(whiten(xs, gs, beta=beta, sigma=wrong * sigma), level=UNSEEDED_LAW_LEVEL)
    assert not bad["passed"], f"no power at n={rep['n']}: sigma x {wrong} passes: {bad}"
    return rep


# -- references -------------------------------------------------------------------------------


def dense_conditional(
    x: float | str,
    obs_x: Sequence[float | str],
    obs_g: Sequence[float],
    *,
    beta: float,
    sigma: float,
) -> tuple[float, float]:
    """(mean, std) of g(x) given g(obs_x) = obs_g, by dense GP conditioning in 60 digits.

    mean = k^T K^-1 g, var = sigma^2 - k^T K^-1 k with K = sigma^2 exp(-beta |xi - xj|).
    Positions may be given as strings (exact decimals) so distances such as 1e-12 are exact.
    """
    with mpmath.workdps(MP_DPS):
        b, s2 = mpmath.mpf(beta), mpmath.mpf(sigma) ** 2
        xs = [mpmath.mpf(v) for v in obs_x]
        x0 = mpmath.mpf(x)
        n = len(xs)
        kmat = mpmath.matrix(n, n)
        for i in range(n):
            for j in range(n):
                kmat[i, j] = s2 * mpmath.exp(-b * abs(xs[i] - xs[j]))
        kvec = mpmath.matrix([s2 * mpmath.exp(-b * abs(x0 - xi)) for xi in xs])
        gvec = mpmath.matrix([mpmath.mpf(v) for v in obs_g])
        w = mpmath.lu_solve(kmat, kvec)  # K^-1 k
        mean = sum(w[i] * gvec[i] for i in range(n))
        var = s2 - sum(w[i] * kvec[i] for i in range(n))
        return float(mean), float(mpmath.sqrt(var))


def dense_whiten(states: FloatArray, gs: FloatArray, *, beta: float, sigma: float) -> FloatArray:
    """Rows of ``gs`` (paths x len(states)) whitened by the Cholesky factor of the exact
    covariance at ``states``: L^-1 g ~ iid N(0, 1) under the true law, whatever the order the
    values were drawn in."""
    chol = linalg.cholesky(ou_covariance(states, beta=beta, sigma=sigma), lower=True)
    z: FloatArray = linalg.solve_triangular(chol, gs.T, lower=True).T
    return z


def covariance_max_z(gs: FloatArray, cov: FloatArray) -> float:
    """max over i <= j of |c_ij - C_ij| / sd(c_ij), c = G^T G / P the empirical covariance
    (mean known to be 0) of P Gaussian rows; sd(c_ij) = sqrt((C_ii C_jj + C_ij^2) / P)."""
    p = gs.shape[0]
    emp = gs.T @ gs / p
    sd = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / p)
    iu = np.triu_indices(cov.shape[0])
    return float(np.max(np.abs(emp - cov)[iu] / sd[iu]))


def covariance_bound(n_states: int, alpha: float = 1e-4) -> float:
    """Bonferroni threshold for :func:`covariance_max_z`: the true law exceeds it with
    probability <= ``alpha`` (n(n+1)/2 entries, each asymptotically N(0, 1))."""
    m = n_states * (n_states + 1) // 2
    return float(norm.isf(alpha / (2 * m)))


# -- wrong samplers ---------------------------------------------------------------------------


def paper_eq2_moments(
    beta: float, s: float, s_minus: float, g_minus: float, s_plus: float, g_plus: float
) -> tuple[float, float]:
    """(mu, d) of the paper's equation (2) exactly as printed (Appendix A). Wrong on purpose:
    the weights of g(s-) and g(s+) are swapped and d can be negative (about -1.15 at
    beta = 7.3, d1 = 0.11, d2 = 0.19)."""

    def two_sinh(u: float) -> float:  # exp(u) - exp(-u), as printed
        return math.exp(u) - math.exp(-u)

    u, v, w = beta * (s - s_minus), beta * (s_plus - s), beta * (s_plus - s_minus)
    mu = (two_sinh(u) * g_minus + two_sinh(v) * g_plus) / two_sinh(w)
    d = 1.0 - (two_sinh(u) * math.exp(u) + two_sinh(v) * math.exp(v)) / two_sinh(w)
    return mu, d


class PaperEq2Path:
    """Algorithm 1 line 16 as printed: z ~ N(mu, sigma d) by equation (2), missing neighbours
    treated as s- = 0, s+ = 1 with value 0, and a negative "variance" clamped to 0.

    ``swapped_mean_only=True`` isolates one error: the exact sampler except that a bridge's
    mean uses equation (2)'s swapped weights (what a reader who fixed only the variance
    would ship)."""

    def __init__(
        self,
        *,
        beta: float,
        sigma: float,
        rng: np.random.Generator,
        swapped_mean_only: bool = False,
    ) -> None:
        self.beta, self.sigma, self.rng = beta, sigma, rng
        self.swapped_mean_only = swapped_mean_only
        self._g: dict[float, float] = {}

    def _moments(self, x: float) -> tuple[float, float]:
        left = [k for k in self._g if k < x]
        right = [k for k in self._g if k > x]
        sm = max(left) if left else 0.0
        sp = min(right) if right else 1.0
        mu, d = paper_eq2_moments(self.beta, x, sm, self._g.get(sm, 0.0), sp, self._g.get(sp, 0.0))
        if not self.swapped_mean_only:
            return mu, math.sqrt(max(self.sigma * d, 0.0))
        mean, std = conditional_moments(
            beta=self.beta,
            sigma=self.sigma,
            d_left=x - sm if left else None,
            g_left=self._g[sm] if left else None,
            d_right=sp - x if right else None,
            g_right=self._g[sp] if right else None,
        )
        return (mu if left and right else mean), std

    def sample(self, xs: npt.ArrayLike) -> FloatArray:
        out = []
        for x in np.asarray(xs, dtype=np.float64).tolist():
            if x not in self._g:
                mean, std = self._moments(x)
                self._g[x] = mean + std * float(self.rng.standard_normal())
            out.append(self._g[x])
        return np.asarray(out)

    def points(self) -> tuple[FloatArray, FloatArray]:
        xs = np.array(sorted(self._g))
        return xs, np.array([self._g[x] for x in xs.tolist()])


def ScaledPath(  # noqa: N802 - a factory that reads like a class
    *, beta_factor: float = 1.0, sigma_factor: float = 1.0
) -> Callable[..., OUSamplePath]:
    """A factory of real sample paths with a wrong beta or sigma (what a bug would do)."""

    def make(*, beta: float, sigma: float, rng: Any) -> OUSamplePath:
        return OUSamplePath(beta=beta * beta_factor, sigma=sigma * sigma_factor, rng=rng)

    return make


# -- the conformance run ----------------------------------------------------------------------


@dataclass(frozen=True)
class Conformance:
    dense: dict[str, Any]  # normality_report of the dense-whitened values
    insertion: dict[str, Any]  # normality_report of qveil.stats.whiten in insertion order
    cov_max_z: float  # covariance_max_z of the values at the fixed states
    cov_bound: float  # covariance_bound(len(states))

    @property
    def passed(self) -> bool:
        return (
            self.dense["passed"] and self.insertion["passed"] and self.cov_max_z <= self.cov_bound
        )

    def summary(self) -> str:
        d, w = self.dense, self.insertion
        return (
            f"dense: ks_p={d['ks_p']:.3g} chi2_p={d['chi2_p']:.3g} var={d['var']:.3f}; "
            f"insertion: ks_p={w['ks_p']:.3g} chi2_p={w['chi2_p']:.3g} var={w['var']:.3f}; "
            f"cov max z={self.cov_max_z:.2f} (bound {self.cov_bound:.2f})"
        )


def conformance(
    make_path: Callable[..., Sampler],
    states: FloatArray,
    *,
    beta: float,
    sigma: float,
    paths: int,
    seed: int,
    restore_at: int | None = None,
) -> Conformance:
    """Run ``paths`` independent paths ``make_path(beta=, sigma=, rng=)`` (each with its own
    seeded generator) at the sorted ``states``, each in a random order split into random
    batches; judge them against the *nominal* (beta, sigma).

    ``restore_at=k``: after the first k states of each path's order, rebuild the path with
    ``OUSamplePath.from_points(*path.points(), ...)`` and a fresh generator, then continue
    (the restored path must carry on with the same law).
    """
    n = states.size
    seqs = np.random.SeedSequence(seed).spawn(paths + 1)
    order_rng = np.random.default_rng(seqs[-1])
    values = np.empty((paths, n))
    innovations = []
    for p in range(paths):
        order = order_rng.permutation(n)
        cuts = np.sort(order_rng.choice(np.arange(1, n), size=order_rng.integers(0, 4)))
        rng = np.random.default_rng(seqs[p])
        path = make_path(beta=beta, sigma=sigma, rng=rng)
        done = 0
        for chunk in np.split(order, cuts):
            if restore_at is not None and done <= restore_at < done + chunk.size:
                path.sample(states[chunk[: restore_at - done]])
                xs, gs = path.points()
                path = OUSamplePath.from_points(
                    xs, gs, beta=beta, sigma=sigma, rng=np.random.default_rng([seed, p])
                )
                chunk = chunk[restore_at - done :]
                done = restore_at
            path.sample(states[chunk])
            done += chunk.size
        xs, gs = path.points()
        assert np.array_equal(xs, states), "the path must hold exactly the sampled states"
        values[p] = gs
        innovations.append(whiten(states[order], gs[order], beta=beta, sigma=sigma))
    z = dense_whiten(states, values, beta=beta, sigma=sigma)
    cov = ou_covariance(states, beta=beta, sigma=sigma)
    return Conformance(
        dense=normality_report(z.ravel()),
        insertion=normality_report(np.concatenate(innovations)),
        cov_max_z=covariance_max_z(values, cov),
        cov_bound=covariance_bound(n),
    )
