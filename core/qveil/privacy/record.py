"""The JSON round trip of the accountants' frozen dataclasses (parameter sets, ledger
events): a validated copy with some fields changed, a JSON-ready dict, and reading a
recorded one back with unknown or missing fields refused as :class:`InvalidArgument`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeAlias, TypeVar  # Any: FieldValue

from qveil.errors import InvalidArgument
from qveil.json_types import JSONMapping, JSONObject

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["FieldValue", "GaussianResult", "Record", "construct", "reject_unknown"]

T = TypeVar("T")
#: The value of some field of a dataclass, as a ``replace(**changes)`` passes it on.
FieldValue: TypeAlias = Any  # mypy checks replace(**changes) against every field: object fails


class Record:
    """Base of a frozen dataclass that is recorded as JSON (a card, a ledger event)."""

    #: tuple fields that :meth:`to_dict` writes as lists (JSON has no tuples)
    _AS_LISTS: ClassVar[tuple[str, ...]] = ()

    def replace(self, **changes: FieldValue) -> Self:
        """A copy with some fields changed (validated again)."""
        out: Self = dataclasses.replace(self, **changes)  # type: ignore[type-var]
        return out

    def to_dict(self) -> JSONObject:
        """JSON-ready dict of every field."""
        d: JSONObject = dataclasses.asdict(self)  # type: ignore[call-overload]
        for name in self._AS_LISTS:
            d[name] = list(getattr(self, name))
        return d


class GaussianResult:
    """Base of an accountant's frozen result dataclass for one Gaussian mechanism of noise
    ``sigma`` on a statistic of sensitivity ``sensitivity``, accounted for ``params``."""

    sensitivity: float
    sigma: float
    params: Record

    @property
    def mu(self) -> float:
        """GDP parameter Delta / sigma (exact composition in the ledger)."""
        return self.sensitivity / self.sigma

    def to_dict(self) -> JSONObject:
        """JSON-ready dict of every field (params as their dict) and ``mu``."""
        d = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
            if f.name != "params"
        }
        d["params"] = self.params.to_dict()
        d["mu"] = self.mu
        return d


def reject_unknown(cls: type[DataclassInstance], d: JSONMapping, what: str) -> None:
    """InvalidArgument ``unknown <what>: a, b`` for the keys of ``d`` that are no field of the
    dataclass ``cls`` (a record from a newer version must not be silently mis-read)."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise InvalidArgument(f"unknown {what}: {', '.join(unknown)}")


def construct(cls: Callable[..., T], kw: JSONMapping, what: str) -> T:
    """``cls(**kw)``; a missing or surplus field is InvalidArgument ``<what>: <reason>``."""
    try:
        return cls(**kw)
    except TypeError as exc:
        raise InvalidArgument(f"{what}: {exc}") from None
