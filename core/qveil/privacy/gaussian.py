"""Gaussian mechanisms and Gaussian differential privacy (GDP): pure, scalar math.

Two facts carry all of qveil's tight accounting:

* The Gaussian mechanism with L2 (or RKHS) sensitivity ``Delta`` and noise scale ``sigma``
  is exactly ``mu``-GDP with ``mu = Delta / sigma`` (Dong, Roth & Su 2019, "Gaussian
  Differential Privacy", Theorem 2.7), and a Gaussian *process* mechanism with RKHS
  sensitivity ``Delta`` is the same (its privacy-loss random variable is the same Gaussian;
  Hall, Rinaldo & Wasserman 2013, with the Cameron-Martin theorem).
* ``n`` adaptively composed ``mu_i``-GDP mechanisms are exactly ``sqrt(sum mu_i^2)``-GDP
  (Dong, Roth & Su 2019, Corollary 3.3).

And ``mu``-GDP is (eps, delta(eps))-DP for every eps >= 0 with

    delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)        (DRS19, Corollary 2.13)

which is also the analytic Gaussian mechanism's exact curve (Balle & Wang 2018, Theorem 8,
with mu = Delta/sigma). Unlike the classical sigma >= sqrt(2 ln(1.25/delta)) Delta / eps it is
valid for every eps > 0, not only eps < 1, and it is tight.

Numerics: delta is computed as Phi(a) * (1 - exp(eps + log Phi(b) - log Phi(a))) with
log Phi from ``scipy.special.log_ndtr`` and ``expm1``, so it keeps relative precision down
to delta ~ 1e-300 and never overflows at large eps (the naive e^eps Phi(b) does).

Inverses (eps for a delta, mu for an (eps, delta)) use bisection on adaptively expanded
brackets and return the *conservative* end of the final bracket, so the returned value is
verified to meet the target: ``gdp_delta(gdp_epsilon(d, mu), mu) <= d`` and
``gdp_delta(eps, gdp_mu(eps, d)) <= d`` always hold exactly in floating point.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from scipy.special import log_ndtr

from qveil.errors import InvalidArgument
from qveil.privacy.checks import number as _finite

__all__ = [
    "analytic_gaussian_delta",
    "analytic_gaussian_epsilon",
    "analytic_gaussian_sigma",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
]

# bisection stops when the bracket is this tight, relative to its upper end
_REL_TOL = 0.0  # bisect to adjacent floats: the returned end is as tight as a double allows
_MAX_ITER = 2200


def _delta(eps: float, mu: float) -> float:
    """delta(eps) of mu-GDP (DRS19 Cor. 2.13), unvalidated; eps >= 0, mu > 0."""
    a = -eps / mu + mu / 2.0
    b = -eps / mu - mu / 2.0
    log_pa = float(log_ndtr(a))
    if log_pa == -math.inf:  # Phi(a) underflowed: delta < 1e-300
        return 0.0
    x = eps + float(log_ndtr(b)) - log_pa  # <= 0 mathematically (delta >= 0)
    if x >= 0.0:
        return 0.0
    return math.exp(log_pa) * -math.expm1(x)


def _bisect(lo: float, hi: float, low_side: Callable[[float], bool]) -> tuple[float, float]:
    """The bracket [lo, hi] narrowed by bisection to adjacent floats (or ``_MAX_ITER`` steps):
    a midpoint where ``low_side`` holds becomes the new ``lo``, any other the new ``hi``."""
    for _ in range(_MAX_ITER):
        if hi - lo <= _REL_TOL * hi:
            break
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if low_side(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def gdp_delta(*, epsilon: float, mu: float) -> float:
    """delta(eps) for a mu-GDP mechanism (Dong, Roth & Su 2019, Corollary 2.13).

    ``delta = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``; exact (tight) for every
    eps >= 0. mu = 0 (no information released) gives delta = 0.
    """
    eps = _finite("epsilon", epsilon, lo=0.0, lo_open=False)
    m = _finite("mu", mu, lo=0.0, lo_open=False)
    if m == 0.0:
        return 0.0
    return _delta(eps, m)


def gdp_epsilon(*, delta: float, mu: float) -> float:
    """Smallest eps >= 0 with delta(eps) <= delta for a mu-GDP mechanism (inverse of
    :func:`gdp_delta`), by bisection on an adaptively doubled bracket.

    delta(eps) is strictly decreasing in eps, from 2 Phi(mu/2) - 1 at eps = 0 to 0, so the
    root is unique. The upper end of the final bracket is returned: it is verified to satisfy
    ``gdp_delta(epsilon=result, mu=mu) <= delta`` (never an epsilon that is too small).
    """
    d = _finite("delta", delta, lo=0.0, hi=1.0)
    m = _finite("mu", mu, lo=0.0, lo_open=False)
    if m == 0.0 or _delta(0.0, m) <= d:
        return 0.0
    lo, hi = 0.0, max(1.0, m * m)
    while _delta(hi, m) > d:  # adaptive bracket: delta(hi) <= d is reached (delta -> 0)
        lo, hi = hi, 2.0 * hi
        if hi > 1e300:  # cannot happen for d > 0, kept as a guard
            raise InvalidArgument(f"no epsilon reaches delta={delta!r} at mu={mu!r}")
    return _bisect(lo, hi, lambda eps: _delta(eps, m) > d)[1]


def gdp_mu(*, epsilon: float, delta: float) -> float:
    """Largest mu whose GDP curve meets (epsilon, delta): delta(eps; mu) <= delta.

    delta(eps; mu) is strictly increasing in mu (a larger mu is a less private mechanism;
    DRS19 Prop. 2.5 via the trade-off functions G_mu), so bisection on mu with an adaptive
    bracket finds it. The *lower* end of the final bracket is returned, verified to meet
    the target. Used by calibration: sigma = sensitivity / mu.
    """
    eps = _finite("epsilon", epsilon, lo=0.0)
    d = _finite("delta", delta, lo=0.0, hi=1.0)
    lo, hi = 0.0, 1.0
    while _delta(eps, hi) <= d:  # expand up until the target is violated
        lo, hi = hi, 2.0 * hi
        if hi > 1e150:
            raise InvalidArgument(f"epsilon={epsilon!r}, delta={delta!r}: mu is unbounded")
    lo, _ = _bisect(lo, hi, lambda mu: _delta(eps, mu) <= d)
    if lo <= 0.0:  # only for absurdly small delta: delta(eps; tiny mu) still > delta
        raise InvalidArgument(
            f"epsilon={epsilon!r}, delta={delta!r}: no positive mu meets this target"
        )
    return lo


def analytic_gaussian_delta(*, epsilon: float, sensitivity: float, sigma: float) -> float:
    """delta(eps) of the Gaussian mechanism N(f(D), sigma^2) with L2 sensitivity Delta
    (Balle & Wang 2018, "Improving the Gaussian mechanism", Theorem 8):

        delta = Phi(Delta/(2 sigma) - eps sigma/Delta)
                - e^eps Phi(-Delta/(2 sigma) - eps sigma/Delta)

    identical to :func:`gdp_delta` with mu = Delta / sigma; valid for every eps >= 0.
    """
    eps = _finite("epsilon", epsilon, lo=0.0, lo_open=False)
    s = _finite("sensitivity", sensitivity, lo=0.0, lo_open=False)
    sg = _finite("sigma", sigma, lo=0.0)
    if s == 0.0:
        return 0.0
    return _delta(eps, s / sg)


def analytic_gaussian_epsilon(*, delta: float, sensitivity: float, sigma: float) -> float:
    """Smallest eps with the analytic Gaussian mechanism's delta(eps) <= delta (BW18)."""
    s = _finite("sensitivity", sensitivity, lo=0.0, lo_open=False)
    sg = _finite("sigma", sigma, lo=0.0)
    return gdp_epsilon(delta=delta, mu=s / sg)


def analytic_gaussian_sigma(*, epsilon: float, delta: float, sensitivity: float) -> float:
    """Smallest sigma for which the Gaussian mechanism with sensitivity Delta is
    (eps, delta)-DP (BW18 Algorithm 1, done by bisection on mu); verified to meet it."""
    s = _finite("sensitivity", sensitivity, lo=0.0)
    mu = gdp_mu(epsilon=epsilon, delta=delta)
    sigma = s / mu
    # s / mu rounds; step up by ulps until the verified mu-curve is met (at most a few)
    for _ in range(64):
        if _delta(float(epsilon), s / sigma) <= float(delta):
            return sigma
        sigma = math.nextafter(sigma, math.inf)
    raise AssertionError("analytic_gaussian_sigma: final check failed")  # pragma: no cover
