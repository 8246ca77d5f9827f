"""The accountant's parameters (qveil.privacy.PrivacyParams): a JSON round trip, frozen and
keyword-only; every bad field refused with its name and the value given."""

from __future__ import annotations

import dataclasses
import json

import pytest

from qveil.errors import InvalidArgument
from qveil.privacy import E3_SETTINGS, PrivacyParams


def e3(mode: str = "paper", sigma: float | None = 0.32, **kw: object) -> PrivacyParams:
    return PrivacyParams(mode=mode, sigma=sigma, **{**E3_SETTINGS, **kw})  # type: ignore[arg-type]


def test_params_round_trip_and_frozen() -> None:
    p = e3("output", sigma=3.0, steps=12, plain_sgd=False, beta=0.5, notes=("a", "b"))
    d = p.to_dict()
    assert PrivacyParams.from_dict(json.loads(json.dumps(d))) == p
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.sigma = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        PrivacyParams("paper", 0.3)  # type: ignore[misc]
    with pytest.raises(InvalidArgument, match="bogus"):
        PrivacyParams.from_dict({**d, "bogus": 1})
    with pytest.raises(InvalidArgument, match="missing"):
        PrivacyParams.from_dict({"mode": "gdp"})


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"sigma": 0.0}, "sigma must be > 0, got 0.0"),
        ({"sigma": -1.0}, "got -1.0"),
        ({"sigma": float("nan")}, "sigma must be finite, got nan"),
        ({"delta": 0.0}, "delta must be > 0, got 0.0"),
        ({"delta": 1.0}, "delta must be < 1, got 1.0"),
        ({"delta": float("inf")}, "got inf"),
        ({"k": 0.0}, "k must be > 0, got 0.0"),
        ({"k": -3}, "got -3"),
        ({"batch_size": 6000}, "batch_size=6000 > samples=5000"),
        ({"samples": 0}, "samples must be >= 1, got 0"),
        ({"batch_size": 2.5}, "batch_size must be an integer, got 2.5"),
        ({"lr": float("nan")}, "lr must be finite"),
        ({"lipschitz": 0}, "lipschitz must be > 0, got 0"),
        ({"resets": 0}, "resets must be >= 1, got 0"),
        ({"actions": True}, "actions must be an integer, got True"),
        ({"gamma": 1.0}, "gamma must be < 1, got 1.0"),
        ({"gamma": -0.1}, "gamma must be >= 0, got -0.1"),
        ({"reward_bound": -0.5}, "got -0.5"),
        ({"reward_sensitivity": 0.0}, "reward_sensitivity must be > 0, got 0.0"),
        ({"steps": -1}, "steps must be >= 0, got -1"),
        ({"plain_sgd": "yes"}, "plain_sgd must be true or false, got 'yes'"),
        ({"mode": "rdp"}, "got 'rdp'"),
        ({"beta": 2.0}, "beta=2.0"),
        ({"notes": "x"}, "notes"),
        ({"sigma": "0.3"}, "sigma must be a number, got '0.3'"),
    ],
)
def test_bad_params_are_rejected_with_the_value(changes: dict[str, object], fragment: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        e3(**changes)  # type: ignore[arg-type]
    assert fragment in str(exc.value)
