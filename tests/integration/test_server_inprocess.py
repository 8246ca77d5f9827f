"""The real grpc.aio server (qveil.server.app.create_server) on a background event loop,
over loopback, with a real SQLite store as its answer log: the bad-input property test, health
transitions, the concurrency bound, deadlines, anonymous mode, atomic activation, replicas on one
PostgreSQL log and the log's count of what it wrote."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_helpers import InProcessServer, fresh_bundle, health_status, make_bundle

from qveil.bundle import load_bundle
from qveil.client import (
    AdminClient,
    AuditClient,
    DeadlineExceededError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnavailableError,
    ValueClient,
)
from qveil.v1 import value_service_pb2 as value_pb
from qveil.v1 import value_service_pb2_grpc as value_grpc

LO, HI, M, MAX_BATCH = -1.0, 2.0, 3, 64


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Template bundles, never served: each test serves copies charged in its own registry."""
    d = tmp_path_factory.mktemp("bundles")
    return make_bundle(d / "b1", seed=11), make_bundle(d / "b2", seed=12)


@pytest.fixture
def bundles(templates: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """Fresh copies of the templates for this test's store."""
    return (
        fresh_bundle(templates[0], tmp_path / "bundles" / "b1"),
        fresh_bundle(templates[1], tmp_path / "bundles" / "b2"),
    )


@pytest.fixture(scope="module")
def srv(
    templates: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcessServer]:
    d = tmp_path_factory.mktemp("store")
    store = f"sqlite:///{d / 's.sqlite'}"
    mine = fresh_bundle(templates[0], d / "b1"), fresh_bundle(templates[1], d / "b2")
    with InProcessServer(mine[0], store, max_batch=MAX_BATCH) as s:
        s.bundles = mine  # type: ignore[attr-defined]
        yield s


# ----------------------------------------------------------------------------- property test
finite_in = st.floats(LO, HI, allow_nan=False)
# a finite state outside [LO, HI] is not bad: it is clipped into the interval and answered
bad_state = st.one_of(st.just(math.nan), st.just(math.inf), st.just(-math.inf))
good_actions = st.lists(st.integers(0, M - 1), unique=True, max_size=M)
bad_action = st.one_of(st.integers(M, 2**31 - 1), st.integers(-(2**31), -1))


@st.composite
def invalid_request(draw: st.DrawFn) -> value_pb.GetValuesRequest:
    """A GetValues request with at least one defect: bad state(s) among good ones, bad or
    repeated actions, an empty batch or one over the limit."""
    kind = draw(st.sampled_from(["state", "action", "dup_action", "empty", "oversize", "mixed"]))
    states = draw(st.lists(finite_in, min_size=1, max_size=MAX_BATCH - 1))
    actions = draw(good_actions)
    if kind in ("state", "mixed"):
        for _ in range(draw(st.integers(1, 3))):
            states.insert(draw(st.integers(0, len(states))), draw(bad_state))
        states = states[:MAX_BATCH]
        if all(math.isfinite(s) for s in states):  # truncated away: put one back
            states[-1] = math.nan
    if kind in ("action", "mixed"):
        actions = [*actions, draw(bad_action)]
        actions.insert(draw(st.integers(0, len(actions) - 1)), actions.pop())
    if kind == "dup_action":
        a = draw(st.integers(0, M - 1))
        actions = [*[x for x in actions if x != a], a, a]
    if kind == "empty":
        states = []
    if kind == "oversize":
        states = draw(st.lists(finite_in, min_size=MAX_BATCH + 1, max_size=2 * MAX_BATCH))
    return value_pb.GetValuesRequest(states=states, actions=actions)


def _answered(s: InProcessServer) -> int:
    """(state, action) values the server has answered."""
    return int(s.services.ctx.metrics.states_answered)


def test_bad_requests_are_invalid_argument_and_answer_nothing(srv: InProcessServer) -> None:
    """~1200 invalid GetValues requests over real gRPC: each INVALID_ARGUMENT naming the
    field; nothing is answered and nothing logged (validation precedes every answer)."""
    with grpc.insecure_channel(srv.target) as ch:
        stub = value_grpc.ValueServiceStub(ch)
        # a log with points, so "nothing logged" is tested on a non-empty store
        stub.GetValues(value_pb.GetValuesRequest(states=[0.0, 0.5, 1.0]), timeout=10)
        assert srv.answers.flush(30)
        before = srv.store.count_points(), _answered(srv)
        codes: list[str] = []

        @settings(
            max_examples=1200,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(invalid_request())
        def check(req: value_pb.GetValuesRequest) -> None:
            with pytest.raises(grpc.RpcError) as ei:
                stub.GetValues(req, timeout=10)
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (req, ei.value)
            assert ei.value.details()
            codes.append(ei.value.code().name)

        check()
    assert len(codes) >= 1000
    assert srv.answers.flush(30)
    assert (srv.store.count_points(), _answered(srv)) == before


# ----------------------------------------------------------------------------- health, limits
def test_health_transitions(bundles: tuple[Path, Path], tmp_path: Path) -> None:
    with InProcessServer(bundles[0], f"sqlite:///{tmp_path / 's.sqlite'}", start=False) as s:
        assert health_status(s.target) == "NOT_SERVING"
        from qveil.client.channel import RetryPolicy

        with ValueClient(s.target, retry=RetryPolicy(attempts=1), timeout=5) as c:
            with pytest.raises(UnavailableError):
                c.values([0.1])
            s.ready(bundles[0])
            assert health_status(s.target) == "SERVING"
            assert health_status(s.target, "qveil.v1.ValueService") == "SERVING"
            c.values([0.1])
            s.run(s.health.drain())
            assert health_status(s.target) == "NOT_SERVING"
            assert health_status(s.target, "qveil.v1.ValueService") == "NOT_SERVING"


#: calls of more states than the data plane answers on its event loop go to the executor
BIG = 100


def _block_executor(s: InProcessServer, workers: int = 4) -> threading.Event:
    """Occupy every executor thread until the returned event is set."""
    gate = threading.Event()
    for _ in range(workers):
        s.executor.submit(gate.wait, 30)
    return gate


def test_concurrency_bound_and_deadline(bundles: tuple[Path, Path], tmp_path: Path) -> None:
    """One call in flight (of BIG states: answered in the executor, held there) is the bound:
    a second is RESOURCE_EXHAUSTED with a retry delay; a call whose deadline passes while it
    waits for an executor thread is DEADLINE_EXCEEDED and answers (and logs) nothing."""
    from qveil.server.protocol.dataplane import INLINE_MAX_STATES

    assert BIG > INLINE_MAX_STATES
    xs = np.linspace(LO, HI, BIG).reshape(-1, 1)  # [n, 1]: the client needs no GetRelease
    with InProcessServer(bundles[0], f"sqlite:///{tmp_path / 's.sqlite'}", max_in_flight=1) as s:
        gate = _block_executor(s)
        with ValueClient(s.target, timeout=20) as c, ThreadPoolExecutor(1) as pool:
            first = pool.submit(c.values, xs)
            while s.plane.in_flight < 1:
                time.sleep(0.005)
            with pytest.raises(ResourceExhaustedError) as ei:
                c.values([[0.75]])
            assert ei.value.retry_delay is not None
            gate.set()
            assert first.result(20).shape == (BIG, M)
        assert _answered(s) == BIG * M
        # a deadline that expires while the call waits for an executor thread: nothing
        gate = _block_executor(s)
        with ValueClient(s.target) as c:
            with pytest.raises(DeadlineExceededError):
                c.values(xs + 0.001, timeout=0.2)
        gate.set()
        time.sleep(0.3)
        assert _answered(s) == BIG * M
        assert s.answers.flush(30)
        assert s.store.count_points() == BIG * M


def test_anonymous_loopback_mode(srv: InProcessServer) -> None:
    """No tokens file: anyone queries, nobody administers or audits."""
    with ValueClient(srv.target) as c:
        assert c.values([0.5]).shape == (1, M)
    with AdminClient(srv.target) as ad, pytest.raises(PermissionDeniedError):
        ad.list_releases()
    with AuditClient(srv.target) as au, pytest.raises(PermissionDeniedError):
        au.verify()


def test_activation_is_atomic_under_load(bundles: tuple[Path, Path], tmp_path: Path) -> None:
    """While releases are swapped back and forth, every response comes from exactly one
    release: its release id names it and its values are that release's values."""
    b1, b2 = (load_bundle(b) for b in bundles)
    states = np.linspace(LO, HI, 16)
    from qveil.server.serving.auth import add_token

    tokens = tmp_path / "t.toml"
    admin = add_token(tokens, "admin")
    query = add_token(tokens, "query")
    with InProcessServer(bundles[0], f"sqlite:///{tmp_path / 's.sqlite'}", tokens=tokens) as s:
        with AdminClient(s.target, token=admin) as ad:
            ad.activate(b2.bundle_id)  # found among the served bundle's siblings
            with ValueClient(s.target, token=query) as c:
                truth = {b2.bundle_id: c.values(states)}
            ad.activate(b1.bundle_id)
            with ValueClient(s.target, token=query) as c:
                truth[b1.bundle_id] = c.values(states)
            seen: list[tuple[str, np.ndarray]] = []
            stop = threading.Event()

            def query_loop() -> None:
                with ValueClient(s.target, token=query) as c:
                    while not stop.is_set():
                        v = c.get_values(states)
                        seen.append((v.release_id, v.values))

            th = threading.Thread(target=query_loop)
            th.start()
            for i in range(6):
                ad.activate((b2 if i % 2 == 0 else b1).bundle_id)
            stop.set()
            th.join(30)
            listed, active = ad.list_releases()
        assert active == b1.bundle_id
        assert {r.release_id: r.status for r in listed} == {
            b1.bundle_id: "active",
            b2.bundle_id: "staged",
        }
    assert len(seen) > 5 and {rid for rid, _ in seen} <= set(truth)
    for rid, vals in seen:
        np.testing.assert_array_equal(vals, truth[rid])


def test_client_retries_unavailable_until_ready(bundles: tuple[Path, Path], tmp_path: Path) -> None:
    """The SDK retries UNAVAILABLE (queries are idempotent): a call made while the server is
    still starting succeeds once it is ready."""
    from qveil.client import RetryPolicy

    with InProcessServer(bundles[0], f"sqlite:///{tmp_path / 's.sqlite'}", start=False) as s:
        timer = threading.Timer(0.1, s.ready, args=(bundles[0],))
        timer.start()
        policy = RetryPolicy(attempts=5, initial_backoff=0.1, max_backoff=1.0)
        with ValueClient(s.target, retry=policy, timeout=5) as c:
            assert c.values([0.5]).shape == (1, M)
        timer.join()


@pytest.mark.postgres
def test_two_replicas_share_a_postgres_store(bundles: tuple[Path, Path], pg_url: str) -> None:
    """Two servers logging into one PostgreSQL store answer identically (the release's key
    decides, not the store), and the log holds each answered state once whichever replica
    (or both) answered it."""
    from server_helpers import served_values

    states_a = np.linspace(LO, HI, 40)
    states_b = np.linspace(LO, HI - 0.05, 40) + 0.0125
    with InProcessServer(bundles[0], pg_url) as r1, InProcessServer(bundles[0], pg_url) as r2:
        with ValueClient(r1.target) as c1, ValueClient(r2.target) as c2:
            a1 = c1.values(states_a)  # first asked of replica 1
            b2 = c2.values(states_b)  # first asked of replica 2
            np.testing.assert_array_equal(c2.values(states_a), a1)
            np.testing.assert_array_equal(c1.values(states_b), b2)
        assert r1.answers.flush(30) and r2.answers.flush(30)
        rid = r1.services.ctx.holder.current().release_id
        assert r1.store.count_points(rid) == 80 * M
        assert r1.answers.mismatched == r2.answers.mismatched == 0
    assert a1.tobytes() == served_values(bundles[0], states_a).tobytes()
    assert b2.tobytes() == served_values(bundles[0], states_b).tobytes()


def test_oversized_message_is_refused_and_answers_nothing(srv: InProcessServer) -> None:
    """A request over the server's message limit (4 MiB) is refused by gRPC itself."""
    before = _answered(srv)
    with grpc.insecure_channel(
        srv.target, options=[("grpc.max_send_message_length", 64 << 20)]
    ) as ch:
        stub = value_grpc.ValueServiceStub(ch)
        huge = value_pb.GetValuesRequest(states=np.linspace(LO, HI, 600_000).tolist())
        with pytest.raises(grpc.RpcError) as ei:
            stub.GetValues(huge, timeout=30)
    assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _answered(srv) == before


def test_logged_points_count_each_logged_point_once(
    bundles: tuple[Path, Path], tmp_path: Path
) -> None:
    """The answer log's count (``logged``: GetStats new_points, qveil_logged_points_total)
    equals the rows it committed: repeated states add nothing, and 8 concurrent callers on
    overlapping states never count a point twice."""
    with InProcessServer(bundles[0], f"sqlite:///{tmp_path / 's.sqlite'}") as s:
        xs = np.linspace(LO, HI, 40)
        with ValueClient(s.target) as c:
            c.values(xs)
            c.values(xs)  # all logged: no new point
            assert s.answers.flush(30)
            assert s.answers.logged == 40 * M
            rng = np.random.default_rng(5)
            grid = np.linspace(LO, HI, 97)
            batches = [rng.choice(grid, 30) for _ in range(24)]
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(c.values, batches))
            assert s.answers.flush(30)
            with AdminClient(s.target) as ad, pytest.raises(PermissionDeniedError):
                ad.stats()  # anonymous: no admin role (the count is checked in process)
        distinct = len(set(xs.tolist()) | {float(x) for b in batches for x in b})
        stored = s.store.count_points()
        assert s.answers.logged == stored == s.store.committer.points_logged == distinct * M
        assert s.answers.unlogged == s.answers.mismatched == 0
