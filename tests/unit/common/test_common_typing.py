"""The API's types (qveil.common.typing): frozen, slotted dataclasses that server and SDK
share; a release's card starts with the header every view of it shares, and its defaults
(the card, the coordinates) are its own."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from qveil.common import typing as t


def _release(**kw: object) -> t.Release:
    fields: dict[str, object] = {
        "release_id": "r1", "status": "active", "sigma": 1.0, "beta": 2.0,
        "interval": (0.0, 1.0), "n_actions": 2, "mode": "fqi", "epsilon": 1.0,
        "delta": 1e-5, "delta_total": 1e-5, "holds": True, "basis": "b", "reason": None,
        "created_at": None, "seeded": False, "env_id": "E", "q_bound": None,
        "value_grid": 0.5,
    }  # fmt: skip
    return t.Release(**{**fields, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", t.__all__)
def test_every_type_is_a_frozen_slotted_dataclass(name: str) -> None:
    cls = getattr(t, name)
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    assert "__slots__" in cls.__dict__


def test_a_value_cannot_be_changed_or_added() -> None:
    v = t.Values("r1", (0, 1), np.zeros((2, 2)), 0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.release_id = "r2"  # type: ignore[misc]
    with pytest.raises((AttributeError, TypeError)):
        v.extra = 1  # type: ignore[attr-defined]


def test_a_release_starts_with_the_header_and_has_its_own_defaults() -> None:
    header = [f.name for f in dataclasses.fields(t.ReleaseHeader)]
    assert header == ["release_id", "status", "sigma", "beta", "interval", "n_actions"]
    assert [f.name for f in dataclasses.fields(t.Release)][: len(header)] == header
    a, b = _release(), _release()
    assert (a.dims, a.state_intervals, a.betas, a.card) == (1, (), (), {})
    assert a.card is not b.card  # each release its own card
    assert a == b and _release(dims=3) != a
