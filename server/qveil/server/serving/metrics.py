"""Counters of one server process (always on; GetStats reports them) and an optional
Prometheus endpoint (``qveil serve --metrics-port N``; prometheus-client, server extra).
docs/operations.md, "Metrics", lists every series with its labels (a test scrapes a real
server and compares), and deploy/grafana/qveil-dashboard.json queries them.

Prometheus series (Prometheus' naming rules): ``qveil_requests_total{method,code,protocol}``,
``qveil_request_duration_seconds{method,protocol}`` (histogram; protocol ``grpc`` or
``rest``), ``qveil_build_info{version}``, the process collector's ``process_*`` and
``python_info``, ``qveil_states_answered_total``, ``qveil_stored_points{release,action}`` (read
from the store at scrape time) and ``qveil_in_flight``; the answer log
(``qveil.server.serving.answer_log``): ``qveil_logged_points_total``,
``qveil_log_unlogged_points_total`` (past ``--max-stored-points``, or dropped while the store
was down), ``qveil_log_mismatched_total`` and ``qveil_log_queued``; the limits:
``qveil_max_stored_points``, ``qveil_state_rate`` (states per second per caller),
``qveil_state_burst`` and ``qveil_quota_refusals_total{limit}`` (limit = state_rate). No
label ever carries a state, a value or a token.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qveil.version import __version__

if TYPE_CHECKING:  # for annotations only: prometheus_client loads with the metrics endpoint
    from prometheus_client import Counter as PCounter
    from prometheus_client import Histogram
    from prometheus_client.metrics_core import Metric

    from qveil.server.serving.answer_log import AnswerLog
    from qveil.server.serving.quotas import Quotas

__all__ = ["Metrics"]


class Metrics:
    def __init__(self) -> None:
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.states_answered = 0
        self.in_flight = 0
        #: the callers' quotas, set by the handlers
        self.quotas: Quotas | None = None
        #: the server's answer log, set when it starts
        self.answer_log: AnswerLog | None = None
        self._prom: _Prom | None = None
        #: the Prometheus series of each (method, code, protocol): labels() looked up once
        self._series: dict[tuple[str, str, str], tuple[PCounter, Histogram]] = {}

    # -- recording (called by the data plane) -------------------------------------------
    def observe(self, method: str, code: str, seconds: float, protocol: str = "grpc") -> None:
        with self._lock:
            self.requests[code] += 1
        if self._prom is not None:
            series = self._series.get((method, code, protocol))
            if series is None:
                series = (
                    self._prom.requests.labels(method=method, code=code, protocol=protocol),
                    self._prom.latency.labels(method=method, protocol=protocol),
                )
                self._series[method, code, protocol] = series
            series[0].inc()
            series[1].observe(seconds)

    def answered(self, states: int) -> None:
        """Count ``states`` answered (states x actions)."""
        with self._lock:
            self.states_answered += states
        if self._prom is not None:
            self._prom.states.inc(states)

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
        # prometheus_client loads with the metrics endpoint (--metrics-port), not with this module
        from prometheus_client import (
            CollectorRegistry,
            Gauge,
            Histogram,
            PlatformCollector,
            ProcessCollector,
            disable_created_metrics,
            start_http_server,
        )
        from prometheus_client import Counter as PCounter

        # no *_created series beside each counter and histogram (their start times): the
        # series are the ones docs/operations.md lists
        disable_created_metrics()  # type: ignore[no-untyped-call]
        reg = CollectorRegistry()
        ProcessCollector(registry=reg)  # process_cpu_seconds_total, process_resident_memory...
        PlatformCollector(registry=reg)  # python_info
        build = Gauge("qveil_build_info", "the serving qveil's version", ["version"], registry=reg)
        build.labels(version=__version__).set(1)
        self._prom = _Prom(
            requests=PCounter(
                "qveil_requests",
                "calls by method, status code and protocol (grpc or rest)",
                ["method", "code", "protocol"],
                registry=reg,
            ),
            latency=Histogram(
                "qveil_request_duration_seconds",
                "call latency by method and protocol",
                ["method", "protocol"],
                buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5),
                registry=reg,
            ),
            states=PCounter("qveil_states_answered", "states answered", registry=reg),
        )
        g = Gauge("qveil_in_flight", "RPCs in flight", registry=reg)
        g.set_function(lambda: self.in_flight)

        reg.register(_StoredPoints(stored_points))
        reg.register(_Limits(self))
        reg.register(_Log(self))
        server, _thread = start_http_server(port, addr=host, registry=reg)
        return int(server.server_port)


@dataclass(frozen=True)
class _Prom:
    """The Prometheus series the data plane updates."""

    requests: PCounter
    latency: Histogram
    states: PCounter


class _StoredPoints:
    """Collects qveil_stored_points from ``stored_points()`` at each scrape."""

    def __init__(self, stored_points: Callable[[], dict[tuple[str, int], int]] | None) -> None:
        self.stored_points = stored_points

    def collect(self) -> Iterator[Metric]:
        # prometheus_client loads with the metrics endpoint (--metrics-port), not with this module
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
    """Collects the limits and the quota refusals of ``metrics.quotas`` at each scrape."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        # prometheus_client loads with the metrics endpoint (--metrics-port), not with this module
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        q = self.metrics.quotas
        if q is None:
            return
        cfg = q.config
        yield GaugeMetricFamily(
            "qveil_state_rate", "states per second per caller (token bucket)", cfg.state_rate
        )
        yield GaugeMetricFamily(
            "qveil_state_burst", "token bucket size: states one caller may send at once", cfg.burst
        )
        fam = CounterMetricFamily(
            "qveil_quota_refusals", "requests refused by a quota", labels=["limit"]
        )
        for limit, n in sorted(q.refused.items()):
            fam.add_metric([limit], n)
        yield fam


class _Log:
    """Collects the answer log's counters (``metrics.answer_log``) at each scrape."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        # prometheus_client loads with the metrics endpoint (--metrics-port), not with this module
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        a = self.metrics.answer_log
        if a is None:
            return
        yield GaugeMetricFamily(
            "qveil_max_stored_points",
            "cap of the answer log per release (past it answers go on, unlogged)",
            a.max_points,
        )
        yield CounterMetricFamily(
            "qveil_logged_points", "answered points written to the store", value=a.logged
        )
        yield CounterMetricFamily(
            "qveil_log_unlogged_points",
            "answered points not logged (past the cap, or dropped while the store was down)",
            value=a.unlogged,
        )
        yield CounterMetricFamily(
            "qveil_log_mismatched",
            "logged values that differ from the values answered (run qveil audit)",
            value=a.mismatched,
        )
        yield GaugeMetricFamily("qveil_log_queued", "calls waiting for the log", a.queued)
