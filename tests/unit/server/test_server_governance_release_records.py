"""The registry as the trainer's release records (qveil.server.governance.release_records) on
a real registry file: a written bundle charged to its population, its receipt signed only for
a recorded charge to a declared population and verifiable by the registry's key, private
evaluations charged and logged, simulated users' releases charged to their own population."""

from __future__ import annotations

from pathlib import Path

import pytest
from server_helpers import make_uncharged_bundle

from qveil.bundle import load_bundle
from qveil.bundle.receipt import check_receipt, read_receipt
from qveil.errors import FailedPrecondition, InvalidArgument
from qveil.server.governance import audit_log
from qveil.server.governance import population as pop
from qveil.server.governance.release_ledger import event_for_card
from qveil.server.governance.release_records import (
    SIMULATED_POPULATION,
    charge_simulated,
    open_release_records,
)


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'reg.sqlite'}"


def _verified(bundle: Path, public_key: str) -> None:
    card = load_bundle(bundle).card
    check_receipt(
        bundle,
        release_id=str(card["bundle_id"]),
        key_sha256=str(card["key_sha256"]),
        weights_sha256=str(card["weights_sha256"]),
        card_sha256=str(card["card_sha256"]),
        trusted=[public_key],
    )


def test_a_release_charged_to_its_population_gets_a_signed_receipt(tmp_path: Path) -> None:
    bundle = make_uncharged_bundle(tmp_path / "b", seed=1)
    rid = load_bundle(bundle).bundle_id
    with open_release_records(_url(tmp_path), actor="trainer") as rec:
        assert rec.url == _url(tmp_path)
        with pytest.raises(FailedPrecondition, match="has no charge in the ledger"):
            rec.issue_receipt(bundle)  # nothing recorded yet: no receipt
        assert read_receipt(bundle) is None
        pop.create(rec.registry, "people", epsilon=1e6, delta=0.5)
        line = rec.record_release(bundle, population="people")
        assert line.startswith("privacy: population people spent eps=") and "1 release(s)" in line
        said = rec.issue_receipt(bundle)
        assert said.startswith(f"receipt: release {rid} charged to people (eps=")
        receipt = read_receipt(bundle)
        assert receipt is not None and receipt.population == "people"
        assert receipt.registry_id == rec.registry.registry_id
        _verified(bundle, rec.registry.public_key)
        [entry] = rec.registry.ledger.entries("people")
        assert entry.release_id == rid and entry.event.epsilon == receipt.epsilon
        assert rec.population_report("people")["events"][0]["release_id"] == rid


def test_a_charge_to_an_undeclared_population_gets_no_receipt(tmp_path: Path) -> None:
    bundle = make_uncharged_bundle(tmp_path / "b", seed=2)
    with open_release_records(_url(tmp_path), actor="trainer") as rec:
        line = rec.record_release(bundle, population=None)  # charged to its environment
        assert line.startswith("privacy ledger of 'LineWalk-v0': recorded")
        with pytest.raises(FailedPrecondition, match="not a declared population"):
            rec.issue_receipt(bundle)
        assert read_receipt(bundle) is None


def test_population_names_are_checked(tmp_path: Path) -> None:
    with open_release_records(_url(tmp_path), actor="t") as rec:
        for bad in ("", " x", "a" * 201, "tab\there"):
            with pytest.raises(InvalidArgument):
                rec.population_report(bad)


def test_a_private_evaluation_is_charged_and_logged(tmp_path: Path) -> None:
    bundle = make_uncharged_bundle(tmp_path / "b", seed=6)  # an event of its parameters
    with open_release_records(_url(tmp_path), actor="evaluator") as rec:
        pop.create(rec.registry, "people", epsilon=1e6, delta=0.5)
        ev = event_for_card(load_bundle(bundle).card, dataset_id="people")
        assert ev is not None
        rec.record_evaluation("people", ev, target="rel-1", params={"estimate": 1.5})
        [entry] = rec.registry.ledger.entries("people")
        assert entry.event.epsilon == ev.epsilon and entry.release_id is None
        [logged] = audit_log.entries(rec.registry.db, action="private-evaluation", target="rel-1")
        assert logged.actor == "evaluator"
        assert logged.params == {"estimate": 1.5, "population": "people"}


def test_simulated_users_are_their_own_population(tmp_path: Path) -> None:
    a = make_uncharged_bundle(tmp_path / "a", seed=4)
    b = make_uncharged_bundle(tmp_path / "b", seed=5)
    assert "charged to simulated-users" in charge_simulated(a, url=_url(tmp_path))
    charge_simulated(b, url=_url(tmp_path))  # declared once, charged again
    with open_release_records(_url(tmp_path), actor="t") as rec:
        assert len(rec.registry.ledger.entries(SIMULATED_POPULATION)) == 2
        assert rec.registry.ledger.cap(SIMULATED_POPULATION).epsilon == 1e9  # type: ignore[union-attr]
        _verified(a, rec.registry.public_key)
