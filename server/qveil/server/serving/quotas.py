"""The query quota: a token bucket of states per second per caller.

Every state a request holds costs one token, whether anyone asked it before or not: an
answer is a pure function of the release and the state (docs/privacy.md section 10), so the
server has nothing to learn from novelty and nothing public may depend on it (a quota that
counted only new states would tell a caller whether a state was asked before). A request
whose states exceed the tokens left is refused whole, takes no tokens, and carries the exact
wait after which it fits (``retry_after``); a request larger than the whole bucket can never
fit and says so.

A caller is its token name, or its peer host without tokens (not the connection, so
reconnecting does not refill the bucket).
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
    "DEFAULT_STATE_RATE",
    "QuotaConfig",
    "Quotas",
    "caller_host",
]

#: states per second per caller: above what one client asking one state per call can send
#: (about 300/s for CartPole on the reference machine), below what a flood of batches can
DEFAULT_STATE_RATE = 1000.0
#: the bucket holds this many seconds of the rate by default: 100 000 states at the default
#: rate, a whole 100-episode evaluation of CartPole (<= 50 000 states) or LunarLander
#: (<= 100 000 states) at full speed
DEFAULT_BURST_SECONDS = 100.0
#: callers whose buckets are full are forgotten once more than this many are tracked
MAX_TRACKED_CALLERS = 10_000
#: a retry waits this much longer than the exact refill time (clock granularity)
RETRY_MARGIN_S = 0.002


@dataclass(frozen=True, slots=True)
class QuotaConfig:
    state_rate: float = DEFAULT_STATE_RATE
    state_burst: float | None = None  # None: DEFAULT_BURST_SECONDS x the rate

    def __post_init__(self) -> None:
        rate, burst = self.state_rate, self.state_burst
        if not (math.isfinite(rate) and rate > 0):
            raise InvalidArgument(f"state rate {rate!r} must be > 0 per second")
        if burst is not None and not (math.isfinite(burst) and burst >= 1):
            raise InvalidArgument(f"state burst {burst!r} must be >= 1")

    @property
    def burst(self) -> float:
        """The bucket's size."""
        if self.state_burst is not None:
            return float(self.state_burst)
        return max(1.0, DEFAULT_BURST_SECONDS * self.state_rate)


class Quotas:
    """Thread-safe admission of requests by their states (see the module docstring)."""

    def __init__(self, config: QuotaConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()
        # caller -> (tokens, at)
        self._buckets: dict[str, tuple[float, float]] = {}
        self.refused: dict[str, int] = {"state_rate": 0}

    def _tokens(self, caller: str, now: float) -> float:
        cfg = self.config
        tokens, at = self._buckets.get(caller, (cfg.burst, now))
        return min(cfg.burst, tokens + (now - at) * cfg.state_rate)

    def admit(self, caller: str, states: int) -> None:
        """Take ``states`` tokens from ``caller``'s bucket, or raise ResourceExhausted (with
        ``retry_after``) and take none."""
        if states <= 0:
            return
        cfg = self.config
        with self._lock:
            now = self._clock()
            tokens = self._tokens(caller, now)
            if states > tokens:
                self.refused["state_rate"] += 1
                head = (
                    f"this request holds {states} states, over this caller's budget of "
                    f"{cfg.state_rate:g} states/s (--state-rate)"
                )
                if states > cfg.burst:
                    raise ResourceExhausted(
                        f"{head}: more than the bucket of {cfg.burst:g}: split the request",
                        retry_after=math.inf,
                    )
                wait = (states - tokens) / cfg.state_rate
                raise ResourceExhausted(
                    f"{head}: {tokens:.0f} left; retry in {wait:.2f} s",
                    retry_after=wait + RETRY_MARGIN_S,
                )
            self._buckets[caller] = (tokens - states, now)
            if len(self._buckets) > MAX_TRACKED_CALLERS:
                self._forget_full(now)

    def _forget_full(self, now: float) -> None:
        burst = self.config.burst
        for key in [k for k in self._buckets if self._tokens(k, now) >= burst]:
            del self._buckets[key]


def caller_host(peer: str) -> str:
    """The host part of a gRPC peer string ("ipv4:1.2.3.4:5678" -> "ipv4:1.2.3.4",
    "ipv6:[::1]:5678" -> "ipv6:[::1]"): one bucket per host, not per connection."""
    kind, sep, rest = peer.partition(":")
    if not sep or kind not in ("ipv4", "ipv6"):
        return peer
    host, colon, port = rest.rpartition(":")
    return f"{kind}:{host}" if colon and port.isdigit() else peer
