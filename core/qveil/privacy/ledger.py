"""Ledger primitives: immutable privacy events, their composition, and the budget check.

An event records one release against one dataset (the reward data): its mechanism, a typed
frozen event of :mod:`qveil.privacy.events` in the shape of dp_accounting's DpEvent holding
every accountant parameter, and the guarantee (epsilon, delta, and mu for a Gaussian
mechanism). An auditor replays it (:func:`verify_event` recomputes the numbers from the
mechanism's parameters) instead of trusting a log line. Storage belongs to the server; this
module is pure.

Composition of k events on one dataset (:func:`compose`):

* basic composition (Dwork & Roth 2014, Theorem 3.16): (sum eps_i, sum delta_i), always valid;
* exact GDP composition when every event carries a GDP parameter mu_i (gdp and output modes):
  the mechanisms compose to sqrt(sum mu_i^2)-GDP (Dong, Roth & Su 2019, Cor. 3.3); at the same
  total delta (the mechanisms' deltas plus any Lemma 8 noise-bound terms, which add) the
  epsilon is gdp_epsilon(sum of mechanism deltas, mu). The smaller of the two epsilons is
  returned (both are valid at that delta).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from qveil.errors import BudgetExceeded, InvalidArgument
from qveil.json_types import JSONMapping, JSONObject
from qveil.privacy.events import (
    EVENT_MODES,
    Accounting,
    MechanismEvent,
    PlannedEvent,
    event_for,
    event_from_record,
)
from qveil.privacy.gaussian import gdp_epsilon, gdp_mu

__all__ = [
    "BASIC_FILTER",
    "BASIC_RULE",
    "EVENT_MODES",
    "GAUSSIAN_FILTER",
    "FilterState",
    "filter_check",
    "filter_state",
    "GAUSSIAN_RULE",
    "spending_line",
    "PlannedEvent",
    "PrivacyEvent",
    "check_budget",
    "compose",
    "compose_with_rule",
    "verify_event",
]

#: Names of the composition rules, as ``qveil admin ledger`` prints them.
GAUSSIAN_RULE = "exact Gaussian (mu-GDP) composition, mu = sqrt(sum mu_i^2) (Dong, Roth & Su 2019)"
BASIC_RULE = "basic composition, (sum eps_i, sum delta_i) (Dwork & Roth 2014, Thm 3.16)"


def _nonneg(name: str, value: object, *, below_one: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (below_one and v >= 1.0):
        rng = "in [0, 1)" if below_one else "finite and >= 0"
        raise InvalidArgument(f"{name} must be {rng}, got {value!r}")
    return v


def _ident(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(f"{name} must be a non-empty string, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class PrivacyEvent:
    """One release's privacy cost against one dataset: the typed mechanism that accounts for
    it and the guarantee recorded when it was charged. Immutable; JSON round-trips exactly,
    in the form every ledger has stored (``mode`` and ``params`` are the mechanism's)."""

    mechanism: MechanismEvent
    """The mechanism and its parameters (everything needed to recompute the cost)."""
    epsilon: float
    delta: float
    """The event's total delta (PrivacyResult.delta_total)."""
    dataset_id: str
    bundle_id: str
    created_at: str
    """ISO 8601 timestamp with a UTC offset."""
    mu: float | None = None
    """GDP parameter (gdp, output and fqi modes), for exact composition."""
    delta_mechanism: float | None = None
    """The mechanism's delta (PrivacyResult.delta); delta - delta_mechanism is Lemma 8's term."""

    def __post_init__(self) -> None:
        if not isinstance(self.mechanism, MechanismEvent):
            raise InvalidArgument(
                f"mechanism must be a MechanismEvent, got {type(self.mechanism).__name__}"
            )
        object.__setattr__(self, "epsilon", _nonneg("epsilon", self.epsilon))
        object.__setattr__(self, "delta", _nonneg("delta", self.delta, below_one=True))
        _ident("dataset_id", self.dataset_id)
        _ident("bundle_id", self.bundle_id)
        try:
            ts = datetime.fromisoformat(_ident("created_at", self.created_at))
        except ValueError:
            raise InvalidArgument(
                f"created_at must be an ISO 8601 timestamp, got {self.created_at!r}"
            ) from None
        if ts.tzinfo is None:
            raise InvalidArgument(f"created_at must carry a UTC offset, got {self.created_at!r}")
        if self.mu is not None:
            object.__setattr__(self, "mu", _nonneg("mu", self.mu))
        if self.delta_mechanism is not None:
            dm = _nonneg("delta_mechanism", self.delta_mechanism, below_one=True)
            if dm > self.delta:
                raise InvalidArgument(
                    f"delta_mechanism={dm!r} cannot exceed the event's delta={self.delta!r}"
                )
            object.__setattr__(self, "delta_mechanism", dm)

    def __hash__(self) -> int:
        return hash(self.to_json())

    @property
    def mode(self) -> str:
        """The mechanism's accounting mode (paper, gdp, output or fqi)."""
        return self.mechanism.mode

    @property
    def params(self) -> JSONObject:
        """The mechanism's recorded parameter set, as JSON values."""
        return self.mechanism.to_params()

    @property
    def gaussian(self) -> tuple[float, float] | None:
        """(mu, delta_mechanism) when the recorded guarantee is a Gaussian mechanism's (exact
        GDP composition applies), else None."""
        if self.mu is None or self.delta_mechanism is None:
            return None
        return self.mu, self.delta_mechanism

    @classmethod
    def from_result(
        cls,
        result: Accounting,
        *,
        dataset_id: str,
        bundle_id: str,
        created_at: str | None = None,
    ) -> PrivacyEvent:
        """The event for a release accounted as ``result``; a result whose guarantee does not
        hold cannot be entered (there is no epsilon to charge)."""
        if not result.holds or result.epsilon is None or result.delta_total is None:
            raise InvalidArgument(
                f"cannot record a release without a guarantee in the ledger: {result.reason}"
            )
        return cls(
            mechanism=event_for(result.params),
            epsilon=result.epsilon,
            delta=result.delta_total,
            dataset_id=dataset_id,
            bundle_id=bundle_id,
            created_at=created_at or datetime.now(UTC).isoformat(),
            mu=result.mu,
            delta_mechanism=result.delta,
        )

    def to_dict(self) -> JSONObject:
        """The recorded form (JSON values): mode, params and the guarantee's fields."""
        return {
            "mode": self.mode,
            "params": self.params,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "dataset_id": self.dataset_id,
            "bundle_id": self.bundle_id,
            "created_at": self.created_at,
            "mu": self.mu,
            "delta_mechanism": self.delta_mechanism,
        }

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no NaN)."""
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)

    @classmethod
    def from_dict(cls, d: JSONMapping) -> PrivacyEvent:
        """Inverse of :meth:`to_dict`; unknown or missing keys are InvalidArgument."""
        unknown = sorted(set(d) - set(_RECORDED))
        if unknown:
            raise InvalidArgument(f"unknown privacy event field(s): {', '.join(unknown)}")
        missing = [k for k in _RECORDED[:_REQUIRED] if k not in d]
        if missing:
            raise InvalidArgument(f"privacy event: missing field(s) {', '.join(missing)}")
        kw = {k: v for k, v in d.items() if k not in ("mode", "params")}
        return cls(mechanism=event_from_record(d["mode"], d["params"]), **kw)

    @classmethod
    def from_json(cls, text: str | bytes) -> PrivacyEvent:
        try:
            d = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"privacy event is not valid JSON: {exc}") from None
        if not isinstance(d, dict):
            raise InvalidArgument(f"privacy event JSON must be an object, got {d!r}")
        return cls.from_dict(d)


#: The keys of an event's recorded form, the required ones first.
_RECORDED = (
    "mode",
    "params",
    "epsilon",
    "delta",
    "dataset_id",
    "bundle_id",
    "created_at",
    "mu",
    "delta_mechanism",
)
_REQUIRED = 7


def compose(events: Iterable[PrivacyEvent]) -> tuple[float, float]:
    """(epsilon, delta) of all ``events`` together (one dataset): basic composition, or exact
    GDP composition when every event has a mu, whichever gives the smaller epsilon at the
    same total delta. No events: (0, 0)."""
    eps, delta, _ = compose_with_rule(events)
    return eps, delta


def compose_with_rule(events: Iterable[PrivacyEvent]) -> tuple[float, float, str]:
    """:func:`compose` and the name of the rule that gave the epsilon: :data:`GAUSSIAN_RULE`
    when every event is a Gaussian mechanism (it has a mu: gdp, output and fqi modes; fqi's mu
    is its sensitivity / sigma) and that composition is the tighter, else :data:`BASIC_RULE`."""
    evs = list(events)
    for e in evs:
        if not isinstance(e, PrivacyEvent):
            raise InvalidArgument(f"compose() needs PrivacyEvent items, got {type(e).__name__}")
    if not evs:
        return 0.0, 0.0, BASIC_RULE
    eps = math.fsum(e.epsilon for e in evs)
    rule = BASIC_RULE
    delta = math.fsum(e.delta for e in evs)
    gauss = [g for g in (e.gaussian for e in evs) if g is not None]
    if len(gauss) == len(evs):
        mu = math.sqrt(math.fsum(m * m for m, _ in gauss))
        d_mech = math.fsum(d for _, d in gauss)
        if 0.0 < d_mech < 1.0:
            eps_gdp = gdp_epsilon(delta=d_mech, mu=mu)
            if eps_gdp <= eps:
                eps, rule = eps_gdp, GAUSSIAN_RULE
    return eps, min(delta, 1.0), rule


def check_budget(
    events: Sequence[PrivacyEvent], new: PrivacyEvent, *, cap_epsilon: float, cap_delta: float
) -> tuple[float, float]:
    """(epsilon, delta) spent after adding ``new`` to ``events``, if within the caps; else
    raises :class:`qveil.errors.BudgetExceeded` carrying spent, requested and cap.

    All events must belong to ``new.dataset_id`` (a ledger is per dataset)."""
    cap_e = _nonneg("cap_epsilon", cap_epsilon)
    cap_d = _nonneg("cap_delta", cap_delta)
    if cap_d > 1.0:
        raise InvalidArgument(f"cap_delta must be in [0, 1], got {cap_delta!r}")
    if not isinstance(new, PrivacyEvent):
        raise InvalidArgument(f"new must be a PrivacyEvent, got {type(new).__name__}")
    others = [e for e in events if e.dataset_id != new.dataset_id]
    if others:
        raise InvalidArgument(
            f"events of dataset {others[0].dataset_id!r} in the ledger of dataset "
            f"{new.dataset_id!r}"
        )
    spent = compose(events)
    total = compose([*events, new])
    if total[0] > cap_e or total[1] > cap_d:
        raise BudgetExceeded(
            dataset_id=new.dataset_id,
            spent=spent,
            requested=(new.epsilon, new.delta),
            cap=(cap_e, cap_d),
        )
    return total


def verify_event(event: PrivacyEvent, *, rel_tol: float = 1e-9) -> Accounting:
    """Recompute an event from its mechanism's parameters (an auditor's check). Raises
    InvalidArgument naming the mismatch when the recorded numbers are not what the
    accountant gives."""
    result = event.mechanism.account()
    if not result.holds or result.epsilon is None or result.delta_total is None:
        raise InvalidArgument(f"event {event.bundle_id!r}: no guarantee holds: {result.reason}")
    if result.mode != event.mode:
        raise InvalidArgument(
            f"event {event.bundle_id!r}: mode {event.mode!r} != recomputed {result.mode!r}"
        )
    for name, got, want in (
        ("epsilon", event.epsilon, result.epsilon),
        ("delta", event.delta, result.delta_total),
    ):
        if not math.isclose(got, want, rel_tol=rel_tol, abs_tol=0.0):
            raise InvalidArgument(
                f"event {event.bundle_id!r}: recorded {name}={got!r} but the "
                f"accountant gives {want!r}"
            )
    return result


#: The privacy filters a population's budget is enforced with (releases chosen adaptively).
GAUSSIAN_FILTER = (
    "Gaussian privacy filter: releases continue while sqrt(sum mu_i^2) <= mu_B, and the "
    "population's data then has mu_B-GDP under fully adaptive composition (Smith & Thakurta "
    "2022, Thm 1.1; Whitehouse, Ramdas, Rogers & Wu 2023); (eps_B, delta_B) from the GDP curve"
)
BASIC_FILTER = (
    "basic privacy filter: releases continue while sum eps_i <= eps_B and sum delta_i <= "
    "delta_B, valid for adaptively chosen releases (Rogers, Roth, Ullman & Vadhan 2016, Thm 3.6)"
)


@dataclass(frozen=True)
class FilterState:
    """A population's spending under its privacy filter (:func:`filter_state`)."""

    rule: str
    #: GDP parameter spent (Gaussian filter) and the most a budget allows, else None
    mu_spent: float | None
    mu_budget: float | None
    #: the guarantee spent so far, stated at the budget's delta (Gaussian) or summed (basic)
    spent: tuple[float, float]
    budget: tuple[float, float]

    @property
    def mu_remaining(self) -> float | None:
        if self.mu_spent is None or self.mu_budget is None:
            return None
        return math.sqrt(max(0.0, self.mu_budget**2 - self.mu_spent**2))

    @property
    def remaining(self) -> tuple[float, float]:
        """(epsilon, delta) a single further release may still have: at the budget's delta,
        the largest epsilon whose mu fits (Gaussian), or what the sums leave (basic)."""
        if self.mu_remaining is not None:
            mu = self.mu_remaining
            eps = 0.0 if mu <= 0 else gdp_epsilon(delta=self.budget[1], mu=mu)
            return eps, self.budget[1]
        return (
            max(0.0, self.budget[0] - self.spent[0]),
            max(0.0, self.budget[1] - self.spent[1]),
        )

    def to_dict(self) -> JSONObject:
        return {
            "rule": self.rule,
            "mu_spent": self.mu_spent,
            "mu_budget": self.mu_budget,
            "mu_remaining": self.mu_remaining,
            "spent": {"epsilon": self.spent[0], "delta": self.spent[1]},
            "budget": {"epsilon": self.budget[0], "delta": self.budget[1]},
            "remaining": {"epsilon": self.remaining[0], "delta": self.remaining[1]},
        }


