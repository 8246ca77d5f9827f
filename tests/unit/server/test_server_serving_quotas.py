"""The query quota (``qveil.server.serving.quotas``), against real `qveil serve` processes and as a
unit.

* ``--state-rate R --state-burst B`` (aliases ``--new-state-rate``/``--new-state-burst``): a
  token bucket of states per caller (token name; peer host without tokens, so a new connection
  does not refill it). EVERY state of a request costs one token, whether it was asked before
  or not, whatever the release's actions and coordinates: an answer is a pure function of the
  release and the state, and a quota that counted only new states would tell a caller which
  states were asked before. A request over the tokens left is refused whole and answers (and
  logs) nothing;
* the limits are on the Prometheus endpoint.

Rates are chosen so that refills cannot matter within a test (0.001 state/s: a wait of
1000 s, longer than any call's deadline, so the server's pushback tells the SDK not to retry
and the refusal is immediate); the paced client's test over a channel without retries uses
4 states/s, deterministic unless the machine stalls for a second. The back-off of clients
told to wait is tested in tests/integration/test_quota_backoff.py; the answer log's cap
(``--max-stored-points``) in tests/integration/test_server_e2e.py.
"""

from __future__ import annotations

import math
import re
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from server_helpers import (
    grid_states,
    logged_points,
    make_bundle,
    make_tokens,
    served_values,
    start_server,
)

from qveil.bundle import load_bundle
from qveil.client.sync import ValueClient
from qveil.errors import InvalidArgument, ResourceExhausted
from qveil.server.serving.auth import add_token
from qveil.server.serving.quotas import QuotaConfig, Quotas, caller_host

ACTIONS = 3  # make_bundle's default


def test_state_rate_per_token_counts_every_state_and_refuses_whole_requests(
    tmp_path: Path,
) -> None:
    """A bucket of 10 states per token: 11 states can never fit; 10 take it all; then a
    request of states asked before is refused like any other, whole (nothing answered, nothing
    logged); another token has its own bucket. The limits and the refusals are on the
    Prometheus endpoint."""
    bundle = make_bundle(tmp_path / "b")
    tokens = make_tokens(tmp_path / "tokens.toml")
    other = add_token(tokens.path, "query", "other-client")
    srv = start_server(
        tmp_path,
        bundle,
        *("--tokens-file", str(tokens.path), "--metrics-port", "0"),
        "--state-rate",
        "0.001",  # a wait of ~1000 s, past any deadline: refused at once, not retried
        "--state-burst",
        "10",
        store=(store := f"sqlite:///{tmp_path / 'store.sqlite'}"),
    )
    try:
        grid = np.linspace(0, 1, 10)
        with ValueClient(srv.target, token=tokens.query) as c:
            with pytest.raises(ResourceExhausted, match="split the request"):
                c.values(np.linspace(0, 1, 11))  # 11 states > bucket of 10
            first = c.values(grid)  # 10 states: the whole bucket
            for ask in (
                lambda: c.values([grid[0]]),  # asked before: costs a token all the same
                lambda: c.values([grid[0], 0.55]),
                lambda: c.best_actions([0.65]),
            ):
                with pytest.raises(ResourceExhausted, match="state-rate"):
                    ask()
        with ValueClient(srv.target, token=other) as c2:  # another token: its own bucket
            again = c2.values(np.append(grid[:0:-1], 0.55))  # 10 states, 9 asked before
            np.testing.assert_array_equal(again[:9][::-1], first[1:])
        np.testing.assert_array_equal(first, served_values(bundle, grid))
        m = re.search(r"metrics on (http://\S+)", srv.output())
        assert m, srv.output()
        text = urllib.request.urlopen(m.group(1), timeout=10).read().decode()
        assert "qveil_state_rate 0.001" in text
        assert "qveil_state_burst 10.0" in text
        assert 'qveil_quota_refusals_total{limit="state_rate"} 4.0' in text
        assert "qveil_new_state_rate" not in text and "qveil_new_point" not in text
    finally:
        assert srv.terminate() == 0
    # refused requests answered nothing, so they logged nothing (0.65 is not in the log):
    # the grid and 0.55, each once per action (the stop flushed the log)
    logged = logged_points(store, load_bundle(bundle).bundle_id)
    unit = grid_states(bundle, np.append(grid, 0.55))[:, 0]
    assert {p: set(v) for p, v in logged.items()} == {a: set(unit.tolist()) for a in range(3)}


