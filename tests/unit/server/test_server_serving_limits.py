"""The server's limits (qveil.server.serving.limits): the defaults, the per-caller bound of calls
in flight, and every limit refused with a clear error when it is out of range."""

from __future__ import annotations

import pytest

from qveil.answer import DEFAULT_VALUE_GRID
from qveil.errors import InvalidArgument
from qveil.server.serving.limits import DEFAULT_MAX_STORED_POINTS, Limits, per_caller_bound
from qveil.server.serving.quotas import DEFAULT_STATE_RATE


def test_defaults() -> None:
    lim = Limits()
    assert (lim.max_batch, lim.max_in_flight, lim.points_chunk) == (4096, 64, 2048)
    assert lim.value_grid == DEFAULT_VALUE_GRID
    assert lim.max_stored_points == DEFAULT_MAX_STORED_POINTS == 10_000_000
    cfg = lim.quota_config()
    assert cfg.state_rate == DEFAULT_STATE_RATE and cfg.state_burst is None


def test_the_quota_config_carries_the_limits_rate_and_burst() -> None:
    cfg = Limits(state_rate=2.5, state_burst=7.0).quota_config()
    assert (cfg.state_rate, cfg.state_burst) == (2.5, 7.0)


@pytest.mark.parametrize(
    ("max_in_flight", "per_caller", "bound"),
    [(64, None, 48), (4, None, 3), (1, None, 1), (2, None, 1), (64, 5, 5), (8, 8, 8)],
)
def test_per_caller_bound_is_three_quarters_unless_given(
    max_in_flight: int, per_caller: int | None, bound: int
) -> None:
    lim = Limits(max_in_flight=max_in_flight, max_in_flight_per_caller=per_caller)
    assert per_caller_bound(lim) == bound


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"max_batch": 0}, "limits must be positive"),
        ({"max_in_flight": 0}, "limits must be positive"),
        ({"points_chunk": -1}, "limits must be positive"),
        ({"max_in_flight_per_caller": 0}, r"must be in \[1, max_in_flight = 64\]"),
        ({"max_in_flight": 4, "max_in_flight_per_caller": 5}, r"\[1, max_in_flight = 4\]"),
        ({"value_grid": 0.3}, "value grid 0.3 must be a positive power of two"),
        ({"value_grid": 0.0}, "positive power of two"),
        ({"value_grid": -0.5}, "positive power of two"),
        ({"value_grid": float("inf")}, "positive power of two"),
        ({"value_grid": float("nan")}, "positive power of two"),
        ({"max_stored_points": -1}, "max stored points -1 must be an integer >= 0"),
        ({"max_stored_points": True}, "max stored points True"),
        ({"state_rate": 0.0}, "state rate 0.0 must be > 0 per second"),
        ({"state_rate": 1.0, "state_burst": 0.5}, "state burst 0.5 must be >= 1"),
    ],
)
def test_out_of_range_limits_are_refused(kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        Limits(**kwargs)  # type: ignore[arg-type]


def test_powers_of_two_grids_and_zero_stored_points_are_taken() -> None:
    for g in (2.0**-40, 0.5, 1.0, 1024.0):
        assert Limits(value_grid=g).value_grid == g
    assert Limits(max_stored_points=0).max_stored_points == 0
