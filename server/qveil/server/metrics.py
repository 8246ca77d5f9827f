"""Counters of one server process (always on; GetStats reports them) and an optional
Prometheus endpoint (``qveil serve --metrics-port N``; prometheus-client, server extra).

Prometheus series: ``qveil_requests_total{method,code}``, ``qveil_request_seconds{method}``
(histogram), ``qveil_states_answered_total``, ``qveil_new_points_total``,
``qveil_stored_points{release,action}`` (read from the store at scrape time) and
``qveil_in_flight``; the storage limits (``qveil.server.quotas``): ``qveil_max_stored_points``,
``qveil_new_state_rate`` (new states per second per caller), ``qveil_new_state_burst``, the
deprecated point bucket's ``qveil_new_point_rate`` and ``qveil_new_point_burst`` (only when
set) and ``qveil_quota_refusals_total{limit}`` (limit = stored_points | new_state_rate |
new_point_rate); the data plane's batches (``qveil.server.protocol.batching``):
``qveil_batches_total`` and ``qveil_batched_calls_total`` (their ratio is the mean calls
answered by one batch, one store transaction at most). No label ever carries a state, a
value or a token.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

__all__ = ["Metrics"]


class Metrics:
    def __init__(self) -> None:
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.states_answered = 0
        self.new_points = 0
        self.in_flight = 0
        self.quotas: Any = None  # qveil.server.quotas.Quotas, set by the handlers
        #: the data plane's Batcher (its ``batches`` and ``items``), set by the data plane
        self.batcher: Any = None
        self._prom: dict[str, Any] | None = None
        #: the Prometheus series of each (method, code): labels() looked up once, not per call
        self._series: dict[tuple[str, str], tuple[Any, Any]] = {}

    # -- recording (called by the data plane) -------------------------------------------
    def observe(self, method: str, code: str, seconds: float) -> None:
        with self._lock:
            self.requests[code] += 1
        if self._prom is not None:
            series = self._series.get((method, code))
            if series is None:
                series = (
                    self._prom["requests"].labels(method=method, code=code),
                    self._prom["latency"].labels(method=method),
                )
                self._series[method, code] = series
            series[0].inc()
            series[1].observe(seconds)

    def answered(self, states: int, points_drawn: int) -> None:
        """Count ``states`` answered; ``points_drawn`` is the store's running total of new
        points it committed (monotone), so concurrent calls never count one point twice."""
        with self._lock:
            self.states_answered += states
            new = max(0, points_drawn - self.new_points)
            self.new_points += new
        if self._prom is not None:
            self._prom["states"].inc(states)
            if new:
                self._prom["new"].inc(new)

    def uptime(self) -> float:
        return time.monotonic() - self.started

    # -- Prometheus ----------------------------------------------------------------------
    def serve_prometheus(
        self,
        port: int,
        *,
        host: str = "127.0.0.1",
        stored_points: Callable[[], dict[tuple[str, int], int]] | None = None,
    ) -> int:
        """Start the Prometheus HTTP endpoint on host:port (0 = any free port); return it."""
        from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server
        from prometheus_client import Counter as PCounter

        reg = CollectorRegistry()
        self._prom = {
            "requests": PCounter(
                "qveil_requests", "RPCs by method and status code", ["method", "code"], registry=reg
            ),
            "latency": Histogram(
                "qveil_request_seconds",
                "RPC latency",
                ["method"],
                buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5),
                registry=reg,
            ),
            "states": PCounter("qveil_states_answered", "states answered", registry=reg),
            "new": PCounter("qveil_new_points", "new noise points drawn and stored", registry=reg),
        }
        g = Gauge("qveil_in_flight", "RPCs in flight", registry=reg)
        g.set_function(lambda: self.in_flight)

        reg.register(_StoredPoints(stored_points))
        reg.register(_Limits(self))
        reg.register(_Batches(self))
        server, _thread = start_http_server(port, addr=host, registry=reg)
        return int(server.server_port)


class _StoredPoints:
    """Collects qveil_stored_points from ``stored_points()`` at each scrape."""

    def __init__(self, stored_points: Callable[[], dict[tuple[str, int], int]] | None) -> None:
        self.stored_points = stored_points

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        fam = GaugeMetricFamily(
            "qveil_stored_points", "stored noise points", labels=["release", "action"]
        )
        if self.stored_points is not None:
            try:
                for (rel, action), n in self.stored_points().items():
                    fam.add_metric([rel, str(action)], n)
            except Exception:  # noqa: BLE001 - a scrape must not fail on the store
                pass
        yield fam


class _Limits:
    """Collects the storage limits and the quota refusals of ``metrics.quotas`` at each
    scrape."""

    def __init__(self, metrics: Any) -> None:
        self.metrics = metrics

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        q = self.metrics.quotas
        if q is None:
            return
        cfg = q.config
        for name, doc, value in (
            (
                "qveil_max_stored_points",
                "cap on stored points per release (all "
                "actions); past it new points get RESOURCE_EXHAUSTED",
                cfg.max_stored_points,
            ),
            (
                "qveil_new_state_rate",
                "new states per second per caller (token bucket)",
                cfg.new_state_rate,
            ),
            (
                "qveil_new_state_burst",
                "token bucket size: new states one caller may send at once",
                cfg.burst,
            ),
            (
                "qveil_new_point_rate",
                "deprecated point bucket: new points per second per caller",
                cfg.new_point_rate,
            ),
            (
                "qveil_new_point_burst",
                "deprecated point bucket: new points one caller may store at once",
                cfg.point_burst,
            ),
        ):
            if value is not None:
                yield GaugeMetricFamily(name, doc, value=float(value))
        fam = CounterMetricFamily(
            "qveil_quota_refusals", "requests refused by a storage limit", labels=["limit"]
        )
        for limit, n in sorted(q.refused.items()):
            fam.add_metric([limit], n)
        yield fam


class _Batches:
    """Collects the data plane's batch counters (``metrics.batcher``) at each scrape."""

    def __init__(self, metrics: Any) -> None:
        self.metrics = metrics

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        b = self.metrics.batcher
        if b is None:
            return
        yield CounterMetricFamily(
            "qveil_batches",
            "batches of calls answered together (one store transaction at most each)",
            value=b.batches,
        )
        yield CounterMetricFamily("qveil_batched_calls", "calls answered in a batch", value=b.items)
