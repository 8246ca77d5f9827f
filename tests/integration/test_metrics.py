"""The Prometheus series of a real `qveil serve` (qveil.server.serving.metrics) against what names
them: docs/operations.md's "Metrics" section (every series with its type and labels, both
ways) and the Grafana dashboard deploy/grafana/qveil-dashboard.json (every series its queries
use is exported, with the labels they group by). The server is driven first so that every
series has samples: gRPC and REST calls, a logged point, a quota refusal."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from reliability_helpers import free_port
from server_helpers import make_bundle, registry_home, start_server

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "qveil-dashboard.json"
OPERATIONS = ROOT / "docs" / "operations.md"
HIST_SUFFIXES = ("_bucket", "_sum", "_count")


@dataclass(frozen=True)
class Series:
    kind: str  # counter, gauge, histogram, ...
    labels: frozenset[str]  # without a histogram's `le`


@dataclass(frozen=True)
class Scrape:
    text: str
    series: dict[str, Series]  # by the name PromQL uses (counters with _total)

    def names(self) -> set[str]:
        """Every name a query may use: the series and a histogram's _bucket/_sum/_count."""
        out = set(self.series)
        for name, s in self.series.items():
            if s.kind == "histogram":
                out |= {name + suffix for suffix in HIST_SUFFIXES}
        return out

    def base(self, name: str) -> str:
        """The series a name belongs to (a histogram's _bucket -> the histogram)."""
        for suffix in HIST_SUFFIXES:
            stem = name.removesuffix(suffix)
            if stem != name and self.series.get(stem, Series("", frozenset())).kind == "histogram":
                return stem
        return name


def parse_scrape(text: str) -> Scrape:
    from prometheus_client.parser import text_string_to_metric_families

    series: dict[str, Series] = {}
    for fam in text_string_to_metric_families(text):
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        labels = frozenset(k for s in fam.samples for k in s.labels if k != "le")
        series[name] = Series(fam.type, labels)
    return Scrape(text, series)


@pytest.fixture(scope="module")
def scrape(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scrape]:
    from qveil.v1 import value_service_pb2 as vpb
    from qveil.v1 import value_service_pb2_grpc as vgrpc

    tmp = tmp_path_factory.mktemp("metrics")
    home = tmp / "qveil-home"
    with registry_home(home):
        bundle = make_bundle(tmp / "bundle", seed=3)
    http_port = free_port()
    sp = start_server(
        tmp, bundle, "--metrics-port", "0", "--http-port", str(http_port),
        "--state-rate", "1", "--state-burst", "10",
        store=f"sqlite:///{tmp / 'store.sqlite'}", home=home,
    )  # fmt: skip
    try:
        m = re.search(r"metrics on (http://\S+)", sp.output())
        assert m, sp.output()
        url = m.group(1)
        with grpc.insecure_channel(sp.target) as ch:
            stub = vgrpc.ValueServiceStub(ch)
            stub.GetValues(vpb.GetValuesRequest(states=[0.25, 0.5]), timeout=20)
            with pytest.raises(grpc.RpcError) as exc:  # 11 states > the burst of 10
                stub.GetValues(vpb.GetValuesRequest(states=[0.1] * 11), timeout=20)
            assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        r = httpx.post(
            f"http://127.0.0.1:{http_port}/v2/models/qveil/infer",
            json={"inputs": [{"name": "STATE", "datatype": "FP64", "shape": [1, 1],
                              "data": [0.75]}]},
            timeout=20,
        )  # fmt: skip
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 30
        while True:  # the answer log writes in its own thread: wait for the stored points
            text = urllib.request.urlopen(url, timeout=10).read().decode()
            if re.search(r"^qveil_stored_points\{", text, re.M) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        yield parse_scrape(text)
    finally:
        assert sp.terminate() == 0, sp.output()


def test_the_server_exports_what_the_run_drove(scrape: Scrape) -> None:
    protocols = set(re.findall(r'^qveil_requests_total\{[^}]*protocol="(\w+)"', scrape.text, re.M))
    assert protocols == {"grpc", "rest"}
    assert re.search(r'^qveil_quota_refusals_total\{limit="state_rate"\} 1\.0$', scrape.text, re.M)
    assert re.search(r"^qveil_stored_points\{", scrape.text, re.M), scrape.text
    assert not [n for n in scrape.series if n.endswith("_created")], "no *_created series"