def test_a_state_costs_one_whatever_the_actions(tmp_path: Path) -> None:
    """The bucket counts states, not values: with 3 actions and a bucket of 4 states, a state
    costs 1 whether it is asked for 1 action or 3, asked before or not."""
    bundle = make_bundle(tmp_path / "b")
    srv = start_server(tmp_path, bundle, "--state-rate", "0.001", "--state-burst", "4")
    try:
        with ValueClient(srv.target) as c:
            c.values([0.1, 0.2], [0])  # 2 states: 2 left
            with pytest.raises(ResourceExhausted, match="holds 3 states"):
                c.values([0.1, 0.2, 0.3], [1, 2])  # 3 > 2
            c.values([0.1, 0.2], [1, 2])  # 2 states (4 values): 0 left
            with pytest.raises(ResourceExhausted, match="holds 1 states"):
                c.values([0.2], [0])  # asked before, for the same action: 1 > 0
    finally:
        assert srv.terminate() == 0


def test_a_state_of_d_coordinates_costs_one(
    tmp_path: Path, cartpole_release: tuple[Path, str]
) -> None:
    """A d = 4, 2-action release (CartPole): a state of 4 coordinates costs one state of the
    bucket, whatever it shares with the states asked before (a recombination of asked
    states' coordinates costs one like any other)."""
    from server_helpers import fresh_bundle

    bundle = fresh_bundle(cartpole_release[0], tmp_path / "kb" / "bundle")
    srv = start_server(tmp_path, bundle, "--state-rate", "0.001", "--state-burst", "4")
    try:
        with ValueClient(srv.target) as c:
            a = np.array([[0.01, 0.1, 0.02, 0.3], [-0.02, -0.1, 0.03, -0.2], [0.0, 0.2, 0.0, 0.1]])
            best = c.best_actions(a)  # 3 states: 1 left
            np.testing.assert_array_equal(best, np.argmax(served_values(bundle, a), axis=1))
            mixed = np.array([[a[0, 0], a[1, 1], a[2, 2], a[0, 3]]])
            c.best_actions(mixed)  # 1 state: 0 left
            with pytest.raises(ResourceExhausted, match="holds 1 states"):
                c.best_actions(a[:1])
    finally:
        assert srv.terminate() == 0