def spending_line(population: str, state: JSONMapping) -> str:
    """One line of a population's spending under its filter (``state``: :meth:`FilterState.
    to_dict`, or a population report holding it): what is spent, the budget, what one more
    release may have, and the filter. Every command that reports a population prints it."""
    spent, budget, left = state["spent"], state["budget"], state["remaining"]
    return (
        f"population {population} spent eps={spent['epsilon']:.6g} at "
        f"delta={spent['delta']:.3g} of its budget eps={budget['epsilon']:g}; one more release "
        f"may have eps <= {left['epsilon']:.6g} ({str(state['rule']).split(':')[0]})"
    )


def _pure_mu(e: PrivacyEvent) -> float | None:
    """mu of a pure Gaussian mechanism (a mu and no extra delta term, Lemma 8's), else None."""
    g = e.gaussian
    return g[0] if g is not None and e.delta <= g[1] else None


def filter_state(
    events: Sequence[PrivacyEvent], *, budget_epsilon: float, budget_delta: float
) -> FilterState:
    """The spending of ``events`` under the population budget (eps_B, delta_B): the Gaussian
    filter when every event is a pure Gaussian mechanism, else the basic filter."""
    eps_b = _nonneg("budget epsilon", budget_epsilon)
    d_b = _nonneg("budget delta", budget_delta, below_one=True)
    evs = list(events)
    mus = [m for m in (_pure_mu(e) for e in evs) if m is not None]
    if len(mus) == len(evs) and eps_b > 0 and d_b > 0:
        mu = math.sqrt(math.fsum(m * m for m in mus))
        spent = (0.0, 0.0) if mu == 0 else (gdp_epsilon(delta=d_b, mu=mu), d_b)
        return FilterState(
            GAUSSIAN_FILTER, mu, gdp_mu(epsilon=eps_b, delta=d_b), spent, (eps_b, d_b)
        )
    spent = (math.fsum(e.epsilon for e in evs), min(1.0, math.fsum(e.delta for e in evs)))
    return FilterState(BASIC_FILTER, None, None, spent, (eps_b, d_b))


def filter_check(
    events: Sequence[PrivacyEvent],
    new: PrivacyEvent,
    *,
    budget_epsilon: float,
    budget_delta: float,
) -> FilterState:
    """The filter's state with ``new`` added, if the filter lets it through; else raises
    :class:`qveil.errors.BudgetExceeded` (spent, requested, budget). Adaptive choice of the
    releases is allowed: each filter's theorem covers it (:data:`GAUSSIAN_FILTER`,
    :data:`BASIC_FILTER`)."""
    before = filter_state(events, budget_epsilon=budget_epsilon, budget_delta=budget_delta)
    after = filter_state([*events, new], budget_epsilon=budget_epsilon, budget_delta=budget_delta)
    if after.mu_spent is not None and after.mu_budget is not None:
        fits = after.mu_spent <= after.mu_budget * (1 + 1e-12)
    else:
        fits = after.spent[0] <= after.budget[0] * (1 + 1e-12) and after.spent[1] <= after.budget[1]
    if not fits:
        raise BudgetExceeded(
            dataset_id=new.dataset_id,
            spent=before.spent,
            requested=(new.epsilon, new.delta),
            cap=after.budget,
        )
    return after
