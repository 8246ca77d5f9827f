"""Bounded storage: a cap on the stored points of a release and a token-bucket budget of new
states per caller.

Every new state costs durable rows forever: a stored value may never be dropped, so a state
of d coordinates asked for m actions stores up to d x m points (one per coordinate value and
action path that is not stored yet), and the store and the server's in-process copy of it
grow with every new state. A request is classified *before* anything is sampled: the handler
counts its new states (states with at least one point not stored yet) and their new points
(after bringing the in-process copy up to date with the database), then :meth:`Quotas.admit`
either reserves them or refuses the whole request with ResourceExhausted. A refused request
stores nothing; a request of stored states only is never refused here (known points are
always answered).

Units: the operator's units are *states* (what a client sends) for the rate, and *points*
(what the store holds) for the cap, because storage is what the cap bounds.

* ``max_stored_points`` (``--max-stored-points``): points per release, all actions and
  coordinates. Checked against the store's count plus the points other requests of this
  process have reserved and not yet committed, so concurrent requests of one process never
  overshoot. Both are read under the admission lock, reservations first: a reservation counts
  only its points that are still not stored (``still_new``), so a request between its commit
  and :meth:`Quotas.done` is not counted twice (that double count refused requests below the
  cap), and a commit landing between the two reads is counted twice at worst, never zero
  times (the cap is never overshot). Replicas sharing one store each see the others'
  committed points (the count is refreshed from the database), so together they may overshoot
  by at most the points in flight at once. Retrying does not help: the refusal says so
  (``retry_after`` infinite).
* ``new_state_rate`` (``--new-state-rate``, new states per second) with a bucket of
  ``new_state_burst`` states per caller: the caller's token name, or its peer host without
  tokens (not the connection, so reconnecting does not refill the bucket). A request whose
  new states exceed the tokens left is refused whole, takes no tokens, and carries the exact
  wait after which it fits (``retry_after``); a request larger than the whole bucket can never
  fit and says so.
* ``new_point_rate`` / ``new_point_burst`` (deprecated ``--new-point-rate``): an optional
  second bucket in stored points, applied beside the state bucket when set.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from qveil.errors import InvalidArgument, ResourceExhausted

__all__ = [
    "DEFAULT_BURST_SECONDS",
    "DEFAULT_MAX_STORED_POINTS",
    "DEFAULT_NEW_STATE_RATE",
    "QuotaConfig",
    "Quotas",
    "caller_host",
]

DEFAULT_MAX_STORED_POINTS = 10_000_000
#: new states per second per caller: above what one client asking one state per call can send
#: (about 300/s for CartPole on the reference machine), below what a flood of batches can
DEFAULT_NEW_STATE_RATE = 1000.0
#: the bucket holds this many seconds of the rate by default: 100 000 states at the default
#: rate, a whole 100-episode evaluation of CartPole (<= 50 000 states) or LunarLander
#: (<= 100 000 states) at full speed
DEFAULT_BURST_SECONDS = 100.0
#: deprecated point bucket without an explicit burst: 10 s of its rate (its former default)
POINT_BURST_SECONDS = 10.0
#: callers whose buckets are full are forgotten once more than this many are tracked
MAX_TRACKED_CALLERS = 10_000
#: a retry waits this much longer than the exact refill time (clock granularity)
RETRY_MARGIN_S = 0.002


def _check_rate(name: str, rate: float | None, burst: float | None) -> None:
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise InvalidArgument(f"{name} rate {rate!r} must be > 0 per second")
    if burst is not None and not (math.isfinite(burst) and burst >= 1):
        raise InvalidArgument(f"{name} burst {burst!r} must be >= 1")


@dataclass(frozen=True, slots=True)
class QuotaConfig:
    max_stored_points: int = DEFAULT_MAX_STORED_POINTS
    new_state_rate: float = DEFAULT_NEW_STATE_RATE
    new_state_burst: float | None = None  # None: DEFAULT_BURST_SECONDS x the rate
    #: deprecated second bucket in stored points (None: off)
    new_point_rate: float | None = None
    new_point_burst: float | None = None  # None: POINT_BURST_SECONDS x its rate

    def __post_init__(self) -> None:
        if isinstance(self.max_stored_points, bool) or self.max_stored_points < 0:
            raise InvalidArgument(
                f"max stored points {self.max_stored_points!r} must be an integer >= 0"
            )
        _check_rate("new state", self.new_state_rate, self.new_state_burst)
        _check_rate("new point", self.new_point_rate, self.new_point_burst)
        if self.new_point_burst is not None and self.new_point_rate is None:
            raise InvalidArgument("a new point burst needs a new point rate")

    @property
    def burst(self) -> float:
        """The state bucket's size."""
        if self.new_state_burst is not None:
            return float(self.new_state_burst)
        return max(1.0, DEFAULT_BURST_SECONDS * self.new_state_rate)

    @property
    def point_burst(self) -> float | None:
        """The point bucket's size (None: no point bucket)."""
        if self.new_point_rate is None:
            return None
        if self.new_point_burst is not None:
            return float(self.new_point_burst)
        return max(1.0, POINT_BURST_SECONDS * self.new_point_rate)