def test_anonymous_callers_are_budgeted_by_host_not_connection(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b")
    srv = start_server(tmp_path, bundle, "--state-rate", "0.001", "--state-burst", "2")
    try:
        with ValueClient(srv.target) as c:
            c.values([0.1, 0.2])  # 2 states: the bucket
        with ValueClient(srv.target) as c, pytest.raises(ResourceExhausted):
            c.values([0.1])  # a new connection from the same host: same bucket
    finally:
        assert srv.terminate() == 0


def test_new_state_flags_are_aliases_of_the_state_flags(tmp_path: Path) -> None:
    """``--new-state-rate``/``--new-state-burst`` (the names before every state was counted)
    set the same bucket; the removed ``--new-point-rate`` is refused as an unknown flag."""
    from server_helpers import qveil

    bundle = make_bundle(tmp_path / "b")
    srv = start_server(tmp_path, bundle, "--new-state-rate", "0.001", "--new-state-burst", "2")
    try:
        with ValueClient(srv.target) as c:
            c.values([0.1, 0.2])
            with pytest.raises(ResourceExhausted, match="--state-rate"):
                c.values([0.1])
    finally:
        assert srv.terminate() == 0
    r = qveil("serve", "--bundle", str(bundle), "--new-point-rate", "5", cwd=tmp_path)
    assert r.returncode == 2 and "--new-point-rate" in r.stderr, r.stderr


def test_paced_client_waits_out_the_state_rate(tmp_path: Path) -> None:
    """``best_actions_paced`` (the served evaluations' client) over a plain channel without
    the SDK's retry: a call over the caller's budget is refused whole with a RetryInfo delay;
    the client waits that long and asks again, so an evaluation finishes under the quota
    instead of failing, with the release's best actions."""
    from qveil.client import RetryPolicy
    from qveil.trainer.served_eval import best_actions_paced

    bundle = make_bundle(tmp_path / "b")
    srv = start_server(
        tmp_path,
        bundle,
        "--state-rate",
        "4",  # a refill takes 1 s: the plain calls below are refused unless the machine
        "--state-burst",  # stalls for a second between two calls
        "4",
        store=f"sqlite:///{tmp_path / 'store.sqlite'}",
    )
    no_retry = RetryPolicy(attempts=1)
    try:
        states = np.linspace(0.05, 0.95, 20).reshape(5, 4)  # 5 calls x 4 states
        with ValueClient(srv.target, retry=no_retry) as c:
            with pytest.raises(ResourceExhausted):  # the plain call outruns the bucket
                for row in states:
                    c.best_actions(row)
        with ValueClient(srv.target, retry=no_retry) as c:
            got = [best_actions_paced(c, row) for row in states]
    finally:
        assert srv.terminate() == 0
    assert [len(g) for g in got] == [4] * 5
    want = np.argmax(served_values(bundle, states.reshape(-1)), axis=1)
    np.testing.assert_array_equal(np.concatenate(got), want)


# ----------------------------------------------------------------------------- unit
def test_quotas_unit() -> None:
    """admit(caller, states): every state one token; a refusal takes none and says how long
    to wait (inf when the request exceeds the bucket); buckets refill at the rate, up to
    the burst; each caller has its own."""
    now = [0.0]
    q = Quotas(QuotaConfig(state_rate=10, state_burst=20), clock=lambda: now[0])
    q.admit("a", 20)
    with pytest.raises(ResourceExhausted, match="holds 1 states") as ei:
        q.admit("a", 1)
    assert ei.value.retry_after == pytest.approx(0.1, abs=0.01)  # 1 state at 10/s
    now[0] = 0.5  # 5 tokens back
    with pytest.raises(ResourceExhausted) as ei:
        q.admit("a", 6)  # refused whole: takes none of the 5
    assert ei.value.retry_after == pytest.approx(0.1, abs=0.01)
    q.admit("a", 5)
    q.admit("b", 20)  # another caller: a full bucket
    with pytest.raises(ResourceExhausted, match="split the request") as ei:
        q.admit("c", 21)
    assert ei.value.retry_after == math.inf  # retrying never helps
    q.admit("c", 0)  # nothing asked: nothing taken, never refused
    now[0] = 1000.0  # refilled, but never past the burst
    q.admit("a", 20)
    with pytest.raises(ResourceExhausted):
        q.admit("a", 1)
    assert q.refused == {"state_rate": 4}


def test_quota_config_defaults_and_validation() -> None:
    from qveil.server.serving.quotas import DEFAULT_BURST_SECONDS, DEFAULT_STATE_RATE

    cfg = QuotaConfig()
    assert cfg.state_rate == DEFAULT_STATE_RATE
    assert cfg.burst == DEFAULT_BURST_SECONDS * DEFAULT_STATE_RATE
    assert QuotaConfig(state_rate=0.001).burst == 1.0  # at least one state
    assert QuotaConfig(state_rate=2, state_burst=3).burst == 3.0
    for bad in (
        {"state_rate": 0},
        {"state_rate": -1},
        {"state_rate": math.inf},
        {"state_rate": math.nan},
        {"state_burst": 0.5},
        {"state_burst": math.inf},
    ):
        with pytest.raises(InvalidArgument):
            QuotaConfig(**bad)  # type: ignore[arg-type]


def test_full_buckets_are_forgotten_past_the_tracked_callers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past ``MAX_TRACKED_CALLERS`` buckets, the full ones are dropped (a caller with a full
    bucket is the same as a new one); a caller with tokens spent is kept."""
    from qveil.server.serving import quotas

    monkeypatch.setattr(quotas, "MAX_TRACKED_CALLERS", 3)
    now = [0.0]
    q = Quotas(QuotaConfig(state_rate=1, state_burst=10), clock=lambda: now[0])
    q.admit("spender", 10)
    for k in range(3):
        q.admit(f"c{k}", 1)
    now[0] = 5.0  # c0..c2 full again; spender has 5
    q.admit("c3", 1)
    assert set(q._buckets) == {"spender", "c3"}
    with pytest.raises(ResourceExhausted):
        q.admit("spender", 6)
    q.admit("spender", 5)


def test_caller_host() -> None:
    assert caller_host("ipv4:127.0.0.1:5555") == "ipv4:127.0.0.1"
    assert caller_host("ipv6:[::1]:5555") == "ipv6:[::1]"
    assert caller_host("unix:/tmp/s") == "unix:/tmp/s"
    assert caller_host("token:x") == "token:x"
