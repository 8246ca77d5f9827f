"""RKHS norms for the kernel K(x, y) = exp(-beta |x - y|) on [0, 1]: pure math.

Lemma 6 of Wang & Hegde (2019), Appendix C: H^1[0, 1] with the inner product

    <f, g> = (f(0) g(0) + f(1) g(1)) / 2 + (1 / (2 beta)) int_0^1 (f' g' + beta^2 f g) dx

is the RKHS of K. (qveil checks this numerically: for dense points the exact Gram-matrix
norm g^T K^{-1} g, :func:`gram_norm_sq`, converges to :func:`lemma6_norm_sq`; see
tests/unit/core/test_privacy_rkhs.py.)

Sensitivity bound used by the strict ``output`` mode (derivation in docs/privacy.md): if
|f| <= D and |f'| <= D1 on [0, 1] then every term is bounded pointwise, so

    ||f||_H^2 <= D^2 + (D1^2 + beta^2 D^2) / (2 beta) = D^2 (1 + beta/2) + D1^2 / (2 beta),

minimised at beta* = D1 / D, where it equals D^2 + D D1. The bound is the supremum over the
class (approached by a fine zigzag of slope +-D1 just below D), so it cannot be improved.
For f = Q - Q' with |Q|, |Q'| <= M (the server's clamp) and both L-Lipschitz: D = 2M,
D1 = 2L, beta* = L / M and ||f||_H^2 <= 4 M^2 + 4 M L.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from qveil.errors import InvalidArgument
from qveil.privacy.checks import positive as _pos

__all__ = [
    "gram_norm_sq",
    "lemma6_bound_sq",
    "lemma6_norm_sq",
    "optimal_beta",
    "output_sensitivity_sq",
]


def lemma6_bound_sq(*, sup_bound: float, lip_bound: float, beta: float) -> float:
    """Upper bound on ||f||_H^2 for |f| <= D, |f'| <= D1 (Lemma 6's inner product bounded
    term by term): D^2 (1 + beta/2) + D1^2 / (2 beta)."""
    d = _pos("sup_bound", sup_bound)
    d1 = _pos("lip_bound", lip_bound)
    b = _pos("beta", beta)
    return d * d * (1.0 + b / 2.0) + d1 * d1 / (2.0 * b)


def optimal_beta(*, sup_bound: float, lip_bound: float) -> float:
    """beta minimising :func:`lemma6_bound_sq`: d/dbeta [D^2 beta/2 + D1^2/(2 beta)] = 0 at
    beta* = D1 / D (then the bound is D^2 + D D1)."""
    return _pos("lip_bound", lip_bound) / _pos("sup_bound", sup_bound)


def output_sensitivity_sq(*, q_bound: float, lipschitz: float, beta: float) -> float:
    """Per-action squared RKHS sensitivity of the served function class
    {Q : |Q| <= M, Q L-Lipschitz on [0, 1]}: f = Q - Q' has D = 2M, D1 = 2L, so
    ||f||_H^2 <= 4 M^2 (1 + beta/2) + 2 L^2 / beta (Lemma 6; docs/privacy.md section 3)."""
    m = _pos("q_bound", q_bound)
    lip = _pos("lipschitz", lipschitz)
    return lemma6_bound_sq(sup_bound=2.0 * m, lip_bound=2.0 * lip, beta=beta)


def lemma6_norm_sq(
    *, f0: float, f1: float, int_df_sq: float, int_f_sq: float, beta: float
) -> float:
    """||f||_H^2 from Lemma 6's inner product, given f(0), f(1), int f'^2 and int f^2."""
    b = _pos("beta", beta)
    return 0.5 * (f0 * f0 + f1 * f1) + (int_df_sq + b * b * int_f_sq) / (2.0 * b)


def gram_norm_sq(xs: npt.ArrayLike, values: npt.ArrayLike, *, beta: float) -> float:
    """Exact g^T K^{-1} g for K = exp(-beta |x_i - x_j|) (unit variance), in O(n).

    This is the squared RKHS norm of the minimum-norm interpolant of ``values`` at ``xs``,
    so it is <= ||f||_H^2 for any f through those values and increases to ||f||_H^2 as the
    points become dense. It uses the Markov property of the OU kernel (a Gaussian vector
    with covariance K factorises into its first value and independent innovations):

        g^T K^{-1} g = g_1^2 + sum_i (g_{i+1} - rho_i g_i)^2 / (1 - rho_i^2),
        rho_i = exp(-beta (x_{i+1} - x_i)),

    with 1 - rho^2 computed as -expm1(-2 beta d) (exact for tiny beta d). Points are sorted;
    duplicates must carry equal values (else no interpolant exists).
    """
    b = _pos("beta", beta)
    x = np.asarray(xs, dtype=np.float64).ravel()
    g = np.asarray(values, dtype=np.float64).ravel()
    if x.shape != g.shape or x.size == 0:
        raise InvalidArgument(
            f"xs and values must be non-empty and of equal length, got {x.size} and {g.size}"
        )
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(g))):
        raise InvalidArgument("xs and values must be finite")
    order = np.argsort(x, kind="stable")
    x, g = x[order], g[order]
    d = np.diff(x)
    same = d == 0.0
    if np.any(same):
        if np.any(g[1:][same] != g[:-1][same]):
            raise InvalidArgument("duplicate x with different values: no interpolant")
        keep = np.concatenate([[True], ~same])
        x, g = x[keep], g[keep]
        d = np.diff(x)
    rho = np.exp(-b * d)
    one_minus = -np.expm1(-2.0 * b * d)
    innov = g[1:] - rho * g[:-1]
    return float(g[0] ** 2 + np.sum(innov * innov / one_minus))
