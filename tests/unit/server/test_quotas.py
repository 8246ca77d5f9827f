"""Bounded storage, against real `qveil serve` processes and SQLite stores.

* ``--max-stored-points N``: past the cap a request with a new point gets RESOURCE_EXHAUSTED
  and stores nothing, while stored points are still answered (same values as before);
* ``--new-state-rate R --new-state-burst B``: a token bucket of new states per caller (token
  name; peer host without tokens, so a new connection does not refill it), whatever the
  release's actions and coordinates; a request whose new states exceed the tokens left is
  refused whole, and nothing is stored;
* the deprecated ``--new-point-rate``: a second bucket in stored points, beside the first;
* the limits are on the Prometheus endpoint.

Rates are chosen so that refills cannot matter within a test (0.001 state/s: a wait of
1000 s, longer than any call's deadline, so the server's pushback tells the SDK not to retry
and the refusal is immediate); the paced client's test over a channel without retries uses
4 states/s, deterministic unless the machine stalls for a second. The back-off of clients
told to wait is tested in tests/integration/test_quota_backoff.py.
"""

from __future__ import annotations

import math
import re
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from server_helpers import make_bundle, make_tokens, start_server

from qveil.client.sync import AuditClient, ValueClient
from qveil.errors import ResourceExhausted
from qveil.server.auth import add_token
from qveil.server.quotas import QuotaConfig, Quotas, caller_host

ACTIONS = 3  # make_bundle's default: each new state is 3 new points, and 1 new state


def _stored(target: str, token: str) -> dict[int, dict[float, float]]:
    with AuditClient(target, token=token) as a:
        return {act: {p.x: p.g for p in a.noise_points(act)} for act in range(ACTIONS)}


def _capped_server(tmp_path: Path, max_points: str, *extra: str) -> tuple[Any, Any]:
    """(tokens, server): a fresh bundle served on a SQLite store with a tokens file and at
    most ``max_points`` stored points, plus ``extra`` flags."""
    bundle = make_bundle(tmp_path / "b")
    tokens = make_tokens(tmp_path / "tokens.toml")
    srv = start_server(
        tmp_path,
        bundle,
        *("--tokens-file", str(tokens.path), "--max-stored-points", max_points, *extra),
        store=f"sqlite:///{tmp_path / 'store.sqlite'}",
    )
    return tokens, srv


def test_cap_refuses_new_points_and_still_answers_stored_ones(tmp_path: Path) -> None:
    tokens, srv = _capped_server(tmp_path, "10", "--metrics-port", "0")
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
        assert "qveil_new_state_rate 1000.0" in text
        assert "qveil_new_state_burst 100000.0" in text
        assert "qveil_new_point_rate" not in text  # the deprecated bucket is off
        assert 'qveil_quota_refusals_total{limit="stored_points"} 4.0' in text
    finally:
        assert srv.terminate() == 0


