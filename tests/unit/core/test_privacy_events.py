"""Typed privacy events (qveil.privacy.events): one frozen kind per mechanism, each recomputing
its cost from its own parameters, and ledgers written before the events were typed replaying
to the same figures (tests/data/ledger-events-v1.json: events of every mechanism and the
figures the ledger computed from them, written by the code of that time)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from qveil.errors import InvalidArgument
from qveil.privacy import E3_SETTINGS, PrivacyParams, calibrate
from qveil.privacy.events import (
    AsRecordedEvent,
    GdpTrainingEvent,
    GridFQIEvent,
    KernelFQIEvent,
    MechanismEvent,
    OutputGaussianEvent,
    PlannedEvent,
    PrivateEvaluationEvent,
    Theorem5Event,
    UnsupportedEvent,
    account_params,
    event_for,
    event_from_params,
    event_from_record,
)
from qveil.privacy.ledger import (
    PrivacyEvent,
    check_budget,
    compose_with_rule,
    filter_state,
    verify_event,
)

FIXTURE = Path(__file__).resolve().parents[2] / "data" / "ledger-events-v1.json"
KINDS = [
    Theorem5Event,
    GdpTrainingEvent,
    OutputGaussianEvent,
    OutputGaussianEvent,
    GridFQIEvent,
    KernelFQIEvent,
    PrivateEvaluationEvent,
    PlannedEvent,
    PlannedEvent,
    OutputGaussianEvent,
]


def _fixture() -> tuple[list[str], dict[str, Any]]:
    d = json.loads(FIXTURE.read_text())
    return d["events"], d["figures"]


def test_an_earlier_ledger_loads_as_typed_events_and_writes_back_byte_for_byte() -> None:
    texts, figures = _fixture()
    events = [PrivacyEvent.from_json(t) for t in texts]
    assert [type(e.mechanism) for e in events] == KINDS
    for e, text, recorded in zip(events, texts, figures["to_dict"], strict=True):
        assert e.to_json() == text
        assert e.to_dict() == recorded
        assert PrivacyEvent.from_json(e.to_json()) == e and hash(e) == hash(
            PrivacyEvent.from_json(text)
        )


def test_an_earlier_ledger_replays_to_identical_figures() -> None:
    """Composition, both privacy filters, the budget check and the auditor's recomputation give
    exactly (==, not approximately) what the untyped ledger gave."""
    texts, figures = _fixture()
    events = [PrivacyEvent.from_json(t) for t in texts]
    gauss = [e for e in events if e.gaussian is not None]
    assert [e.bundle_id for e in gauss] == figures["gaussian_bundles"]
    pure = [e for e in gauss if e.bundle_id in figures["pure_bundles"] and e.mode != "gdp"]
    assert [e.bundle_id for e in pure] == figures["pure_bundles"]
    assert list(compose_with_rule(events)) == figures["compose_all"]
    assert list(compose_with_rule(gauss)) == figures["compose_gaussian"]
    assert (
        filter_state(events, budget_epsilon=8.0, budget_delta=1e-3).to_dict()
        == figures["filter_all"]
    )
    assert (
        filter_state(pure, budget_epsilon=3.0, budget_delta=1e-5).to_dict()
        == figures["filter_pure"]
    )
    spent = check_budget(events[:-1], events[-1], cap_epsilon=1000.0, cap_delta=0.5)
    assert list(spent) == figures["check_budget_all"]
    for e, want in zip(events, figures["verify"], strict=True):
        if "error" in want:  # a planned charge: nothing to recompute
            with pytest.raises(InvalidArgument, match="planned"):
                verify_event(e)
            continue
        got = verify_event(e)
        assert (got.epsilon, got.delta_total, got.mode) == (
            want["epsilon"],
            want["delta_total"],
            want["mode"],
        )


def test_each_kind_round_trips_through_its_parameters_and_is_frozen() -> None:
    texts, _ = _fixture()
    for text in texts:
        ev = PrivacyEvent.from_json(text)
        m = ev.mechanism
        assert event_from_record(m.mode, m.to_params()) == m
        if isinstance(m, PlannedEvent):
            assert m.to_params() == {}
            continue
        assert event_from_params(m.to_params()) == m
        assert account_params(m.to_params()).epsilon == m.account().epsilon
        assert event_for(m.account().params) == m
        with pytest.raises(dataclasses.FrozenInstanceError):
            m.params = None  # type: ignore[misc, union-attr]


def test_a_kind_takes_only_its_own_parameters() -> None:
    gdp = PrivacyParams(mode="gdp", sigma=1.0, **E3_SETTINGS)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="Theorem5Event needs PrivacyParams of mode paper"):
        Theorem5Event(gdp)
    with pytest.raises(InvalidArgument, match="KernelFQIEvent needs KernelFQIPrivacyParams"):
        KernelFQIEvent(gdp)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="mode must be one of"):
        PlannedEvent("rdp")
    with pytest.raises(InvalidArgument, match="MechanismEvent"):
        PrivacyEvent(
            mechanism={"mode": "gdp"},  # type: ignore[arg-type]
            epsilon=1.0,
            delta=1e-5,
            dataset_id="d",
            bundle_id="b",
            created_at="2026-11-28T00:00:00+00:00",
        )
    assert isinstance(GdpTrainingEvent(gdp), MechanismEvent)


def test_a_record_no_accountant_reads_loads_composes_and_fails_verification() -> None:
    """An event whose parameters this version cannot read (a newer field, a mode that does
    not match them) still loads, writes back as read and composes by its recorded numbers;
    verifying it names why (dp_accounting's UnsupportedDpEvent)."""
    texts, _ = _fixture()
    good = json.loads(texts[2])  # output mode
    cases = [
        ({**good, "params": {**good["params"], "novel": 1}}, "unknown privacy parameter"),
        ({**good, "mode": "gdp"}, "mode 'gdp' != recomputed 'output'"),
    ]
    for d, reason in cases:
        text = json.dumps(d, sort_keys=True)
        ev = PrivacyEvent.from_json(text)
        assert isinstance(ev.mechanism, UnsupportedEvent) and ev.to_json() == text
        assert compose_with_rule([ev]) == compose_with_rule([PrivacyEvent.from_json(texts[2])])
        with pytest.raises(InvalidArgument, match=reason):
            verify_event(ev)
        assert hash(ev) == hash(PrivacyEvent.from_json(text))


def test_a_record_in_an_earlier_form_verifies_and_writes_back_as_read() -> None:
    """Parameters the accountant reads but that this version would write differently (an
    optional field left out, an integer written as a float) account as the typed event and
    write back byte for byte."""
    texts, _ = _fixture()
    good = json.loads(texts[2])  # output mode
    params = dict(good["params"])
    del params["plain_sgd"]
    for p in (params, {**good["params"], "samples": 5000.0}):
        text = json.dumps({**good, "params": p}, sort_keys=True)
        ev = PrivacyEvent.from_json(text)
        assert isinstance(ev.mechanism, AsRecordedEvent) and ev.to_json() == text
        assert isinstance(ev.mechanism.event, OutputGaussianEvent) and ev.mode == "output"
        assert verify_event(ev).epsilon == PrivacyEvent.from_json(texts[2]).epsilon
        assert hash(ev) == hash(PrivacyEvent.from_json(text))


def test_from_result_types_the_mechanism() -> None:
    for mode, kind in (
        ("paper", Theorem5Event),
        ("gdp", GdpTrainingEvent),
        ("output", OutputGaussianEvent),
    ):
        r = calibrate(PrivacyParams(mode=mode, sigma=None, **E3_SETTINGS), target_epsilon=0.9)  # type: ignore[arg-type]
        ev = PrivacyEvent.from_result(r, dataset_id="d", bundle_id="b")
        assert type(ev.mechanism) is kind and ev.mode == mode
        assert ev.params == r.params.to_dict()
        assert (ev.gaussian is None) == (mode == "paper")
