"""The privacy modules' argument checks (qveil.privacy.checks): a finite real within bounds,
else InvalidArgument naming the parameter and repeating the value."""

from __future__ import annotations

import numpy as np
import pytest

from qveil.errors import InvalidArgument
from qveil.privacy.checks import ONE_KEY, number, positive


def test_number_returns_a_float() -> None:
    out = number("x", np.int64(3), lo=0.0, hi=5.0)
    assert out == 3.0 and type(out) is float
    assert number("x", 0.5) == 0.5


@pytest.mark.parametrize(
    ("value", "kw", "message"),
    [
        ("1", {}, "x must be a number, got '1'"),
        (True, {}, "x must be a number, got True"),
        (None, {}, "x must be a number, got None"),
        (float("nan"), {}, "x must be finite, got nan"),
        (float("inf"), {}, "x must be finite, got inf"),
        (0.0, {"lo": 0.0}, "x must be > 0, got 0.0"),
        (-0.5, {"lo": 0.0, "lo_open": False}, "x must be >= 0, got -0.5"),
        (1.0, {"hi": 1.0}, "x must be < 1, got 1.0"),
        (2, {"hi": 1.0, "hi_open": False}, "x must be <= 1, got 2"),
    ],
)
def test_number_refuses_with_the_name_and_value(
    value: object, kw: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidArgument) as exc:
        number("x", value, **kw)  # type: ignore[arg-type]
    assert str(exc.value) == message


def test_closed_bounds_take_the_bound_itself() -> None:
    assert number("x", 0.0, lo=0.0, lo_open=False) == 0.0
    assert number("x", 1.0, hi=1.0, hi_open=False) == 1.0


def test_positive() -> None:
    assert positive("sigma", 1e-12) == 1e-12
    with pytest.raises(InvalidArgument, match="sigma must be > 0, got 0"):
        positive("sigma", 0)
    with pytest.raises(InvalidArgument, match="sigma must be a number"):
        positive("sigma", "0.3")


def test_one_key_basis_sentence() -> None:
    assert ONE_KEY.startswith(" ") and "one noise key" in ONE_KEY