def test_new_state_rate_per_token_refuses_whole_requests(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b")
    tokens = make_tokens(tmp_path / "tokens.toml")
    other = add_token(tokens.path, "query", "other-client")
    srv = start_server(
        tmp_path,
        bundle,
        "--tokens-file",
        str(tokens.path),
        "--new-state-rate",
        "0.001",  # a wait of ~1000 s, past any deadline: refused at once, not retried
        "--new-state-burst",
        "10",
        store=f"sqlite:///{tmp_path / 'store.sqlite'}",
    )
    try:
        with ValueClient(srv.target, token=tokens.query) as c:
            with pytest.raises(ResourceExhausted, match="split the request"):
                c.values(np.linspace(0, 1, 11))  # 11 states > bucket of 10
            assert sum(map(len, _stored(srv.target, tokens.auditor).values())) == 0
            grid = np.linspace(0, 1, 10)
            c.values(grid)  # 10 states (30 points): the whole bucket
            before = _stored(srv.target, tokens.auditor)
            # a request mixing stored and new states is refused whole
            with pytest.raises(ResourceExhausted, match="new-state-rate"):
                c.values([grid[0], 0.55])
            with pytest.raises(ResourceExhausted, match="nothing was stored"):
                c.best_actions([0.65])
            assert _stored(srv.target, tokens.auditor) == before
            c.values(grid[::-1])  # stored states need no budget
        with ValueClient(srv.target, token=other) as c2:  # another token: its own bucket
            c2.values([0.55, 0.65])
    finally:
        assert srv.terminate() == 0


def test_a_state_costs_one_whatever_the_actions(tmp_path: Path) -> None:
    """The budget counts states, not stored points: with 3 actions and a bucket of 4 states,
    a state costs 1 whether it stores 1 point or 3; a stored state asked for an action it
    has no point of yet is a new state again; stored states cost nothing."""
    bundle = make_bundle(tmp_path / "b")
    srv = start_server(tmp_path, bundle, "--new-state-rate", "0.001", "--new-state-burst", "4")
    try:
        with ValueClient(srv.target) as c:
            c.values([0.1, 0.2], [0])  # 2 new states (2 points): 2 left
            with pytest.raises(ResourceExhausted, match="asks for 3 new states"):
                c.values([0.1, 0.2, 0.3], [1, 2])  # each has a new point: 3 > 2
            c.values([0.1, 0.2], [1, 2])  # 2 new states (4 points): 0 left
            c.values([0.2, 0.1])  # every point stored: no budget needed
            with pytest.raises(ResourceExhausted, match="asks for 1 new states"):
                c.values([0.3], [0])
    finally:
        assert srv.terminate() == 0


def test_a_state_of_d_coordinates_costs_one(tmp_path: Path) -> None:
    """A d = 4, 2-action release (CartPole): a new state stores up to 8 points and costs one
    state of the budget; a state whose every coordinate value is stored on every path (a
    recombination of stored states' coordinates) stores nothing and costs nothing."""
    from server_helpers import make_cartpole_kernel_bundle

    (tmp_path / "kb").mkdir()
    bundle, _ = make_cartpole_kernel_bundle(tmp_path / "kb", seed=2)
    srv = start_server(tmp_path, bundle, "--new-state-rate", "0.001", "--new-state-burst", "3")
    try:
        with ValueClient(srv.target) as c:
            a = np.array([[0.01, 0.1, 0.02, 0.3], [-0.02, -0.1, 0.03, -0.2], [0.0, 0.2, 0.0, 0.1]])
            c.best_actions(a)  # 3 new states, 24 points: the whole bucket
            mixed = np.array([[a[0, 0], a[1, 1], a[2, 2], a[0, 3]]])
            c.best_actions(mixed)  # no new point: answered with the bucket empty
            with pytest.raises(ResourceExhausted, match="asks for 1 new states"):
                c.best_actions(np.array([[a[0, 0], a[1, 1], a[2, 2], 0.123]]))
    finally:
        assert srv.terminate() == 0


def test_anonymous_callers_are_budgeted_by_host_not_connection(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b")
    srv = start_server(tmp_path, bundle, "--new-state-rate", "0.001", "--new-state-burst", "2")
    try:
        with ValueClient(srv.target) as c:
            c.values([0.1, 0.2])  # 2 states: the bucket
        with ValueClient(srv.target) as c, pytest.raises(ResourceExhausted):
            c.values([0.3])  # a new connection from the same host: same bucket
    finally:
        assert srv.terminate() == 0


def test_deprecated_point_rate_still_applies_and_warns(tmp_path: Path) -> None:
    """``--new-point-rate`` keeps its unit (stored points) beside the state bucket, and
    ``qveil serve`` says it is deprecated."""
    bundle = make_bundle(tmp_path / "b")
    srv = start_server(tmp_path, bundle, "--new-point-rate", "0.001", "--new-point-burst", "6")
    try:
        with ValueClient(srv.target) as c:
            c.values([0.1, 0.2])  # 6 points: the point bucket (2 of 100 000 states)
            with pytest.raises(ResourceExhausted, match="new-point-rate"):
                c.values([0.3])
        assert "--new-point-rate is deprecated" in srv.output()
    finally:
        assert srv.terminate() == 0


def test_paced_client_waits_out_the_new_state_rate(tmp_path: Path) -> None:
    """``best_actions_paced`` (the served evaluations' client) over a plain channel without
    the SDK's retry: a call over the caller's budget is refused whole with a RetryInfo delay;
    the client waits that long and asks again, so an evaluation finishes under the quota
    instead of failing, and every state's noise is stored once."""
    from qveil.client import RetryPolicy
    from qveil.trainer.served_eval import best_actions_paced

    bundle = make_bundle(tmp_path / "b")
    srv = start_server(
        tmp_path,
        bundle,
        "--new-state-rate",
        "4",  # a refill takes 1 s: the plain calls below are refused unless the machine
        "--new-state-burst",  # stalls for a second between two calls
        "4",
        store=f"sqlite:///{tmp_path / 'store.sqlite'}",
    )
    no_retry = RetryPolicy(attempts=1)
    try:
        with ValueClient(srv.target, retry=no_retry) as c:
            states = np.linspace(0.05, 0.95, 20).reshape(5, 4)  # 5 calls x 4 new states
            with pytest.raises(ResourceExhausted):  # the plain call outruns the bucket
                for row in states:
                    c.best_actions(row)
        with ValueClient(srv.target, retry=no_retry) as c:
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
        QuotaConfig(max_stored_points=100, new_state_rate=10, new_state_burst=20),
        clock=lambda: now[0],
    )
    t0 = q.admit("a", "r", new_states=20, new_points=20, stored=0)
    with pytest.raises(ResourceExhausted) as ei:
        q.admit("a", "r", new_states=1, new_points=1, stored=20)
    assert ei.value.retry_after == pytest.approx(0.1, abs=0.01)  # 1 state at 10/s
    now[0] = 0.5  # 5 tokens back
    t1 = q.admit("a", "r", new_states=5, new_points=5, stored=20)
    t2 = q.admit("b", "r", new_states=2, new_points=20, stored=25)  # another caller
    # pending (reserved, not committed) points count against the cap
    with pytest.raises(ResourceExhausted, match="cap is 100") as ei:
        q.admit("c", "r", new_states=1, new_points=20, stored=60)  # 60 + 45 + 20 > 100
    assert ei.value.retry_after == math.inf  # retrying never helps
    with pytest.raises(ResourceExhausted, match="split the request") as ei:
        q.admit("d", "r", new_states=21, new_points=21, stored=0)
    assert ei.value.retry_after == math.inf
    for t in (t0, t1, t2):
        q.done("r", t)
    q.admit("c", "r", new_states=20, new_points=20, stored=60)
    assert q.refused == {"stored_points": 1, "new_state_rate": 2}
    assert caller_host("ipv4:127.0.0.1:5555") == "ipv4:127.0.0.1"


def test_point_bucket_beside_the_state_bucket_waits_for_both() -> None:
    now = [0.0]
    q = Quotas(
        QuotaConfig(new_state_rate=1, new_state_burst=10, new_point_rate=10, new_point_burst=30),
        clock=lambda: now[0],
    )
    q.admit("a", "r", new_states=3, new_points=30, stored=0)
    with pytest.raises(ResourceExhausted, match="new-point-rate") as ei:
        q.admit("a", "r", new_states=1, new_points=10, stored=30)
    assert ei.value.retry_after == pytest.approx(1.0, abs=0.01)  # 10 points at 10/s
    now[0] = 1.0
    q.admit("a", "r", new_states=1, new_points=10, stored=30)
    assert q.refused == {"stored_points": 0, "new_state_rate": 0, "new_point_rate": 1}


def test_a_committed_reservation_is_not_counted_twice() -> None:
    """Between a request's commit and its done(), its points are in the store's count; the
    reservation then counts only its points still not stored, so a request that fits under
    the cap is admitted (a double count refused it: 30 + 30 pending + 40 > 90)."""
    q = Quotas(QuotaConfig(max_stored_points=90, new_state_rate=1e6))
    stored = [0]
    left = [30]
    t = q.admit(
        "a", "r", new_states=30, new_points=30, stored=lambda: stored[0], still_new=lambda: left[0]
    )
    stored[0], left[0] = 30, 0  # committed, done() not called yet
    q.admit("b", "r", new_states=60, new_points=60, stored=lambda: stored[0])  # 30 + 0 + 60
    with pytest.raises(ResourceExhausted):
        q.admit("c", "r", new_states=1, new_points=1, stored=lambda: stored[0])
    q.done("r", t)
    assert caller_host("ipv6:[::1]:5555") == "ipv6:[::1]"
    assert caller_host("unix:/tmp/s") == "unix:/tmp/s"


def test_reservations_are_recounted_only_when_all_their_points_would_not_fit() -> None:
    """Each admission checks the cap with every pending reservation's points first and counts
    the reservations' points still not stored (``still_new``, a look-up per state) only when
    that does not fit: the same verdicts as always counting, without a count per pending
    reservation on every admission."""
    q = Quotas(QuotaConfig(max_stored_points=100, new_state_rate=1e6))
    calls = [0]

    def still_new() -> int:
        calls[0] += 1
        return 0  # committed meanwhile

    tickets = [
        q.admit("a", "r", new_states=1, new_points=20, stored=0, still_new=still_new)
        for _ in range(3)
    ]
    assert calls[0] == 0  # 0 + 60 pending + 20 <= 100: nothing recounted
    q.admit("b", "r", new_states=1, new_points=40, stored=20)  # 20 + 60 + 40 > 100: recount
    assert calls[0] == 3  # ... and it fits: 20 + 0 + 40
    with pytest.raises(ResourceExhausted):
        q.admit("c", "r", new_states=1, new_points=41, stored=20)  # 20 + 40 + 41 > 100
    for t in tickets:
        q.done("r", t)


def test_cap_is_exact_under_concurrent_new_points(tmp_path: Path) -> None:
    """8 threads race 40 one-state requests (3 new points each) against a cap of 60: points
    reserved by requests still sampling count against the cap, so exactly 20 requests store
    their points and 20 are refused. A check against the committed count alone would let
    concurrent requests overshoot (up to 8 x 3 points)."""
    import threading

    tokens, srv = _capped_server(tmp_path, "60")
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
