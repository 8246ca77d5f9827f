"""The counters of one server process and its Prometheus endpoint
(qveil.server.serving.metrics), scraped over HTTP on port 0: the calls, states, in-flight
gauge, stored points (a failing store never fails a scrape), the limits and the answer log
(the full list against docs and a real server: tests/integration/test_metrics.py)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from qveil.server.serving.answer_log import AnswerLog
from qveil.server.serving.metrics import Metrics
from qveil.server.serving.quotas import QuotaConfig, Quotas
from qveil.server.store import open_store
from qveil.version import __version__


def _value(text: str, series: str) -> float:
    m = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    assert m, f"{series} not in scrape:\n{text}"
    return float(m.group(1))


def test_counters_without_prometheus() -> None:
    m = Metrics()
    m.observe("GetValues", "OK", 0.01)
    m.observe("GetValues", "OK", 0.02, protocol="rest")
    m.observe("GetValues", "INVALID_ARGUMENT", 0.0)
    m.answered(5)
    m.answered(7)
    assert dict(m.requests) == {"OK": 2, "INVALID_ARGUMENT": 1}
    assert m.states_answered == 12
    t0 = m.uptime()
    assert t0 >= 0 and m.uptime() >= t0


def test_the_endpoint_exports_what_was_recorded(tmp_path: Path) -> None:
    m = Metrics()
    m.quotas = Quotas(QuotaConfig(state_rate=4.0, state_burst=8.0))
    m.quotas.refused["state_rate"] = 3
    calls = []

    def stored() -> dict[tuple[str, int], int]:
        calls.append(1)
        return {("rel-1", 0): 11, ("rel-1", 2): 5}

    with open_store(f"sqlite:///{tmp_path / 's.sqlite'}") as st:
        log = AnswerLog(st, max_points=99)
        m.answer_log = log
        port = m.serve_prometheus(0, stored_points=stored)
        assert port > 0
        m.observe("GetValues", "OK", 0.003)
        m.observe("GetValues", "OK", 0.004)
        m.observe("ModelInfer", "INVALID_ARGUMENT", 0.2, protocol="rest")
        m.answered(6)
        m.in_flight = 2
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        log.close(10)
    assert calls, "stored points are read at scrape time"
    lbl = 'code="OK",method="GetValues",protocol="grpc"'
    assert _value(text, f"qveil_requests_total{{{lbl}}}") == 2
    bad = 'code="INVALID_ARGUMENT",method="ModelInfer",protocol="rest"'
    assert _value(text, f"qveil_requests_total{{{bad}}}") == 1
    assert (
        _value(text, 'qveil_request_duration_seconds_count{method="GetValues",protocol="grpc"}')
        == 2
    )
    assert _value(text, "qveil_states_answered_total") == 6
    assert _value(text, "qveil_in_flight") == 2
    assert _value(text, f'qveil_build_info{{version="{__version__}"}}') == 1
    assert _value(text, 'qveil_stored_points{action="0",release="rel-1"}') == 11
    assert _value(text, 'qveil_stored_points{action="2",release="rel-1"}') == 5
    assert _value(text, "qveil_state_rate") == 4.0 and _value(text, "qveil_state_burst") == 8.0
    assert _value(text, 'qveil_quota_refusals_total{limit="state_rate"}') == 3
    assert _value(text, "qveil_max_stored_points") == 99
    for s in ("qveil_logged_points_total", "qveil_log_unlogged_points_total"):
        assert _value(text, s) == 0
    assert _value(text, "qveil_log_mismatched_total") == 0 and _value(text, "qveil_log_queued") == 0
    assert "_created" not in text  # no start-time series beside the counters


def test_a_failing_store_and_missing_parts_leave_the_scrape_whole() -> None:
    m = Metrics()

    def broken() -> dict[tuple[str, int], int]:
        raise RuntimeError("the store is down")

    port = m.serve_prometheus(0, stored_points=broken)
    r = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert r.status_code == 200
    assert "# TYPE qveil_stored_points gauge" in r.text
    assert "qveil_stored_points{" not in r.text  # no series, no error
    # no quotas and no answer log set: their series are absent, not zero
    for absent in ("qveil_state_rate", "qveil_max_stored_points", "qveil_logged_points"):
        assert absent not in r.text
