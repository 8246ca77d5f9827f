"""Ledger primitives: immutable events, JSON round trip, composition, budget check."""

from __future__ import annotations

import dataclasses
import math

import pytest

from qveil.errors import BudgetExceeded, InvalidArgument
from qveil.privacy import (
    E3_SETTINGS,
    PrivacyEvent,
    PrivacyParams,
    account,
    calibrate,
    check_budget,
    compose,
    gdp_epsilon,
    verify_event,
)
from qveil.privacy.gaussian import gdp_delta, gdp_mu
from qveil.privacy.ledger import (
    BASIC_FILTER,
    GAUSSIAN_FILTER,
    PlannedEvent,
    filter_check,
    filter_state,
)

TS = "2026-11-22T06:00:00+00:00"


def _event(mode: str, eps: float, *, bundle: str = "b1", dataset: str = "d1") -> PrivacyEvent:
    p = PrivacyParams(mode=mode, sigma=None, **E3_SETTINGS)  # type: ignore[arg-type]
    r = calibrate(p, target_epsilon=eps)
    return PrivacyEvent.from_result(r, dataset_id=dataset, bundle_id=bundle, created_at=TS)


def test_event_round_trips_through_json_and_is_immutable() -> None:
    for mode in ("paper", "gdp", "output"):
        ev = _event(mode, 0.9)
        again = PrivacyEvent.from_json(ev.to_json())
        assert again == ev and again.to_json() == ev.to_json()
        assert hash(again) == hash(ev)
        with pytest.raises(dataclasses.FrozenInstanceError):
            ev.epsilon = 0.0  # type: ignore[misc]
        # an auditor recomputes the event from its recorded parameters
        assert verify_event(again).epsilon == ev.epsilon


def test_verify_event_detects_tampering() -> None:
    ev = _event("output", 0.9)
    forged = dataclasses.replace(ev, epsilon=0.5)
    with pytest.raises(InvalidArgument, match="recorded epsilon=0.5"):
        verify_event(forged)


def test_compose_three_events() -> None:
    paper = _event("paper", 0.45, bundle="b1")
    gdp = _event("gdp", 0.9, bundle="b2")
    out = _event("output", 0.3, bundle="b3")
    eps, delta = compose([paper, gdp, out])
    # mixed modes: basic composition (Dwork & Roth Thm 3.16)
    assert eps == pytest.approx(0.45 + 0.9 + 0.3, rel=1e-9)
    assert delta == pytest.approx(paper.delta + gdp.delta + out.delta)
    assert compose([]) == (0.0, 0.0)

    # all GDP: exact composition sqrt(sum mu^2) at the same total delta beats the sum
    outs = [_event("output", e, bundle=f"o{i}") for i, e in enumerate((0.3, 0.5, 0.9))]
    eps3, delta3 = compose(outs)
    mu = math.sqrt(sum(e.mu**2 for e in outs))  # type: ignore[operator]
    assert delta3 == pytest.approx(3e-4)
    assert eps3 == gdp_epsilon(delta=3e-4, mu=mu)
    assert eps3 < 0.3 + 0.5 + 0.9


def test_budget_check_passes_then_raises_with_numbers() -> None:
    a, b = _event("output", 0.4, bundle="a"), _event("output", 0.4, bundle="b")
    spent = check_budget([a], b, cap_epsilon=1.0, cap_delta=1e-3)
    assert spent[0] <= 1.0
    c = _event("output", 0.9, bundle="c")
    with pytest.raises(BudgetExceeded) as exc:
        check_budget([a, b], c, cap_epsilon=1.0, cap_delta=1e-3)
    err = exc.value
    assert err.dataset_id == "d1"
    assert err.spent == compose([a, b])
    assert err.requested == (c.epsilon, c.delta)
    assert err.cap == (1.0, 1e-3)
    assert "spent" in str(err) and "cap" in str(err)
    # delta cap alone
    with pytest.raises(BudgetExceeded):
        check_budget([a], b, cap_epsilon=100.0, cap_delta=1.5e-4)


def test_budget_refuses_other_datasets_and_bad_caps() -> None:
    a, other = _event("output", 0.4), _event("output", 0.4, dataset="d2")
    with pytest.raises(InvalidArgument, match="d2"):
        check_budget([other], a, cap_epsilon=5.0, cap_delta=1e-3)
    for bad in (-1.0, float("nan")):
        with pytest.raises(InvalidArgument, match="cap_epsilon"):
            check_budget([], a, cap_epsilon=bad, cap_delta=1e-3)


