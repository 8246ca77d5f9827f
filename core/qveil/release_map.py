"""The certified kappa of the release map of bundles written by the retired 1-D grid fit:
kept only so that the privacy ledger can re-account the events such releases recorded
(:func:`qveil.privacy.events.account_params` replays them from their parameters). New releases
use the kernel estimator's subspace KRR, kappa = 1 / (4 lambda) (:mod:`qveil.kfqi`).

The map L: v in R^K (one action's fitted Q on the public grid x_k = k / (K - 1) of the unit
interval) -> the piecewise-linear function through the grid values u = S v, where S is a
row-normalised Gaussian smoother on the grid (bandwidth ``smoother_bandwidth`` in unit
coordinates; 0 means no smoothing, S = I). Released: f_a = L(Q_T(., a)) + g_a with
g_a ~ GP(0, sigma^2 K_beta), K_beta(x, y) = exp(-beta |x - y|).

The RKHS norm of a piecewise-linear f on [0, 1] (K_beta's RKHS, the Ornstein-Uhlenbeck
space) is

    ||f||_H^2 = (1/(2 beta)) int f'^2 + (beta/2) int f^2 + (f(0)^2 + f(1)^2) / 2,     (1)

a quadratic form u^T G u in the node values (:func:`pl_gram`). So ||L v||_H^2 = v^T A v with
A = S^T G S, and the sensitivity argument needs kappa >= max_{||v||_inf <= 1} v^T A v.
A convex quadratic peaks at a vertex of the sup-norm ball (tests enumerate all 2^K vertices
for K <= 14); for K = 101 we certify instead: for any positive weights w, the diagonal

    D_ii = A_ii + sum_{j != i} |A_ij| w_j / w_i                                         (2)

makes W (D - A) W diagonally dominant with a non-negative diagonal, hence D - A is positive
semidefinite, hence v^T A v <= v^T D v <= trace(D) on the ball. w = 1 is the row-sum
certificate; :func:`kappa_certificate` minimises trace(D) over log w (convex) and re-checks
the final D - A by its smallest eigenvalue. Everything here is a function of public
parameters (K, smoother bandwidth, beta) only.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from qveil.errors import InvalidArgument

__all__ = [
    "KappaCertificate",
    "brute_force_kappa",
    "certified_kappa",
    "kappa_certificate",
    "pl_gram",
    "release_quadratic_form",
    "smoother",
    "unit_grid",
]

FloatArray = npt.NDArray[np.float64]

#: Relative slack added to every certified kappa, for floating point (docs/privacy.md section 2.5).
KAPPA_SLACK = 1e-9


def unit_grid(points: int) -> FloatArray:
    """The public grid x_k = k / (K - 1), k = 0..K-1, of the unit interval."""
    if int(points) != points or points < 2:
        raise InvalidArgument(f"grid_points must be an integer >= 2, got {points!r}")
    return np.linspace(0.0, 1.0, int(points))


def smoother(points: int, bandwidth: float) -> FloatArray:
    """S (K x K): row k holds Gaussian weights exp(-(x_k - x_l)^2 / (2 b^2)) over the grid,
    normalised to sum 1 (a convex average, so ||S v||_inf <= ||v||_inf). b = 0: identity."""
    x = unit_grid(points)
    if not (math.isfinite(bandwidth) and bandwidth >= 0.0):
        raise InvalidArgument(f"smoother_bandwidth must be >= 0, got {bandwidth!r}")
    if bandwidth == 0.0:
        return np.eye(len(x))
    w = np.exp(-((x[:, None] - x[None, :]) ** 2) / (2.0 * bandwidth**2))
    out: FloatArray = w / w.sum(axis=1, keepdims=True)
    return out


def pl_gram(points: int, beta: float) -> FloatArray:
    """G (K x K) with u^T G u = equation (1) for the piecewise-linear f through (x_k, u_k)."""
    if not (math.isfinite(beta) and beta > 0.0):
        raise InvalidArgument(f"beta must be > 0, got {beta!r}")
    k = int(points)
    h = 1.0 / (k - 1)
    i = np.arange(k - 1)
    diff = np.zeros((k, k))  # int f'^2 = sum (u_{k+1} - u_k)^2 / h
    np.add.at(diff, (i, i), 1.0 / h)
    np.add.at(diff, (i + 1, i + 1), 1.0 / h)
    diff[i, i + 1] = diff[i + 1, i] = -1.0 / h
    mass = np.zeros((k, k))  # int f^2 = sum h/3 (u_k^2 + u_k u_{k+1} + u_{k+1}^2)
    np.add.at(mass, (i, i), h / 3.0)
    np.add.at(mass, (i + 1, i + 1), h / 3.0)
    mass[i, i + 1] = mass[i + 1, i] = h / 6.0
    g = diff / (2.0 * beta) + (beta / 2.0) * mass
    g[0, 0] += 0.5
    g[-1, -1] += 0.5
    return g


def release_quadratic_form(points: int, smoother_bandwidth: float, beta: float) -> FloatArray:
    """A = S^T G S: ||L v||_H^2 = v^T A v."""
    s = smoother(points, smoother_bandwidth)
    a = s.T @ pl_gram(points, beta) @ s
    sym: FloatArray = (a + a.T) / 2.0
    return sym


def brute_force_kappa(a: npt.ArrayLike) -> float:
    """max over the 2^K vertices of [-1, 1]^K of v^T A v (exact for convex A; K <= 20)."""
    m = np.asarray(a, dtype=np.float64)
    k = m.shape[0]
    if k > 20:
        raise InvalidArgument(f"brute force is for K <= 20 (2^K vertices), got K = {k}")
    # v and -v give the same value: fix v_0 = +1
    bits = (np.arange(2 ** (k - 1))[:, None] >> np.arange(k - 1)[None, :]) & 1
    v = np.hstack([np.ones((len(bits), 1)), 1.0 - 2.0 * bits])
    return float(np.einsum("ni,ij,nj->n", v, m, v).max())


@dataclass(frozen=True, slots=True)
class KappaCertificate:
    """kappa >= max_{||v||_inf <= 1} v^T A v, with the diagonal D of equation (2) that
    proves it (``min_eig`` = smallest eigenvalue of D - A, checked >= 0 up to round-off)."""

    kappa: float
    row_sum: float
    diagonal: FloatArray
    min_eig: float


def _mixing_method(a: FloatArray, *, rank: int = 12, sweeps: int = 150) -> FloatArray:
    """An approximate maximiser V = R R^T (unit rows) of tr(A V) over {V >= 0, diag V = 1},
    the SDP dual of equation (2)'s problem, by the mixing method (Wang, Chang & Kolter 2017):
    row i <- normalise(sum_{j != i} A_ij R_j), a monotone block-coordinate ascent. Seeded:
    the certificate must be the same number at every recomputation."""
    k = a.shape[0]
    r = np.random.default_rng(0).normal(size=(k, rank))
    r /= np.linalg.norm(r, axis=1, keepdims=True)
    off = a - np.diag(np.diag(a))
    last = -np.inf
    for _ in range(sweeps):
        for i in range(k):
            g = off[i] @ r
            n = float(np.linalg.norm(g))
            if n > 0.0:
                r[i] = g / n
        val = float(np.einsum("ij,ij->", off, r @ r.T))
        if val - last <= 1e-12 * abs(val):
            break
        last = val
    out: FloatArray = r @ r.T
    return out


def kappa_certificate(a: npt.ArrayLike, *, sdp: bool = True) -> KappaCertificate:
    """A certified kappa for the quadratic form ``a``: the smaller of the row-sum
    certificate (equation 2 with w = 1) and, with ``sdp``, the diagonal read off an
    approximate SDP dual solution V (D_ii = (A V)_ii, complementary slackness), shifted up by
    the smallest eigenvalue of D - A when that is negative. Either D is checked: D - A must
    be positive semidefinite (smallest eigenvalue >= -1e-9 trace D)."""
    m = np.asarray(a, dtype=np.float64)
    diag = np.diag(m).copy()
    if (diag < 0).any():
        raise InvalidArgument("the quadratic form has a negative diagonal: not PSD")
    rows = diag + np.abs(m - np.diag(diag)).sum(axis=1)
    row_sum = float(rows.sum())
    d = rows
    if sdp:
        cand = np.einsum("ij,ij->i", m, _mixing_method(m))
        shift = float(np.linalg.eigvalsh(np.diag(cand) - m).min())
        if shift < 0.0:
            cand = cand - shift
        if cand.sum() < row_sum:
            d = cand
    min_eig = float(np.linalg.eigvalsh(np.diag(d) - m).min())
    trace = float(d.sum())
    if min_eig < -1e-9 * trace:
        raise AssertionError(f"kappa certificate failed its check: min eigenvalue {min_eig:g}")
    return KappaCertificate(
        kappa=trace * (1.0 + KAPPA_SLACK), row_sum=row_sum, diagonal=d, min_eig=min_eig
    )


@functools.lru_cache(maxsize=256)
def certified_kappa(points: int, smoother_bandwidth: float, beta: float) -> float:
    """The certified kappa of the release map (K, smoother bandwidth, beta): public."""
    return kappa_certificate(release_quadratic_form(points, smoother_bandwidth, beta)).kappa
