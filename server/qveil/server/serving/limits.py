"""The server's limits: batch size, calls in flight (total and per caller), the value grid,
the audit stream's chunk, the audit log's cap and the query quota (``qveil.server.serving.quotas``),
validated once when the server starts."""

from __future__ import annotations

import math
from dataclasses import dataclass

from qveil.answer import DEFAULT_VALUE_GRID
from qveil.errors import InvalidArgument
from qveil.server.serving.quotas import DEFAULT_STATE_RATE, QuotaConfig

#: the audit log's default cap: answered points kept per release
DEFAULT_MAX_STORED_POINTS = 10_000_000

__all__ = ["DEFAULT_MAX_STORED_POINTS", "DEFAULT_VALUE_GRID", "Limits", "per_caller_bound"]


@dataclass(frozen=True, slots=True)
class Limits:
    max_batch: int = 4096  # states per request
    max_in_flight: int = 64  # concurrent qveil RPCs; more get RESOURCE_EXHAUSTED
    value_grid: float = DEFAULT_VALUE_GRID
    points_chunk: int = 2048  # noise points per streamed audit message
    # concurrent RPCs of ONE caller (token, or connection when anonymous); None -> 3/4 of
    # max_in_flight, so one flooding caller can never take the capacity others need
    max_in_flight_per_caller: int | None = None
    # the audit log's cap: answered points kept per release (past it answers go on, unlogged)
    max_stored_points: int = DEFAULT_MAX_STORED_POINTS
    # each caller's token bucket of states per second (burst None: 100 s of the rate)
    state_rate: float = DEFAULT_STATE_RATE
    state_burst: float | None = None

    def __post_init__(self) -> None:
        self.quota_config()  # validates
        if isinstance(self.max_stored_points, bool) or self.max_stored_points < 0:
            raise InvalidArgument(
                f"max stored points {self.max_stored_points!r} must be an integer >= 0"
            )
        if self.max_batch < 1 or self.max_in_flight < 1 or self.points_chunk < 1:
            raise InvalidArgument("limits must be positive")
        if self.max_in_flight_per_caller is not None and not (
            1 <= self.max_in_flight_per_caller <= self.max_in_flight
        ):
            raise InvalidArgument(
                f"max_in_flight_per_caller {self.max_in_flight_per_caller!r} must be in "
                f"[1, max_in_flight = {self.max_in_flight}]"
            )
        g = self.value_grid
        if not (g > 0 and math.isfinite(g) and math.frexp(g)[0] == 0.5):
            raise InvalidArgument(f"value grid {g!r} must be a positive power of two")

    def quota_config(self) -> QuotaConfig:
        return QuotaConfig(state_rate=self.state_rate, state_burst=self.state_burst)


def per_caller_bound(limits: Limits) -> int:
    """The effective per-caller bound (see ``Limits.max_in_flight_per_caller``)."""
    if limits.max_in_flight_per_caller is not None:
        return limits.max_in_flight_per_caller
    return max(1, (3 * limits.max_in_flight) // 4)
