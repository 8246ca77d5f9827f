"""Bounded storage (issue 14 item 4): a cap on the stored points of a release and a
token-bucket budget of new points per caller.

Every new state costs a durable row per action, forever: a stored value may never be dropped
(non-negotiable 1), so an anonymous client writing 262k new points in 10 s grows the store
(and the server's in-process copy of it) without bound. A request is classified *before*
anything is sampled: the handler counts its (state, action) pairs that are not stored yet
(``SamplePathStore.count_new``, after bringing the in-process copy up to date with the
database), then :meth:`Quotas.admit` either reserves them or refuses the whole request with
ResourceExhausted. A refused request stores nothing; a request of stored states only is never
refused here (known points are always answered).

* ``max_stored_points`` (``--max-stored-points``): points per release, all actions. Checked
  against the store's count plus the points other requests of this process have reserved
  and not yet committed, so concurrent requests of one process never overshoot. Both are
  read under the admission lock, reservations first: a reservation counts only its points
  that are still not stored (``still_new``), so a request between its commit and
  :meth:`Quotas.done` is not counted twice (that double count refused requests below the
  cap), and a commit landing between the two reads is counted twice at worst, never zero
  times (the cap is never overshot). Replicas
  sharing one store each see the others' committed points (the count is refreshed from the
  database), so together they may overshoot by at most the points in flight at once.
* ``new_point_rate`` (``--new-point-rate``, points per second) with a bucket of
  ``new_point_burst`` points per caller: the caller's token name, or its peer host without
  tokens (not the connection, so reconnecting does not refill the bucket). A request whose
  new points exceed the tokens left is refused whole and takes no tokens.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from qveil.errors import InvalidArgument, ResourceExhausted

__all__ = ["DEFAULT_MAX_STORED_POINTS", "DEFAULT_NEW_POINT_RATE", "QuotaConfig", "Quotas"]

DEFAULT_MAX_STORED_POINTS = 10_000_000
DEFAULT_NEW_POINT_RATE = 2000.0
#: the bucket holds this many seconds of the rate by default (a full batch of new states of a
#: few actions fits: 4096 states x 2 actions = 8192 < 10 s x 2000/s)
DEFAULT_BURST_SECONDS = 10.0
#: callers whose bucket is full are forgotten once more than this many are tracked
MAX_TRACKED_CALLERS = 10_000


@dataclass(frozen=True, slots=True)
class QuotaConfig:
    max_stored_points: int = DEFAULT_MAX_STORED_POINTS
    new_point_rate: float = DEFAULT_NEW_POINT_RATE
    new_point_burst: float | None = None  # None: DEFAULT_BURST_SECONDS x the rate

    def __post_init__(self) -> None:
        if isinstance(self.max_stored_points, bool) or self.max_stored_points < 0:
            raise InvalidArgument(
                f"max stored points {self.max_stored_points!r} must be an integer >= 0"
            )
        if not (math.isfinite(self.new_point_rate) and self.new_point_rate > 0):
            raise InvalidArgument(f"new point rate {self.new_point_rate!r} must be > 0 per second")
        b = self.new_point_burst
        if b is not None and not (math.isfinite(b) and b >= 1):
            raise InvalidArgument(f"new point burst {b!r} must be >= 1")

    @property
    def burst(self) -> float:
        if self.new_point_burst is not None:
            return float(self.new_point_burst)
        return max(1.0, DEFAULT_BURST_SECONDS * self.new_point_rate)


class Quotas:
    """Thread-safe admission of new points (see the module docstring)."""

    def __init__(self, config: QuotaConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # caller -> (tokens, at)
        # release -> {ticket: (points reserved, callable counting those still not stored)}
        self._pending: dict[str, dict[int, tuple[int, Callable[[], int] | None]]] = {}
        self._tickets = 0
        self.refused: dict[str, int] = {"stored_points": 0, "new_point_rate": 0}

    def _tokens(self, caller: str, now: float) -> float:
        burst, rate = self.config.burst, self.config.new_point_rate
        tokens, at = self._buckets.get(caller, (burst, now))
        return min(burst, tokens + (now - at) * rate)

    def admit(
        self,
        caller: str,
        release_id: str,
        new_points: int,
        stored: int | Callable[[], int],
        *,
        still_new: Callable[[], int] | None = None,
    ) -> int:
        """Reserve ``new_points`` of ``release_id`` for ``caller`` and return the ticket for
        :meth:`done`, or raise ResourceExhausted and change nothing. ``stored``: the
        release's stored points (or a callable read under the lock); ``still_new``: how many
        of this reservation's points are not stored yet (default: all of them until done)."""
        if new_points <= 0:
            return 0
        cfg = self.config
        with self._lock:
            now = self._clock()
            pending = sum(
                n if fn is None else min(n, fn())
                for n, fn in self._pending.get(release_id, {}).values()
            )
            count = stored() if callable(stored) else stored
            total = count + pending + new_points
            if total > cfg.max_stored_points:
                self.refused["stored_points"] += 1
                raise ResourceExhausted(
                    f"release {release_id[:80]!r} holds {count} stored points and this "
                    f"request needs {new_points} new ones: the cap is {cfg.max_stored_points} "
                    "(--max-stored-points); states already stored are still answered"
                )
            tokens = self._tokens(caller, now)
            if new_points > tokens:
                self.refused["new_point_rate"] += 1
                if new_points > cfg.burst:
                    hint = f"more than the bucket of {cfg.burst:g}: split the request"
                else:
                    wait = (new_points - tokens) / cfg.new_point_rate
                    hint = f"{tokens:.0f} left; retry in {wait:.2f} s"
                raise ResourceExhausted(
                    f"this request needs {new_points} new points (states not stored yet, "
                    f"times actions), over this caller's budget of {cfg.new_point_rate:g} "
                    f"new points/s (--new-point-rate): {hint}; nothing was stored"
                )
            self._buckets[caller] = (tokens - new_points, now)
            self._tickets += 1
            self._pending.setdefault(release_id, {})[self._tickets] = (new_points, still_new)
            if len(self._buckets) > MAX_TRACKED_CALLERS:
                self._forget_full(now)
            return self._tickets

    def done(self, release_id: str, ticket: int) -> None:
        """The reservation ``ticket`` is committed (now counted by the store) or failed."""
        if ticket <= 0:
            return
        with self._lock:
            mine = self._pending.get(release_id, {})
            mine.pop(ticket, None)
            if not mine:
                self._pending.pop(release_id, None)

    def _forget_full(self, now: float) -> None:
        burst = self.config.burst
        for caller in [c for c in self._buckets if self._tokens(c, now) >= burst]:
            del self._buckets[caller]


def caller_host(peer: str) -> str:
    """The host part of a gRPC peer string ("ipv4:1.2.3.4:5678" -> "ipv4:1.2.3.4",
    "ipv6:[::1]:5678" -> "ipv6:[::1]"): one bucket per host, not per connection."""
    kind, sep, rest = peer.partition(":")
    if not sep or kind not in ("ipv4", "ipv6"):
        return peer
    host, colon, port = rest.rpartition(":")
    return f"{kind}:{host}" if colon and port.isdigit() else peer
