"""The release map of 1-D grid releases (the retired grid fit), kept to re-account their
recorded privacy events: its certified kappa, and the grid accountant that replays them.

* kappa: every certified bound is >= the brute-force maximum over all 2^K vertices of the
  sup-norm ball (a convex quadratic peaks at a vertex), for grids of K <= 14 points;
* the piecewise-linear RKHS norm behind kappa, against dense Gram matrices;
* the grid accountant's D_T and its replay from a recorded parameter set.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from qveil.privacy.events import account_params
from qveil.privacy.fqi import FQIPrivacyParams, account_fqi
from qveil.privacy.rkhs import gram_norm_sq
from qveil.release_map import brute_force_kappa, kappa_certificate, pl_gram, release_quadratic_form

GRID_BUNDLE = Path(__file__).resolve().parents[2] / "data" / "grid-bundle-v1"


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


def _params(**kw: object) -> FQIPrivacyParams:
    """The grid bundle's recorded parameters (300 users, rewards in [0, 0.5], gamma 0.3,
    T = 10, 2 actions), with ``kw`` changed."""
    card = json.loads((GRID_BUNDLE / "card.json").read_text())
    return FQIPrivacyParams.from_dict({**card["privacy_params"], **kw})


def test_d_t_formulas() -> None:
    r = account_fqi(_params(sigma=1.0))
    assert r.sup_sensitivity == pytest.approx(0.5 * (1 - 0.3**10) / (300 * 0.7**2), rel=1e-12)
    r = account_fqi(_params(sigma=1.0, neighbour="reward", reward_range=(-1.0, 0.5)))
    assert r.sup_sensitivity == pytest.approx(1.5 * (1 - 0.3**10) / (300 * 0.7), rel=1e-12)
    assert "one user's whole data replaced" in account_fqi(_params(sigma=1.0)).basis


def test_a_recorded_grid_event_replays_from_its_parameters() -> None:
    """What the ledger does with a grid release's event: account_params on the recorded
    parameters alone gives the card's epsilon again (tests/data/grid-bundle-v1, written by
    the grid fit before it was retired)."""
    card = json.loads((GRID_BUNDLE / "card.json").read_text())
    again = account_params(card["privacy_params"])
    assert again.epsilon == pytest.approx(card["epsilon"], rel=1e-12)
    assert again.kappa == pytest.approx(card["kappa"], rel=1e-12)