# ------------------------------------------------------------------ docs/operations.md ----


def metrics_section() -> str:
    text = OPERATIONS.read_text()
    start = text.index("\n## Metrics\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_the_docs_list_every_qveil_series_with_its_labels_and_no_other(scrape: Scrape) -> None:
    section = metrics_section()
    rows = re.findall(r"^\| `(qveil_\w+)` \| (\w+) \|([^|]*)\|", section, re.M)
    documented = {
        name: Series(kind, frozenset(re.findall(r"`(\w+)`", labels))) for name, kind, labels in rows
    }
    exported = {n: s for n, s in scrape.series.items() if n.startswith("qveil_")}
    assert set(documented) == set(exported), (
        f"exported, not in the table: {sorted(set(exported) - set(documented))}; "
        f"in the table, not exported: {sorted(set(documented) - set(exported))}"
    )
    for name, doc in documented.items():
        assert doc == exported[name], f"{name}: docs say {doc}, the server exports {exported[name]}"
    # every name the section mentions anywhere (prose, queries) is exported
    mentioned = set(re.findall(r"\b(qveil_\w+|process_\w+|python_info)\b", section))
    unknown = {n for n in mentioned if scrape.base(n) not in scrape.series}
    assert not unknown, f"docs/operations.md names series the server does not export: {unknown}"
    assert {"process_resident_memory_bytes", "process_cpu_seconds_total", "python_info"} <= (
        mentioned
    )
    assert "qveil_request_duration_seconds" in documented
    assert documented["qveil_requests_total"].labels == {"method", "code", "protocol"}
    assert documented["qveil_build_info"].labels == {"version"}


# ------------------------------------------------------------------ Grafana dashboard -----

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
                "or", "unless", "offset", "inf", "nan"}  # fmt: skip
GROUPING = r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)"


def promql_series(expr: str) -> set[str]:
    """The series names a PromQL expression selects (not functions, keywords, labels)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)  # range and subquery selectors
    e = re.sub(GROUPING, " ", e)  # grouping clauses: `sum by (x) (...)` is sum(...)
    out = set()
    for m in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", e):
        if e[m.end() :].lstrip().startswith("(") or m.group(0).lower() in PROMQL_WORDS:
            continue
        out.add(m.group(0))
    return out


def promql_grouping_labels(expr: str) -> set[str]:
    return {
        label.strip()
        for _, labels in re.findall(GROUPING, expr)
        for label in labels.split(",")
        if label.strip()
    }


def dashboard_queries() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            exprs += re.findall(r"label_values\((\w+),", var["definition"])
    return exprs


def test_promql_series_extraction() -> None:
    q = 'histogram_quantile(0.99, sum by (le, method) (rate(a_bucket{x="y(z)"}[$__rate_interval])))'
    assert promql_series(q) == {"a_bucket"}
    assert promql_grouping_labels(q) == {"le", "method"}
    assert promql_series("max by (r) (b) / on() group_left max(c) > 1e3") == {"b", "c"}


def test_every_series_the_dashboard_queries_is_exported(scrape: Scrape) -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["title"] and doc["schemaVersion"] >= 36
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    queries = dashboard_queries()
    assert len(queries) >= 10
    used: set[str] = set()
    for q in queries:
        names = promql_series(q)
        assert names, f"no series in {q!r}"
        missing = names - scrape.names()
        assert not missing, f"the dashboard queries {missing}, which the server does not export"
        used |= names
        # a query groups only by labels its series carry (and Prometheus' own)
        labels = {"instance", "job"}
        for n in names:
            labels |= scrape.series[scrape.base(n)].labels
            labels |= {"le"} if n.endswith("_bucket") else set()
        assert promql_grouping_labels(q) <= labels, q
    # the dashboard shows every qveil series
    qveil = {n for n in scrape.series if n.startswith("qveil_")}
    assert qveil <= {scrape.base(n) for n in used}, qveil - {scrape.base(n) for n in used}
