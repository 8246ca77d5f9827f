"""Statistical checks of stored noise: whitening by the exact OU conditionals, normality tests.

A sample path built point by point (``qveil.noise.OUSamplePath``) draws each new point from
its exact conditional given the points stored *before* it; a release's keyed path
(:mod:`qveil.keyed`) has the exact joint law at any set of points, so any order serves.
Replaying the points in that order, the innovations

    z_i = (g_i - mean_i) / std_i,    (mean_i, std_i) = conditional_moments(neighbours of x_i
                                                        among x_1, ..., x_{i-1})

are independent N(0, 1) under the true law (the chain rule of the joint density; the
conditionals are those of docs/privacy.md section 9, not the paper's equation (2)). A
wrong sigma, a wrong beta or a wrong conditional shows up as innovations that are not
iid N(0, 1), which :func:`normality_report` measures. Used by the noise tests, the store's
contract tests and the audit command (on the answer log, in its insertion order).

Pure: numpy, scipy.stats and :func:`qveil.noise.conditional_moments`; no I/O, no randomness.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

from qveil.errors import InvalidArgument
from qveil.json_types import JSONObject
from qveil.noise import conditional_moments, ou_bridge, validate_points
from qveil.pathindex import SortedPoints

__all__ = ["DEFAULT_PASS_LEVEL", "chi2_bins", "normality_report", "whiten"]

#: Every p-value of :func:`normality_report` must be at least this for ``passed``.
#: With the four tests the false-alarm rate of a correct path is at most 4 x 0.001 = 0.4 %.
DEFAULT_PASS_LEVEL = 1e-3

FloatArray = npt.NDArray[np.float64]


def whiten(xs: npt.ArrayLike, gs: npt.ArrayLike, *, beta: float, sigma: float) -> FloatArray:
    """Innovations of a path's points replayed in insertion order; iid N(0, 1) under the law.

    ``xs``, ``gs``: states in [0, 1] and their values in the order the points were drawn
    (for a keyed path any order, e.g. the answer log's insertion sequence). Each point is
    standardised by the exact OU conditional given its nearest neighbours among the points
    before it (:class:`qveil.pathindex.SortedPoints`, O(log n) per point). States must be distinct,
    values finite, ``sigma > 0`` (else no innovation exists): otherwise
    :class:`InvalidArgument`.
    """
    x, g = validate_points(xs, gs)
    if not (math.isfinite(float(sigma)) and float(sigma) > 0):
        raise InvalidArgument(f"sigma must be a finite number > 0 to whiten, got {sigma!r}")
    if np.unique(x).size != x.size:
        raise InvalidArgument("states must be distinct (a stored path has one value per state)")
    z = np.empty(x.size, dtype=np.float64)
    if x.size == 0:
        return z
    # the checks conditional_moments makes per point, made once: beta and sigma here, the
    # states (distinct, in [0, 1]) and values (finite) above; then each point's moments are
    # its ou_bridge, with the same arguments and operations (a missing side: distance inf,
    # value 0.0, as around() gives it), so the same bits, several times faster
    conditional_moments(
        beta=beta, sigma=sigma, d_left=None, g_left=None, d_right=None, g_right=None
    )
    b, s = float(beta), float(sigma)
    s2 = s * s
    exp, expm1, sqrt = math.exp, math.expm1, math.sqrt
    index = SortedPoints()
    around, add = index.around, index.add_one
    for k, (xi, gi) in enumerate(zip(x.tolist(), g.tolist(), strict=True)):
        lx, lg, rx, rg = around(xi)
        mean, var = ou_bridge(b, s2, xi - lx, lg, rx - xi, rg, exp, expm1)
        z[k] = (gi - mean) / sqrt(var)
        add(xi, gi)
    return z


def chi2_bins(n: int) -> int:
    """Equiprobable bins for the chi-square test: ~2 n^(2/5) (Mann & Wald), 4 to 100,
    and at least 5 expected counts per bin."""
    return int(max(4, min(100, round(2.0 * n**0.4), n // 5)))


def normality_report(z: npt.ArrayLike, *, level: float = DEFAULT_PASS_LEVEL) -> JSONObject:
    """How well ``z`` fits iid N(0, 1): four p-values and a verdict.

    * ``ks_p``: Kolmogorov-Smirnov against N(0, 1) (shape and location);
    * ``chi2_p``: Pearson chi-square on :func:`chi2_bins` equiprobable N(0, 1) bins (tails);
    * ``mean_p``: two-sided z-test of mean 0 (sqrt(n) * mean ~ N(0, 1));
    * ``var_p``: two-sided test of variance 1 (sum z^2 ~ chi-square with n degrees of
      freedom): the most sensitive to a wrong sigma, e.g. sigma x 1.3 at n = 1000 gives
      var ~ 1.69 and var_p ~ 1e-80.
    ``passed`` is True when every p-value is >= ``level`` (default 0.001, an audit level:
    a correct path fails with probability <= 4 * level). Also returns ``n``, ``mean``,
    ``var`` (the mean of z^2, i.e. about 0), ``level`` and ``bins``. Needs n >= 20.
    """
    arr = np.asarray(z, dtype=np.float64).reshape(-1)
    n = int(arr.size)
    if n < 20:
        raise InvalidArgument(f"normality_report needs at least 20 values, got {n}")
    if not np.isfinite(arr).all():
        raise InvalidArgument("values must be finite")
    if not 0.0 < level < 1.0:
        raise InvalidArgument(f"level must be in (0, 1), got {level!r}")
    ks_p = float(sps.kstest(arr, "norm").pvalue)
    bins = chi2_bins(n)
    edges = sps.norm.ppf(np.linspace(0.0, 1.0, bins + 1))
    counts = np.bincount(np.searchsorted(edges[1:-1], arr, side="right"), minlength=bins)
    chi2_p = float(sps.chisquare(counts).pvalue)
    mean = float(arr.mean())
    mean_p = float(2.0 * sps.norm.sf(abs(mean) * math.sqrt(n)))
    ss = float(np.dot(arr, arr))
    var_p = float(min(1.0, 2.0 * min(sps.chi2.cdf(ss, n), sps.chi2.sf(ss, n))))
    pvals = (ks_p, chi2_p, mean_p, var_p)
    return {
        "n": n,
        "mean": mean,
        "var": ss / n,
        "ks_p": ks_p,
        "chi2_p": chi2_p,
        "mean_p": mean_p,
        "var_p": var_p,
        "bins": bins,
        "level": level,
        "passed": bool(min(pvals) >= level),
    }
