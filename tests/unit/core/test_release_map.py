"""The release map of 1-D grid releases (the retired grid fit), kept to re-account their
recorded privacy events: its certified kappa (the grid accountant that replays them:
test_privacy_fqi.py).

* kappa: every certified bound is >= the brute-force maximum over all 2^K vertices of the
  sup-norm ball (a convex quadratic peaks at a vertex), for grids of K <= 14 points;
* the piecewise-linear RKHS norm behind kappa, against dense Gram matrices.
"""

from __future__ import annotations

import numpy as np
import pytest

from qveil.privacy.rkhs import gram_norm_sq
from qveil.release_map import brute_force_kappa, kappa_certificate, pl_gram, release_quadratic_form


@pytest.mark.parametrize("k", [3, 5, 8, 11, 14])
@pytest.mark.parametrize("bandwidth", [0.0, 0.05, 0.2])
@pytest.mark.parametrize("beta", [0.3, 3.0, 30.0, 300.0])
def test_kappa_certificate_bounds_the_vertex_maximum(k: int, bandwidth: float, beta: float) -> None:
    """Brute force over all 2^K vertices. A wrong certificate (e.g. trace(A), or the largest
    eigenvalue times K without the off-diagonal mass) falls below the maximum for some of
    these cases (checked: trace(A) < max at K = 14, b = 0.2, beta = 3)."""
    a = release_quadratic_form(k, bandwidth, beta)
    exact = brute_force_kappa(a)
    cert = kappa_certificate(a)
    assert cert.kappa >= exact
    assert cert.kappa <= cert.row_sum * (1 + 1e-9)  # the SDP read-off never does worse
    assert cert.min_eig >= -1e-9 * cert.kappa


def test_a_too_small_kappa_is_caught_by_brute_force() -> None:
    """The check has teeth: trace(A) (the value at v = e_i summed) is below the vertex max."""
    a = release_quadratic_form(14, 0.2, 3.0)
    assert float(np.trace(a)) < brute_force_kappa(a)


@pytest.mark.parametrize("beta", [0.5, 5.0, 50.0])
def test_pl_gram_is_the_rkhs_norm(beta: float) -> None:
    """u^T G u equals the squared RKHS norm of the piecewise-linear function, computed
    independently as the minimum-norm interpolant on a dense grid (Gram matrix / OU
    innovations), to 1e-5 relative."""
    rng = np.random.default_rng(3)
    u = rng.normal(size=21)
    xs = np.linspace(0, 1, 20001)
    dense = gram_norm_sq(xs, np.interp(xs, np.linspace(0, 1, 21), u), beta=beta)
    assert float(u @ pl_gram(21, beta) @ u) == pytest.approx(dense, rel=1e-5)
    assert np.allclose(pl_gram(21, beta), pl_gram(21, beta).T)
