"""The JSON round trip of recorded frozen dataclasses (qveil.privacy.record)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from qveil.errors import InvalidArgument
from qveil.privacy.record import GaussianResult, Record, construct, reject_unknown


@dataclasses.dataclass(frozen=True, kw_only=True)
class Params(Record):
    _AS_LISTS = ("tags",)
    n: int
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.n <= 0:
            raise InvalidArgument(f"n must be > 0, got {self.n}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Result(GaussianResult):
    sensitivity: float
    sigma: float
    params: Params


def test_to_dict_writes_tuples_as_lists_and_is_json() -> None:
    p = Params(n=3, tags=("a", "b"))
    d = p.to_dict()
    assert d == {"n": 3, "tags": ["a", "b"]}
    assert json.loads(json.dumps(d)) == d


def test_replace_copies_and_validates_again() -> None:
    p = Params(n=3)
    q = p.replace(n=4)
    assert (p.n, q.n) == (3, 4) and isinstance(q, Params)
    with pytest.raises(InvalidArgument, match="n must be > 0, got 0"):
        p.replace(n=0)


def test_gaussian_result_mu_and_dict() -> None:
    r = Result(sensitivity=2.0, sigma=4.0, params=Params(n=1, tags=("x",)))
    assert r.mu == 0.5
    assert r.to_dict() == {
        "sensitivity": 2.0,
        "sigma": 4.0,
        "params": {"n": 1, "tags": ["x"]},
        "mu": 0.5,
    }


def test_reject_unknown_names_every_unknown_key_sorted() -> None:
    reject_unknown(Params, {"n": 1, "tags": []}, "params field")
    with pytest.raises(InvalidArgument) as exc:
        reject_unknown(Params, {"n": 1, "zz": 0, "aa": 0}, "params field")
    assert str(exc.value) == "unknown params field: aa, zz"


def test_construct_turns_a_missing_or_surplus_field_into_invalid_argument() -> None:
    assert construct(Params, {"n": 2}, "params") == Params(n=2)
    with pytest.raises(InvalidArgument, match=r"^params: .*missing.*'n'"):
        construct(Params, {}, "params")
    with pytest.raises(InvalidArgument, match=r"^params: .*unexpected keyword.*'m'"):
        construct(Params, {"n": 1, "m": 2}, "params")