@dataclass(frozen=True, slots=True)
class _Bucket:
    unit: str  # "states" | "points"
    flag: str
    rate: float
    burst: float


class Quotas:
    """Thread-safe admission of new states and points (see the module docstring)."""

    def __init__(self, config: QuotaConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()
        kinds = [_Bucket("states", "--new-state-rate", config.new_state_rate, config.burst)]
        pb = config.point_burst
        if config.new_point_rate is not None and pb is not None:
            kinds.append(_Bucket("points", "--new-point-rate", config.new_point_rate, pb))
        self._kinds = tuple(kinds)
        # (caller, unit) -> (tokens, at)
        self._buckets: dict[tuple[str, str], tuple[float, float]] = {}
        # release -> {ticket: (points reserved, callable counting those still not stored)}
        self._pending: dict[str, dict[int, tuple[int, Callable[[], int] | None]]] = {}
        self._tickets = 0
        self.refused: dict[str, int] = {"stored_points": 0, "new_state_rate": 0}
        if len(self._kinds) > 1:
            self.refused["new_point_rate"] = 0

    def _tokens(self, caller: str, kind: _Bucket, now: float) -> float:
        tokens, at = self._buckets.get((caller, kind.unit), (kind.burst, now))
        return min(kind.burst, tokens + (now - at) * kind.rate)

    def admit(
        self,
        caller: str,
        release_id: str,
        *,
        new_states: int,
        new_points: int,
        stored: int | Callable[[], int],
        still_new: Callable[[], int] | None = None,
    ) -> int:
        """Reserve ``new_states`` (``new_points`` stored points) of ``release_id`` for
        ``caller`` and return the ticket for :meth:`done`, or raise ResourceExhausted (with
        ``retry_after``) and change nothing. ``stored``: the release's stored points (or a
        callable read under the lock); ``still_new``: how many of this reservation's points
        are not stored yet (default: all of them until done)."""
        if new_points <= 0:
            return 0
        new_states = max(1, new_states)
        cfg = self.config
        with self._lock:
            now = self._clock()
            reserved = self._pending.get(release_id, {}).values()
            count = stored() if callable(stored) else stored
            # the reservations' points still not stored are counted (still_new) only when
            # all their points would not fit: the same verdict, without a count per
            # reservation on every admission
            pending = sum(n for n, _fn in reserved)
            if count + pending + new_points > cfg.max_stored_points:
                pending = sum(n if fn is None else min(n, fn()) for n, fn in reserved)
            if count + pending + new_points > cfg.max_stored_points:
                self.refused["stored_points"] += 1
                raise ResourceExhausted(
                    f"release {release_id[:80]!r} holds {count} stored points and this "
                    f"request needs {new_points} new ones: the cap is {cfg.max_stored_points} "
                    "(--max-stored-points); states already stored are still answered",
                    retry_after=math.inf,
                )
            need = {"states": float(new_states), "points": float(new_points)}
            left = {k.unit: self._tokens(caller, k, now) for k in self._kinds}
            for k in self._kinds:
                n, tokens = need[k.unit], left[k.unit]
                if n <= tokens:
                    continue
                self.refused[k.flag.removeprefix("--").replace("-", "_")] += 1
                what = (
                    f"{new_states} new states"
                    if k.unit == "states"
                    else f"{new_points} new points (states not stored yet, times actions "
                    "and coordinates)"
                )
                head = (
                    f"this request asks for {what}, over this caller's budget of "
                    f"{k.rate:g} new {k.unit}/s ({k.flag})"
                )
                if n > k.burst:
                    raise ResourceExhausted(
                        f"{head}: more than the bucket of {k.burst:g}: split the request; "
                        "nothing was stored",
                        retry_after=math.inf,
                    )
                wait = max(
                    (need[b.unit] - left[b.unit]) / b.rate for b in self._kinds
                )  # every bucket must have refilled
                raise ResourceExhausted(
                    f"{head}: {tokens:.0f} left; retry in {wait:.2f} s; nothing was stored",
                    retry_after=wait + RETRY_MARGIN_S,
                )
            for k in self._kinds:
                self._buckets[(caller, k.unit)] = (left[k.unit] - need[k.unit], now)
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
        kinds = {k.unit: k for k in self._kinds}
        for key in [
            key
            for key in self._buckets
            if self._tokens(key[0], kinds[key[1]], now) >= kinds[key[1]].burst
        ]:
            del self._buckets[key]


def caller_host(peer: str) -> str:
    """The host part of a gRPC peer string ("ipv4:1.2.3.4:5678" -> "ipv4:1.2.3.4",
    "ipv6:[::1]:5678" -> "ipv6:[::1]"): one bucket per host, not per connection."""
    kind, sep, rest = peer.partition(":")
    if not sep or kind not in ("ipv4", "ipv6"):
        return peer
    host, colon, port = rest.rpartition(":")
    return f"{kind}:{host}" if colon and port.isdigit() else peer
