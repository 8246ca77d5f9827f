"""A release's charge (qveil.server.governance.release_ledger) in a real registry's ledger
(SQLite file): the key of its training data, the event recomputed from the card's own
parameters, recorded once per release, and refused past a budget or without a guarantee,
with nothing written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_helpers import make_uncharged_bundle

from qveil.bundle import load_bundle
from qveil.errors import BudgetExceeded, FailedPrecondition, InvalidArgument
from qveil.privacy.events import account_params
from qveil.server.governance.registry import Registry, open_registry
from qveil.server.governance.release_ledger import dataset_key, event_for_card, record_release


@pytest.fixture(scope="module")
def card(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The full card of an uncharged output-mode release of LineWalk."""
    return dict(load_bundle(make_uncharged_bundle(tmp_path_factory.mktemp("card") / "b")).card)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    with open_registry(f"sqlite:///{tmp_path / 'reg.sqlite'}", actor="t") as reg:
        yield reg


def _no_guarantee(card: dict[str, Any]) -> dict[str, Any]:
    return {**card, "bundle_id": "zero", "privacy_params": {**card["privacy_params"], "sigma": 0}}


def test_the_ledger_key_is_the_data_then_the_environment(card: dict[str, Any]) -> None:
    assert dataset_key(card) == "LineWalk-v0"
    assert dataset_key({**card, "dataset_fingerprint": "fp123"}) == "fp123"
    assert dataset_key({**card, "dataset_fingerprint": ""}) == "LineWalk-v0"


def test_the_event_is_recomputed_from_the_cards_parameters(card: dict[str, Any]) -> None:
    ev = event_for_card({**card, "epsilon": 0.001}, dataset_id="pop")  # the printed one ignored
    want = account_params(card["privacy_params"])
    assert ev is not None and ev.epsilon == want.epsilon and ev.delta == want.delta
    assert ev.dataset_id == "pop" and ev.bundle_id == card["bundle_id"]
    assert event_for_card(_no_guarantee(card), dataset_id="pop") is None
    assert event_for_card({**card, "privacy_params": None}, dataset_id="pop") is None


def test_a_release_is_recorded_once(registry: Registry, card: dict[str, Any]) -> None:
    first = record_release(registry.ledger, card, actor="t")
    assert first.status == "recorded" and first.dataset_id == "LineWalk-v0"
    assert first.spent_epsilon > 0 and "recorded; dataset spent eps=" in first.describe()
    again = record_release(registry.ledger, card, actor="t")
    assert again.status == "already" and again.spent_epsilon == first.spent_epsilon
    assert "already recorded" in again.describe()
    assert len(registry.ledger.entries("LineWalk-v0")) == 1


def test_a_population_needs_its_cap_and_is_charged(
    registry: Registry, card: dict[str, Any]
) -> None:
    with pytest.raises(FailedPrecondition):
        record_release(registry.ledger, card, actor="t", population="people")
    assert registry.ledger.entries("people") == []
    registry.ledger.set_cap("people", cap_epsilon=1e6, cap_delta=0.5, actor="t")
    out = record_release(registry.ledger, card, actor="t", population="people")
    assert out.status == "recorded" and out.dataset_id == "people"
    assert registry.ledger.entry_for_release(card["bundle_id"]).dataset_id == "people"  # type: ignore[union-attr]


def test_a_budget_refuses_and_writes_nothing(registry: Registry, card: dict[str, Any]) -> None:
    for bad in (-1.0, float("nan"), "1"):
        with pytest.raises(InvalidArgument, match="--budget must be an epsilon >= 0"):
            record_release(registry.ledger, card, actor="t", budget=bad)  # type: ignore[arg-type]
    with pytest.raises(BudgetExceeded):
        record_release(registry.ledger, card, actor="t", budget=1e-3)
    assert registry.ledger.entry_for_release(card["bundle_id"]) is None
    record_release(registry.ledger, card, actor="t")
    with pytest.raises(BudgetExceeded):  # recorded already, its dataset is past the budget now
        record_release(registry.ledger, card, actor="t", budget=1e-3)
    assert len(registry.ledger.entries("LineWalk-v0")) == 1


def test_a_release_without_a_guarantee(registry: Registry, card: dict[str, Any]) -> None:
    zero = _no_guarantee(card)
    out = record_release(registry.ledger, zero, actor="t")
    assert out.status == "none" and out.describe() == (
        "not in the ledger of LineWalk-v0: the release has no guarantee"
    )
    with pytest.raises(FailedPrecondition, match="cannot be charged to population 'p'"):
        record_release(registry.ledger, zero, actor="t", population="p")
    with pytest.raises(FailedPrecondition, match="cannot be served under --budget 5"):
        record_release(registry.ledger, zero, actor="t", budget=5.0)
    assert registry.ledger.datasets() == []
