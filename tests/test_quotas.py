"""Issue 14 item 4: bounded storage, against real `qveil serve` processes and SQLite stores.

* ``--max-stored-points N``: past the cap a request with a new point gets RESOURCE_EXHAUSTED
  and stores nothing, while stored points are still answered (same values as before);
* ``--new-point-rate R --new-point-burst B``: a token bucket of new points per caller (token
  name; peer host without tokens, so a new connection does not refill it); a request whose
  new points exceed the tokens left is refused whole, and nothing is stored;
* both limits are on the Prometheus endpoint.

Rates are chosen so that refills cannot matter within a test (1 point/s against refusals
of 3+ points right after a request that emptied the bucket): the tests are deterministic
unless the machine stalls for seconds. They were run 20 times in a loop before committing.
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from server_helpers import make_bundle, make_tokens, start_server

from qveil.client.sync import AuditClient, ValueClient
from qveil.errors import ResourceExhausted
from qveil.server.auth import add_token
from qveil.server.quotas import QuotaConfig, Quotas, caller_host

ACTIONS = 3  # make_bundle's default: each new state is 3 new points


def _stored(target: str, token: str) -> dict[int, dict[float, float]]:
    with AuditClient(target, token=token) as a:
        return {act: {p.x: p.g for p in a.noise_points(act)} for act in range(ACTIONS)}


def test_cap_refuses_new_points_and_still_answers_stored_ones(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b")
    tokens = make_tokens(tmp_path / "tokens.toml")
    srv = start_server(
        tmp_path,
        bundle,
        "--tokens-file",
        str(tokens.path),
        "--max-stored-points",
        "10",
        "--metrics-port",
        "0",
        store=f"sqlite:///{tmp_path / 'store.sqlite'}",
    )
    try:
        with ValueClient(srv.target, token=tokens.query) as c:
            first = c.values([0.1, 0.2, 0.3])  # 9 points
            before = _stored(srv.target, tokens.auditor)
            assert sum(len(v) for v in before.values()) == 9
            for states, actions in (([0.4], None), ([0.1, 0.5], None), ([0.4, 0.6], [0])):
                with pytest.raises(ResourceExhausted, match="max-stored-points"):
                    c.values(states, actions)
            assert _stored(srv.target, tokens.auditor) == before  # nothing stored
            again = c.values([0.3, 0.2, 0.1])  # stored points: still answered, unchanged
            np.testing.assert_array_equal(again[::-1], first)
            np.testing.assert_array_equal(c.best_actions([0.2]), [np.argmax(first[1])])
            c.values([0.4], [0])  # one new point: 10 <= 10
            with pytest.raises(ResourceExhausted):
                c.values([0.4], [1])
        m = re.search(r"metrics on (http://\S+)", srv.output())
        assert m, srv.output()
        text = urllib.request.urlopen(m.group(1), timeout=10).read().decode()
        assert "qveil_max_stored_points 10.0" in text
        assert "qveil_new_point_rate 2000.0" in text
        assert 'qveil_quota_refusals_total{limit="stored_points"} 4.0' in text
    finally:
        assert srv.terminate() == 0


def test_new_point_rate_per_token_refuses_whole_requests(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b")
    tokens = make_tokens(tmp_path / "tokens.toml")
    other = add_token(tokens.path, "query", "other-client")
    srv = start_server(
        tmp_path,
        bundle,
        "--tokens-file",
        str(tokens.path),
        "--new-point-rate",
        "1",
        "--new-point-burst",
        "30",
        store=f"sqlite:///{tmp_path / 'store.sqlite'}",
    )
    try:
        with ValueClient(srv.target, token=tokens.query) as c:
            with pytest.raises(ResourceExhausted, match="split the request"):
                c.values(np.linspace(0, 1, 11))  # 33 points > bucket of 30
            assert sum(map(len, _stored(srv.target, tokens.auditor).values())) == 0
            grid = np.linspace(0, 1, 10)
            c.values(grid)  # 30 points: the whole bucket
            before = _stored(srv.target, tokens.auditor)
            # a request mixing stored and new states is refused whole
            with pytest.raises(ResourceExhausted, match="new-point-rate"):
                c.values([grid[0], 0.55])
            with pytest.raises(ResourceExhausted, match="nothing was stored"):
                c.best_actions([0.65])
            assert _stored(srv.target, tokens.auditor) == before
            c.values(grid[::-1])  # stored states need no budget
        with ValueClient(srv.target, token=other) as c2:  # another token: its own bucket
            c2.values([0.55, 0.65])
    finally:
        assert srv.terminate() == 0


def test_anonymous_callers_are_budgeted_by_host_not_connection(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b")
    srv = start_server(tmp_path, bundle, "--new-point-rate", "1", "--new-point-burst", "6")
    try:
        with ValueClient(srv.target) as c:
            c.values([0.1, 0.2])  # 6 points: the bucket
        with ValueClient(srv.target) as c, pytest.raises(ResourceExhausted):
            c.values([0.3])  # a new connection from the same host: same bucket
    finally:
        assert srv.terminate() == 0


def test_paced_client_waits_out_the_new_point_rate(tmp_path: Path) -> None:
    """``best_actions_paced`` (the served evaluations' client): a call over the caller's
    budget is refused whole with a RetryInfo delay; the client waits that long and asks
    again, so an evaluation finishes under the quota instead of failing, and every state's
    noise is stored once. A client that did not wait would raise ResourceExhausted here."""
    from qveil.trainer.served_eval import best_actions_paced

    bundle = make_bundle(tmp_path / "b")
    srv = start_server(
        tmp_path,
        bundle,
        "--new-point-rate",
        "12",  # a refill takes 1 s: the plain calls below are refused unless the machine
        "--new-point-burst",  # stalls for a second between two calls
        "12",
        store=f"sqlite:///{tmp_path / 'store.sqlite'}",
    )
    try:
        with ValueClient(srv.target) as c:
            states = np.linspace(0.05, 0.95, 20).reshape(5, 4)  # 5 calls x 12 new points
            with pytest.raises(ResourceExhausted):  # the plain call outruns the bucket
                for row in states:
                    c.best_actions(row)
        with ValueClient(srv.target) as c:
            got = [best_actions_paced(c, row) for row in states]
            assert [len(g) for g in got] == [4] * 5
            vals = c.values(states.reshape(-1))
            np.testing.assert_array_equal(np.concatenate(got), np.argmax(vals, axis=1))
    finally:
        assert srv.terminate() == 0
    import sqlite3

    con = sqlite3.connect(tmp_path / "store.sqlite")
    try:
        n, distinct = con.execute(
            "SELECT count(*), count(DISTINCT action || ':' || x) FROM noise_points"
        ).fetchone()
    finally:
        con.close()
    assert n == distinct == 20 * ACTIONS  # each state's noise stored once, per action


def test_quotas_unit() -> None:
    now = [0.0]
    q = Quotas(
        QuotaConfig(max_stored_points=100, new_point_rate=10, new_point_burst=20),
        clock=lambda: now[0],
    )
    t0 = q.admit("a", "r", 20, stored=0)
    with pytest.raises(ResourceExhausted):
        q.admit("a", "r", 1, stored=20)
    now[0] = 0.5  # 5 tokens back
    t1 = q.admit("a", "r", 5, stored=20)
    t2 = q.admit("b", "r", 20, stored=25)  # another caller
    # pending (reserved, not committed) points count against the cap
    with pytest.raises(ResourceExhausted, match="cap is 100"):
        q.admit("c", "r", 20, stored=60)  # 60 + 45 pending + 20 > 100
    for t in (t0, t1, t2):
        q.done("r", t)
    q.admit("c", "r", 20, stored=60)
    assert q.refused == {"stored_points": 1, "new_point_rate": 1}
    assert caller_host("ipv4:127.0.0.1:5555") == "ipv4:127.0.0.1"


def test_a_committed_reservation_is_not_counted_twice() -> None:
    """Between a request's commit and its done(), its points are in the store's count; the
    reservation then counts only its points still not stored, so a request that fits under
    the cap is admitted (before the fix it was refused: 30 + 30 pending + 40 > 90)."""
    q = Quotas(QuotaConfig(max_stored_points=90, new_point_rate=1e6))
    stored = [0]
    left = [30]
    t = q.admit("a", "r", 30, lambda: stored[0], still_new=lambda: left[0])
    stored[0], left[0] = 30, 0  # committed, done() not called yet
    q.admit("b", "r", 60, lambda: stored[0])  # 30 + 0 + 60 <= 90
    with pytest.raises(ResourceExhausted):
        q.admit("c", "r", 1, lambda: stored[0])  # 30 + 60 pending + 1 > 90
    q.done("r", t)
    assert caller_host("ipv6:[::1]:5555") == "ipv6:[::1]"
    assert caller_host("unix:/tmp/s") == "unix:/tmp/s"


def test_cap_is_exact_under_concurrent_new_points(tmp_path: Path) -> None:
    """8 threads race 40 one-state requests (3 new points each) against a cap of 60: points
    reserved by requests still sampling count against the cap, so exactly 20 requests store
    their points and 20 are refused. A check against the committed count alone would let
    concurrent requests overshoot (up to 8 x 3 points)."""
    import threading

    bundle = make_bundle(tmp_path / "b")
    tokens = make_tokens(tmp_path / "tokens.toml")
    srv = start_server(
        tmp_path,
        bundle,
        "--tokens-file",
        str(tokens.path),
        "--max-stored-points",
        "60",
        store=f"sqlite:///{tmp_path / 'store.sqlite'}",
    )
    ok: list[float] = []
    refused: list[float] = []
    lock = threading.Lock()
    states = iter(np.linspace(-1.0, 2.0, 40).tolist())
    go = threading.Barrier(8)

    def worker() -> None:
        with ValueClient(srv.target, token=tokens.query) as c:
            go.wait()
            while True:
                with lock:
                    x = next(states, None)
                if x is None:
                    return
                try:
                    c.values([x])
                    with lock:
                        ok.append(x)
                except ResourceExhausted:
                    with lock:
                        refused.append(x)

    try:
        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        stored = _stored(srv.target, tokens.auditor)
        assert sum(map(len, stored.values())) == 60
        assert len(ok) == 20 and len(refused) == 20
    finally:
        assert srv.terminate() == 0
