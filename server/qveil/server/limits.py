"""The server's limits: batch size, calls in flight (total and per caller), the value grid,
the audit stream's chunk, the minimum latency of a value-returning answer, and the storage
quotas (``qveil.server.quotas``), validated once when the server starts."""

from __future__ import annotations

import math
from dataclasses import dataclass

from qveil.errors import InvalidArgument
from qveil.server.quotas import (
    DEFAULT_MAX_STORED_POINTS,
    DEFAULT_NEW_STATE_RATE,
    QuotaConfig,
)

__all__ = ["DEFAULT_VALUE_GRID", "Limits", "per_caller_bound"]

DEFAULT_VALUE_GRID = 2.0**-20


@dataclass(frozen=True, slots=True)
class Limits:
    max_batch: int = 4096  # states per request
    max_in_flight: int = 64  # concurrent qveil RPCs; more get RESOURCE_EXHAUSTED
    value_grid: float = DEFAULT_VALUE_GRID
    points_chunk: int = 2048  # noise points per streamed audit message
    # concurrent RPCs of ONE caller (token, or connection when anonymous); None -> 3/4 of
    # max_in_flight, so one flooding caller can never take the capacity others need
    max_in_flight_per_caller: int | None = None
    # every value-returning response (GetValues, GetBestActions; errors
    # included) takes at least this long, so latency does not tell stored from new states
    min_latency_ms: float = 0.0
    # storage limits (qveil.server.quotas): stored points per release, and each caller's
    # token bucket of new states per second (burst None: 100 s of the rate); the point
    # bucket (new_point_rate, deprecated) is off unless set
    max_stored_points: int = DEFAULT_MAX_STORED_POINTS
    new_state_rate: float = DEFAULT_NEW_STATE_RATE
    new_state_burst: float | None = None
    new_point_rate: float | None = None
    new_point_burst: float | None = None

    def __post_init__(self) -> None:
        self.quota_config()  # validates
        if not (math.isfinite(self.min_latency_ms) and 0 <= self.min_latency_ms <= 60_000):
            raise InvalidArgument(
                f"min latency {self.min_latency_ms!r} ms must be in [0, 60000] (0: off)"
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
        return QuotaConfig(
            max_stored_points=self.max_stored_points,
            new_state_rate=self.new_state_rate,
            new_state_burst=self.new_state_burst,
            new_point_rate=self.new_point_rate,
            new_point_burst=self.new_point_burst,
        )


def per_caller_bound(limits: Limits) -> int:
    """The effective per-caller bound (see ``Limits.max_in_flight_per_caller``)."""
    if limits.max_in_flight_per_caller is not None:
        return limits.max_in_flight_per_caller
    return max(1, (3 * limits.max_in_flight) // 4)
