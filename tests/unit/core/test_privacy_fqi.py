"""The grid accountant (qveil.privacy.fqi) that re-accounts the recorded events of 1-D grid
releases: its D_T under the user and reward relations, and the replay of a recorded grid
event from its parameters alone (tests/data/grid-bundle-v1, written by the grid fit before it
was retired)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qveil.privacy.events import account_params
from qveil.privacy.fqi import FQIPrivacyParams, account_fqi

GRID_BUNDLE = Path(__file__).resolve().parents[2] / "data" / "grid-bundle-v1"


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
