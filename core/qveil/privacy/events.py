"""Typed, frozen privacy events: one dataclass per mechanism qveil records.

In the shape of dp_accounting's ``DpEvent`` (``dp_accounting/dp_event.py``: frozen events
such as ``GaussianDpEvent(noise_multiplier)``), an event holds the parameters of one private
release that are necessary and sufficient to account for it, typed: :meth:`MechanismEvent.
account` recomputes its cost from them alone, so an auditor replays the record instead of
trusting a number. The ledger entry (:class:`qveil.privacy.ledger.PrivacyEvent`) pairs one
with the recorded guarantee and the dataset it was charged to.

The mechanisms (each class documents what it releases and how it is accounted):

====================================  ======  ==============================================
class                                 mode    parameters
====================================  ======  ==============================================
:class:`Theorem5Event`                paper   :class:`PrivacyParams` (Algorithm 1)
:class:`GdpTrainingEvent`             gdp     :class:`PrivacyParams` (Algorithm 1)
:class:`OutputGaussianEvent`          output  :class:`PrivacyParams` (Algorithm 1)
:class:`GridFQIEvent`                 fqi     :class:`FQIPrivacyParams` (1-D grid fit)
:class:`KernelFQIEvent`               fqi     :class:`KernelFQIPrivacyParams`
:class:`PrivateEvaluationEvent`       fqi     :class:`OPEPrivacyParams`
:class:`PlannedEvent`                 any     none: a cost checked before the release exists
:class:`AsRecordedEvent`              any     one of the above, in an earlier recorded form
:class:`UnsupportedEvent`             any     a recorded parameter set no accountant reads
====================================  ======  ==============================================

JSON: an event is written as its ``mode`` and ``params`` (its parameter set's dict, ``{}``
for a planned charge), the form every ledger has stored; :func:`event_from_record` reads that
form back and :func:`event_from_params` reads a card's ``privacy_params``. As in
dp_accounting, event classes and their parameters are never removed or redefined: a ledger
written by an earlier version must replay to the same numbers.

Pure: no I/O, no randomness.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol

from qveil.errors import InvalidArgument
from qveil.json_types import JSONMapping, JSONObject
from qveil.privacy.accountant import account
from qveil.privacy.fqi import FQIPrivacyParams, RelationParams, account_fqi
from qveil.privacy.kfqi import KernelFQIPrivacyParams, account_kernel_fqi
from qveil.privacy.ope import OPEPrivacyParams, account_ope
from qveil.privacy.params import MODES, PrivacyParams

__all__ = [
    "EVENT_MODES",
    "Accounting",
    "AsRecordedEvent",
    "GdpTrainingEvent",
    "GridFQIEvent",
    "KernelFQIEvent",
    "MechanismEvent",
    "OutputGaussianEvent",
    "PlannedEvent",
    "PrivateEvaluationEvent",
    "RecordedParams",
    "Theorem5Event",
    "UnsupportedEvent",
    "account_params",
    "event_for",
    "event_from_params",
    "event_from_record",
]

#: Modes a ledger event may have: Algorithm 1's and the fqi mode (one Gaussian mechanism).
EVENT_MODES = (*MODES, "fqi")

#: Every parameter set an accountant reads (a card's or a ledger event's ``privacy_params``).
#: a recorded parameter set: Algorithm 1's, either fqi estimator's (both RelationParams:
#: FQIPrivacyParams, KernelFQIPrivacyParams) or a private evaluation's
RecordedParams = PrivacyParams | RelationParams | OPEPrivacyParams


class Accounting(Protocol):
    """What an accountant concludes about one release (:class:`qveil.privacy.PrivacyResult`,
    :class:`qveil.privacy.fqi.FQIPrivacyResult`, :class:`qveil.privacy.ope.OPEPrivacyResult`):
    when ``holds``, the release is (epsilon, delta_total)-DP; ``mu`` is its GDP parameter
    when it is a Gaussian mechanism."""

    @property
    def mode(self) -> str: ...
    @property
    def epsilon(self) -> float | None: ...
    @property
    def delta(self) -> float: ...
    @property
    def delta_total(self) -> float | None: ...
    @property
    def holds(self) -> bool: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def sigma(self) -> float: ...
    @property
    def mu(self) -> float | None: ...
    @property
    def basis(self) -> str: ...
    @property
    def params(self) -> RecordedParams: ...
    def to_dict(self) -> JSONObject: ...


class MechanismEvent(ABC):
    """One private mechanism applied to a population's data, with the typed parameters that
    account for it (the module docstring lists the kinds)."""

    @property
    @abstractmethod
    def mode(self) -> str:
        """The accounting mode recorded with the event (paper, gdp, output or fqi)."""

    @abstractmethod
    def to_params(self) -> JSONObject:
        """The recorded parameter set as JSON values (the ledger's ``params``)."""

    @abstractmethod
    def account(self) -> Accounting:
        """The accountant's result, recomputed from this event's parameters alone; raises
        InvalidArgument when there is nothing to recompute."""


@dataclass(frozen=True)
class _Algorithm1Event(MechanismEvent):
    """Wang & Hegde (2019), Algorithm 1, accounted in the mode :attr:`MODE`."""

    MODE: ClassVar[str]
    params: PrivacyParams

    def __post_init__(self) -> None:
        if not isinstance(self.params, PrivacyParams) or self.params.mode != self.MODE:
            raise InvalidArgument(
                f"{type(self).__name__} needs PrivacyParams of mode {self.MODE}, got "
                f"{_describe(self.params)}"
            )

    @property
    def mode(self) -> str:
        return self.MODE

    def to_params(self) -> JSONObject:
        return self.params.to_dict()

    def account(self) -> Accounting:
        return account(self.params)


@dataclass(frozen=True)
class Theorem5Event(_Algorithm1Event):
    """Algorithm 1's training and release as Theorem 5 states it: updates + 1 Gaussian process
    mechanisms of per-step RKHS sensitivity sqrt(C), Theorem 5's closed form for epsilon, and
    Lemma 8's failure probability over the J noise paths added to delta. Not a pure Gaussian
    mechanism (no mu): it composes by the basic rule only."""

    MODE: ClassVar[str] = "paper"


@dataclass(frozen=True)
class GdpTrainingEvent(_Algorithm1Event):
    """Algorithm 1's training and release composed exactly: updates + 1 Gaussian process
    mechanisms of per-step sensitivity sqrt(C) are mu-GDP with mu = sqrt(updates + 1)
    sqrt(C) / sigma (dp_accounting's ``SelfComposedDpEvent(GaussianDpEvent(sigma / sqrt(C)),
    updates + 1)``), plus the Borell-TIS term of the noise bound in delta."""

    MODE: ClassVar[str] = "gdp"


@dataclass(frozen=True)
class OutputGaussianEvent(_Algorithm1Event):
    """One Gaussian process mechanism at release on the clamped, Lipschitz Q of the m actions
    jointly (Lemma 6's RKHS sensitivity): mu-GDP with mu = sensitivity / sigma, whatever
    training did."""

    MODE: ClassVar[str] = "output"


@dataclass(frozen=True)
class GridFQIEvent(MechanismEvent):
    """A 1-D grid release of the retired grid fit: averager FQI mapped into the RKHS of
    exp(-beta |x - y|) with certified kappa, one Gaussian mechanism over the m actions
    (Delta = D_T sqrt(m kappa)); kept so that the ledgers it charged still replay."""

    params: FQIPrivacyParams

    def __post_init__(self) -> None:
        _require(self, self.params, FQIPrivacyParams)

    @property
    def mode(self) -> str:
        return "fqi"

    def to_params(self) -> JSONObject:
        return self.params.to_dict()

    def account(self) -> Accounting:
        return account_fqi(self.params)


@dataclass(frozen=True)
class KernelFQIEvent(MechanismEvent):
    """A release of fqi on d coordinates: averager FQI, a public subspace KRR onto the
    additive RKHS of the noise (kappa = 1 / (4 lambda)), one Gaussian mechanism over the m
    actions (Delta = D_T sqrt(m kappa))."""

    params: KernelFQIPrivacyParams

    def __post_init__(self) -> None:
        _require(self, self.params, KernelFQIPrivacyParams)

    @property
    def mode(self) -> str:
        return "fqi"

    def to_params(self) -> JSONObject:
        return self.params.to_dict()

    def account(self) -> Accounting:
        return account_kernel_fqi(self.params)


@dataclass(frozen=True)
class PrivateEvaluationEvent(MechanismEvent):
    """A private off-policy evaluation: one Gaussian mechanism on the clipped mean of N
    held-out users' fitted-Q values (Delta_J = D_T + (q_hi - q_lo) / N)."""

    params: OPEPrivacyParams

    def __post_init__(self) -> None:
        _require(self, self.params, OPEPrivacyParams)

    @property
    def mode(self) -> str:
        return "fqi"

    def to_params(self) -> JSONObject:
        return self.params.to_dict()

    def account(self) -> Accounting:
        return account_ope(self.params)


@dataclass(frozen=True)
class PlannedEvent(MechanismEvent):
    """The cost a release is planned to have, checked against its population's budget
    before its parameters exist (``qveil train`` before it reads any data). Its epsilon,
    delta and mu are the ledger entry's own; there is nothing to recompute, so it is never
    recorded (the ledger verifies what it records)."""

    planned_mode: str

    def __post_init__(self) -> None:
        _check_mode(self.planned_mode)

    @property
    def mode(self) -> str:
        return self.planned_mode

    def to_params(self) -> JSONObject:
        return {}

    def account(self) -> Accounting:
        raise InvalidArgument("a planned charge has no parameters to re-account")


@dataclass(frozen=True)
class AsRecordedEvent(MechanismEvent):
    """A typed event whose recorded parameter set is not in the form this version writes
    (fields added since left out, an integer written as a float): it accounts as ``event``
    (the parameters read and validated) and writes back ``params`` exactly as read, so a
    ledger's record never changes by being loaded."""

    event: MechanismEvent
    params: JSONMapping
    """The recorded JSON object, kept as read (JSON values have no finer type)."""

    def __post_init__(self) -> None:
        _require(self, self.event, MechanismEvent)
        object.__setattr__(self, "params", dict(self.params))

    def __hash__(self) -> int:  # params is a dict: hash its canonical JSON
        return hash((self.event, _canonical(self.params)))

    @property
    def mode(self) -> str:
        return self.event.mode

    def to_params(self) -> JSONObject:
        return dict(self.params)

    def account(self) -> Accounting:
        return self.event.account()


@dataclass(frozen=True)
class UnsupportedEvent(MechanismEvent):
    """A recorded parameter set that no accountant of this version reads (dp_accounting's
    ``UnsupportedDpEvent``): the ledger entry still loads and its recorded cost composes,
    but it cannot be verified; :meth:`account` raises the reason."""

    recorded_mode: str
    params: JSONMapping
    """The recorded JSON object, kept as read (JSON values have no finer type)."""
    reason: str

    def __post_init__(self) -> None:
        _check_mode(self.recorded_mode)
        object.__setattr__(self, "params", dict(self.params))

    def __hash__(self) -> int:  # params is a dict: hash its canonical JSON
        return hash((self.recorded_mode, _canonical(self.params), self.reason))

    @property
    def mode(self) -> str:
        return self.recorded_mode

    def to_params(self) -> JSONObject:
        return dict(self.params)

    def account(self) -> Accounting:
        raise InvalidArgument(self.reason)


def _describe(value: object) -> str:
    mode = getattr(value, "mode", None)
    return f"{type(value).__name__}" + (f" of mode {mode!r:.80}" if mode is not None else "")


def _require(event: MechanismEvent, params: object, cls: type) -> None:
    if not isinstance(params, cls):
        raise InvalidArgument(
            f"{type(event).__name__} needs {cls.__name__}, got {_describe(params)}"
        )


def _check_mode(mode: object) -> None:
    if mode not in EVENT_MODES:
        raise InvalidArgument(f"mode must be one of {', '.join(EVENT_MODES)}; got {mode!r:.80}")


def _canonical(d: JSONMapping) -> str:
    return json.dumps(d, sort_keys=True, allow_nan=False)


def event_for(params: RecordedParams) -> MechanismEvent:
    """The event of a parameter set (an accountant's result's ``params``)."""
    if isinstance(params, PrivacyParams):
        kinds: dict[str, type[_Algorithm1Event]] = {
            "paper": Theorem5Event,
            "gdp": GdpTrainingEvent,
            "output": OutputGaussianEvent,
        }
        return kinds[params.mode](params)
    if isinstance(params, KernelFQIPrivacyParams):
        return KernelFQIEvent(params)
    if isinstance(params, FQIPrivacyParams):
        return GridFQIEvent(params)
    if isinstance(params, OPEPrivacyParams):
        return PrivateEvaluationEvent(params)
    raise InvalidArgument(f"no privacy event for {_describe(params)}")


def event_from_params(pp: JSONMapping) -> MechanismEvent:
    """The event of a recorded parameter set (a card's or a ledger event's
    ``privacy_params``): fqi (the grid fit, ``estimator`` kernel or ope) or Algorithm 1's
    modes. A set no accountant reads raises InvalidArgument naming why."""
    if not isinstance(pp, Mapping):
        raise InvalidArgument(f"privacy params must be a mapping, got {type(pp).__name__}")
    if pp.get("mode") == "fqi":
        if pp.get("estimator") == "ope":  # a private off-policy evaluation (qveil.ope)
            return PrivateEvaluationEvent(OPEPrivacyParams.from_dict(pp))
        if pp.get("estimator") == "kernel":  # the d-coordinate variant
            return KernelFQIEvent(KernelFQIPrivacyParams.from_dict(pp))
        return GridFQIEvent(FQIPrivacyParams.from_dict(pp))
    return event_for(PrivacyParams.from_dict(pp))


def account_params(pp: JSONMapping) -> Accounting:
    """The accountant's result for any recorded parameter set (a card's or a ledger
    event's ``privacy_params``)."""
    return event_from_params(pp).account()


def event_from_record(mode: object, params: object) -> MechanismEvent:
    """The event of a ledger record's ``mode`` and ``params``: a planned charge for empty
    params, the typed event of the parameter set when an accountant reads it, that mode and
    writes it back exactly, else an :class:`UnsupportedEvent` that keeps the record as read
    (it loads and composes; verifying it raises the reason). Every event writes back the
    ``params`` it was read from exactly (:class:`AsRecordedEvent`)."""
    _check_mode(mode)
    assert isinstance(mode, str)
    if not isinstance(params, Mapping):
        raise InvalidArgument(f"params must be a mapping, got {params!r:.80}")
    if not params:
        return PlannedEvent(mode)
    try:
        event = event_from_params(params)
    except InvalidArgument as exc:
        return UnsupportedEvent(mode, params, str(exc))
    if event.mode != mode:
        return UnsupportedEvent(mode, params, f"mode {mode!r} != recomputed {event.mode!r}")
    if _canonical(event.to_params()) != _canonical(params):
        return AsRecordedEvent(event, params)
    return event