def test_event_validation() -> None:
    good = _event("output", 0.9).to_dict()
    for key, val, frag in [
        ("epsilon", -1.0, "got -1.0"),
        ("delta", 1.0, "got 1.0"),
        ("dataset_id", "", "dataset_id"),
        ("created_at", "yesterday", "'yesterday'"),
        ("created_at", "2026-11-22T06:00:00", "UTC offset"),
        ("mode", "rdp", "'rdp'"),
        ("epsilon", float("inf"), "inf"),
    ]:
        with pytest.raises(InvalidArgument, match=None) as exc:
            PrivacyEvent.from_dict({**good, key: val})
        assert frag in str(exc.value)
    with pytest.raises(InvalidArgument, match="unknown"):
        PrivacyEvent.from_json('{"x": 1}')
    with pytest.raises(InvalidArgument, match="JSON"):
        PrivacyEvent.from_json("{not json")
    no_guarantee = account(PrivacyParams(mode="paper", sigma=0.32, **E3_SETTINGS))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="without a guarantee"):
        PrivacyEvent.from_result(no_guarantee, dataset_id="d", bundle_id="b")


def _gauss(mu: float, *, dataset: str = "pop", bundle: str = "b") -> PrivacyEvent:
    """A pure Gaussian mechanism of GDP parameter mu (its (eps, delta) on the GDP curve)."""
    delta = 1e-5
    return PrivacyEvent(
        mechanism=PlannedEvent("fqi"),
        epsilon=gdp_epsilon(delta=delta, mu=mu),
        delta=delta,
        dataset_id=dataset,
        bundle_id=bundle,
        created_at="2026-11-25T00:00:00+00:00",
        mu=mu,
        delta_mechanism=delta,
    )


@pytest.mark.parametrize("k", [1, 2, 3, 5, 9])
def test_gaussian_filter_admits_exactly_while_sum_of_mu_squared_fits(k: int) -> None:
    """k equal Gaussian events of mu fit a budget of mu_B iff sqrt(k) mu <= mu_B: checked on
    both sides of the boundary, and the budget's own (eps_B, delta_B) is met by mu_B-GDP."""
    eps_b, d_b = 2.0, 1e-5
    mu_b = gdp_mu(epsilon=eps_b, delta=d_b)
    assert gdp_delta(epsilon=eps_b, mu=mu_b) <= d_b * (1 + 1e-9)
    for mu, fits in (
        (mu_b / math.sqrt(k) * (1 - 1e-6), True),
        (mu_b / math.sqrt(k) * 1.001, False),
    ):
        events = [_gauss(mu, bundle=f"b{i}") for i in range(k - 1)]
        if fits:
            st = filter_check(events, _gauss(mu), budget_epsilon=eps_b, budget_delta=d_b)
            assert st.rule == GAUSSIAN_FILTER and st.mu_spent == pytest.approx(math.sqrt(k) * mu)
            assert st.spent[0] <= eps_b and st.remaining[0] >= 0
        else:
            with pytest.raises(BudgetExceeded) as info:
                filter_check(events, _gauss(mu), budget_epsilon=eps_b, budget_delta=d_b)
            assert info.value.cap == (eps_b, d_b)


def test_gaussian_filter_is_tighter_than_basic_composition() -> None:
    """Ten releases of eps ~ 0.45 each: basic composition would need eps 4.5; the Gaussian
    filter spends sqrt(10) mu, well under a budget of eps 2."""
    mu = gdp_mu(epsilon=2.0, delta=1e-5) / math.sqrt(10) * 0.999
    events = [_gauss(mu, bundle=f"b{i}") for i in range(10)]
    st = filter_state(events, budget_epsilon=2.0, budget_delta=1e-5)
    assert sum(e.epsilon for e in events) > 4.0 and st.spent[0] <= 2.0


def test_a_non_gaussian_event_switches_to_the_basic_filter() -> None:
    paper = _event("paper", 0.6, dataset="pop")
    st = filter_state([paper, _gauss(0.1)], budget_epsilon=2.0, budget_delta=1e-3)
    assert st.rule == BASIC_FILTER and st.mu_spent is None
    assert st.spent[0] == pytest.approx(paper.epsilon + _gauss(0.1).epsilon)
    with pytest.raises(BudgetExceeded):
        filter_check([paper], _event("paper", 1.5, dataset="pop"), budget_epsilon=2.0,
                     budget_delta=1e-3)  # fmt: skip
