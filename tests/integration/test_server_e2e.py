"""End to end against a real `qveil serve` subprocess on 127.0.0.1 (port 0) with a SQLite
store and a tokens file: answers are the release's (network + keyed noise, computed here from
the bundle's key, bit for bit), identical across clients and restarts; best actions are the
argmax; the card is the bundle's public card; every RPC x role; the error table; rejected
requests answer nothing; reflection-only and health clients; the answer log (what a server
answered is in its store after a graceful stop, once per state; ``--max-stored-points``
stops the logging, never the answers)."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from cli_helpers import qveil_main
from server_helpers import (
    QVEIL,
    ServerProcess,
    Tokens,
    grid_states,
    health_status,
    logged_points,
    make_bundle,
    make_tokens,
    registry_home,
    served_values,
    start_server,
)

from qveil.bundle import PUBLIC_CARD_KEYS, load_bundle
from qveil.client import (
    AdminClient,
    AsyncValueClient,
    AuditClient,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RpcError,
    UnauthenticatedError,
    ValueClient,
)
from qveil.v1 import admin_service_pb2 as admin_pb
from qveil.v1 import admin_service_pb2_grpc as admin_grpc
from qveil.v1 import audit_service_pb2 as audit_pb
from qveil.v1 import audit_service_pb2_grpc as audit_grpc
from qveil.v1 import value_service_pb2 as value_pb
from qveil.v1 import value_service_pb2_grpc as value_grpc

MAX_BATCH = 512


class Env:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        # the module's server keeps one registry across its tests (and restarts): the
        # bundles are charged and receipted by it
        with registry_home(tmp / "qveil-home"):
            self.bundle = make_bundle(tmp / "bundles" / "b1", seed=1)
            self.bundle2 = make_bundle(tmp / "bundles" / "b2", seed=2)
        self.b = load_bundle(self.bundle)
        self.b2 = load_bundle(self.bundle2)
        self.tokens: Tokens = make_tokens(tmp / "tokens.toml")
        self.store = f"sqlite:///{tmp / 'store.sqlite'}"
        self.server: ServerProcess | None = None

    def start(self) -> ServerProcess:
        self.server = start_server(
            self.tmp,
            self.bundle,
            "--tokens-file",
            str(self.tokens.path),
            "--reflection",
            "--max-batch",
            str(MAX_BATCH),
            "--metrics-port",
            "0",
            store=self.store,
            home=self.tmp / "qveil-home",
        )
        return self.server

    @property
    def target(self) -> str:
        assert self.server is not None
        return self.server.target


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    e = Env(tmp_path_factory.mktemp("e2e"))
    e.start()
    try:
        yield e
    finally:
        if e.server is not None:
            assert e.server.terminate() == 0, e.server.output()


def states_answered(env: Env) -> int:
    with AdminClient(env.target, token=env.tokens.admin) as ad:
        return ad.stats().states_answered


STATES = np.array([-1.0, -0.5, 0.0, 0.3, 0.3, 0.75, 1.2, 2.0, 0.3000001])


def test_answers_are_the_releases_keyed_values(env: Env) -> None:
    """Each value is grid_round(Q(snap(x), a) + g_a(snap(x))), computed here from the bundle
    and its key (qveil.answer.released_values), bit for bit: a repeated state gets the same
    bits, on the value grid."""
    with ValueClient(env.target, token=env.tokens.query) as c:
        got = c.get_values(STATES)
    assert got.release_id == env.b.bundle_id and got.actions == (0, 1, 2)
    assert got.values.tobytes() == served_values(env.b, STATES).tobytes()
    assert np.all(np.mod(got.values, got.value_grid) == 0)
    assert got.values[3].tolist() == got.values[4].tolist()  # repeated state, same answer
    # the model alone is not what is served: the noise is there
    assert np.max(np.abs(got.values - env.b.q_values(STATES))) > 10 * got.value_grid


def test_identical_across_clients_and_actions_subset(env: Env) -> None:
    import asyncio

    with ValueClient(env.target, token=env.tokens.query) as c1:
        v1 = c1.values(STATES)
        sub = c1.values(STATES, actions=[2, 0])
    with ValueClient(env.target, token=env.tokens.admin) as c2:
        v2 = c2.values(STATES[::-1])[::-1]

    async def aio() -> np.ndarray:
        async with AsyncValueClient(env.target, token=env.tokens.auditor) as c3:
            return await c3.values(STATES)

    v3 = asyncio.run(aio())
    np.testing.assert_array_equal(v1, v2)
    np.testing.assert_array_equal(v1, v3)
    np.testing.assert_array_equal(sub, v1[:, [2, 0]])


def test_best_actions_are_argmax(env: Env) -> None:
    states = np.linspace(-1, 2, 200)
    with ValueClient(env.target, token=env.tokens.query) as c:
        vals = c.values(states)
        best = c.get_best_actions(states)
    np.testing.assert_array_equal(best.actions, np.argmax(vals, axis=1))
    np.testing.assert_array_equal(best.values, vals.max(axis=1))


def test_concurrent_single_state_calls_answer_as_one_big_call(env: Env) -> None:
    """16 threads ask one state per call (GetBestActions and GetValues interleaved, each
    answered on the event loop), then ask all of them again: every answer is bit for bit the
    one a single big GetValues (answered in the executor) gives."""
    from concurrent.futures import ThreadPoolExecutor

    states = np.random.default_rng(11).uniform(-1.0, 2.0, 96)

    def ask(i: int) -> tuple[np.ndarray, np.ndarray]:
        with ValueClient(env.target, token=env.tokens.query) as c:
            if i % 2:
                b = c.get_best_actions(states[i : i + 1])
                return b.actions, b.values
            v = c.values(states[i : i + 1])
            return np.argmax(v, axis=1), v.max(axis=1)

    with ThreadPoolExecutor(16) as pool:
        first = list(pool.map(ask, range(states.size)))
        again = list(pool.map(ask, range(states.size)))
    with ValueClient(env.target, token=env.tokens.query) as c:
        vals = c.values(states)
    for answers in (first, again):
        acts = np.concatenate([a for a, _ in answers])
        best = np.concatenate([v for _, v in answers])
        np.testing.assert_array_equal(acts, np.argmax(vals, axis=1))
        assert best.tobytes() == vals.max(axis=1).tobytes()


def test_card_matches_bundle_and_hides_weights(env: Env) -> None:
    with ValueClient(env.target, token=env.tokens.query) as c:
        r = c.release()
    card = env.b.public_card()
    assert r.card == card and set(r.card) <= {k.partition(".")[0] for k in PUBLIC_CARD_KEYS}
    assert r.release_id == env.b.bundle_id and r.status == "active"
    assert (r.mode, r.epsilon, r.delta, r.delta_total, r.holds, r.basis) == (
        card["mode"],
        card["epsilon"],
        card["delta"],
        card["delta_total"],
        card["holds"],
        card["basis"],
    )
    assert (r.sigma, r.beta, r.n_actions, r.q_bound) == (env.b.sigma, env.b.beta, 3, env.b.q_bound)
    assert r.interval == tuple(card["state_interval"])
    assert "weights_sha256" not in r.card and "network" not in r.card
    assert "key_sha256" not in r.card and "noise_key" not in r.card


def _fields(desc: Any, seen: set[str]) -> set[str]:
    if desc.full_name in seen:
        return set()
    seen.add(desc.full_name)
    out = set()
    for f in desc.fields:
        out.add(f.name)
        if f.message_type is not None:
            out |= _fields(f.message_type, seen)
    return out


def test_query_role_schema_carries_no_weights_or_noise() -> None:
    """Every message the query role can receive, recursively: no field that could carry a
    weight or a raw noise value (those are AuditService's NoisePoint.g only)."""
    names: set[str] = set()
    for m in value_pb.DESCRIPTOR.services_by_name["ValueService"].methods:
        names |= _fields(m.output_type, set())
    assert not {n for n in names if re.search(r"weight|noise|^g$|^w\d", n)}, names


# ----------------------------------------------------------------------------- role matrix
ROLES = (None, "query", "admin", "auditor")
ALLOWED = {
    "ValueService": {None, "query", "admin", "auditor"},
    "AdminService": {"admin"},
    "AuditService": {"auditor"},
}


def _calls(env: Env, ch: grpc.Channel) -> dict[tuple[str, str], Callable[[Any], Any]]:
    v, ad, au = (
        value_grpc.ValueServiceStub(ch),
        admin_grpc.AdminServiceStub(ch),
        audit_grpc.AuditServiceStub(ch),
    )
    rid = env.b.bundle_id
    return {
        ("ValueService", "GetValues"): lambda md: v.GetValues(
            value_pb.GetValuesRequest(states=[0.1]), metadata=md, timeout=10
        ),
        ("ValueService", "GetBestActions"): lambda md: v.GetBestActions(
            value_pb.GetBestActionsRequest(states=[0.1]), metadata=md, timeout=10
        ),
        ("ValueService", "GetRelease"): lambda md: v.GetRelease(
            value_pb.GetReleaseRequest(), metadata=md, timeout=10
        ),
        ("AdminService", "ListReleases"): lambda md: ad.ListReleases(
            admin_pb.ListReleasesRequest(), metadata=md, timeout=10
        ),
        ("AdminService", "ActivateRelease"): lambda md: ad.ActivateRelease(
            admin_pb.ActivateReleaseRequest(release_id=rid), metadata=md, timeout=30
        ),
        ("AdminService", "RetireRelease"): lambda md: ad.RetireRelease(
            admin_pb.RetireReleaseRequest(release_id=env.b2.bundle_id), metadata=md, timeout=10
        ),
        ("AdminService", "GetStats"): lambda md: ad.GetStats(
            admin_pb.GetStatsRequest(), metadata=md, timeout=10
        ),
        ("AdminService", "GetBudget"): lambda md: ad.GetBudget(
            admin_pb.GetBudgetRequest(), metadata=md, timeout=10
        ),
        ("AuditService", "StreamNoisePoints"): lambda md: list(
            au.StreamNoisePoints(
                audit_pb.StreamNoisePointsRequest(action=0), metadata=md, timeout=10
            )
        ),
        ("AuditService", "VerifyIntegrity"): lambda md: au.VerifyIntegrity(
            audit_pb.VerifyIntegrityRequest(), metadata=md, timeout=30
        ),
        ("AuditService", "GetStatisticalReport"): lambda md: au.GetStatisticalReport(
            audit_pb.GetStatisticalReportRequest(), metadata=md, timeout=30
        ),
    }


def test_every_rpc_by_role(env: Env) -> None:
    # b2 registered (staged) so that the admin's RetireRelease has something to retire
    with AdminClient(env.target, token=env.tokens.admin) as ad:
        ad.activate(bundle_path=str(env.bundle2))
        ad.activate(env.b.bundle_id)
    seen: dict[tuple[str, str, str | None], str] = {}
    with grpc.insecure_channel(env.target) as ch:
        calls = _calls(env, ch)
        assert len(calls) == 11
        for (service, method), call in calls.items():
            for role in ROLES:
                token = env.tokens.of(role)
                md = (("authorization", f"Bearer {token}"),) if token else ()
                try:
                    call(md)
                    seen[(service, method, role)] = "OK"
                except grpc.RpcError as exc:
                    seen[(service, method, role)] = exc.code().name
    for (service, method, role), code in seen.items():
        if role is None:
            want = "UNAUTHENTICATED"  # the server has a tokens file: every call needs a token
        elif role in ALLOWED[service]:
            want = "OK"
        else:
            want = "PERMISSION_DENIED"
        assert code == want, (service, method, role, code)


# ----------------------------------------------------------------------------- errors
def test_error_table_and_rejections_answer_nothing(env: Env) -> None:
    with ValueClient(env.target, token=env.tokens.query) as c:
        c.values([0.5])
        # a state outside the interval [-1, 2] is clipped into it: answered as its end
        np.testing.assert_array_equal(c.values([2.0000001, -1.5]), c.values([2.0, -1.0]))
        before = states_answered(env)
        bad_inputs: list[tuple[Any, Any, str]] = [
            ([float("nan")], None, "STATE_NOT_FINITE"),
            ([0.2, float("inf")], None, "STATE_NOT_FINITE"),
            ([float("-inf")], None, "STATE_NOT_FINITE"),
            ([0.4], [3], "UNKNOWN_ACTION"),
            ([0.4], [-1], "UNKNOWN_ACTION"),
            ([0.4], [1, 1], "DUPLICATE_ACTION"),
            ([], None, "EMPTY_BATCH"),
            (np.linspace(-1, 2, MAX_BATCH + 1) + 1e-7, None, "BATCH_TOO_LARGE"),
        ]
        for states, actions, reason in bad_inputs:
            with pytest.raises(InvalidArgumentError) as ei:
                c.values(states, actions)
            assert ei.value.reason == reason, (states, actions, ei.value)
            assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(InvalidArgumentError):
            c.best_actions([float("nan")])
        # an unknown and an inactive release id get the same answer (no existence oracle)
        answers = []
        for rid in ("f" * 32, env.b2.bundle_id):  # unknown; registered, not active
            with pytest.raises(FailedPreconditionError) as ei:
                c.get_values([0.41], release_id=rid)
            answers.append((ei.value.code, ei.value.reason, str(ei.value).replace(rid, "ID")))
        assert answers[0] == answers[1], answers
    with AuditClient(env.target, token=env.tokens.auditor) as a:
        with pytest.raises(NotFoundError):
            a.verify(release_id="no-such-release")
        with pytest.raises(InvalidArgumentError):
            list(a.noise_points(7))
    with AdminClient(env.target, token=env.tokens.admin) as ad:
        with pytest.raises(NotFoundError):
            ad.retire("no-such-release")
        with pytest.raises(NotFoundError):
            ad.activate("no-such-release")
        with pytest.raises(FailedPreconditionError):
            ad.retire(env.b.bundle_id)  # the active one
    with ValueClient(env.target) as anon, pytest.raises(UnauthenticatedError):
        anon.values([0.42])
    with ValueClient(env.target, token="wrong") as bad, pytest.raises(UnauthenticatedError):
        bad.values([0.42])
    with AdminClient(env.target, token=env.tokens.query) as q, pytest.raises(PermissionDeniedError):
        q.stats()
    assert states_answered(env) == before


def test_cli_query(env: Env, tmp_path: Path) -> None:
    tf = tmp_path / "tok"
    tf.write_text(env.tokens.query + "\n")
    r = subprocess.run(
        [
            QVEIL,
            "query",
            "--target",
            env.target,
            "--state",
            "0.3,1.5",
            "--json",
            "--token-file",
            str(tf),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    with ValueClient(env.target, token=env.tokens.query) as c:
        np.testing.assert_array_equal(np.array(out["values"]), c.values([0.3, 1.5]))
    r = qveil_main("query", "--target", env.target, "--state", "9,x", "--token-file", str(tf))
    assert r.returncode == 2 and "is not a number" in r.stderr
    r = subprocess.run(
        [QVEIL, "query", "--target", env.target, "--card", "--token-file", str(tf)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and env.b.bundle_id in r.stdout


def _metrics(sp: ServerProcess) -> str:
    m = re.search(r"metrics on (http://\S+)", sp.output())
    assert m, sp.output()
    return str(urllib.request.urlopen(m.group(1), timeout=10).read().decode())


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m, (name, text)
    return float(m.group(1))


def test_metrics_endpoint(env: Env) -> None:
    assert env.server is not None
    with ValueClient(env.target, token=env.tokens.query) as c:
        c.values([0.987654321])
    text = _metrics(env.server)
    assert 'qveil_requests_total{code="OK",method="GetValues",protocol="grpc"}' in text
    assert 'qveil_request_duration_seconds_bucket{le="0.001",method="GetValues",' in text
    assert "qveil_stored_points{" in text
    assert re.search(r'^qveil_build_info\{version="[^"]+"\} 1\.0$', text, re.M), text[:2000]
    assert _metric(text, "process_resident_memory_bytes") > 0  # the process collector
    assert "python_info{" in text
    assert _metric(text, "qveil_states_answered_total") >= 3
    assert _metric(text, "qveil_state_rate") == 1000.0
    assert _metric(text, "qveil_state_burst") == 100000.0
    assert _metric(text, "qveil_max_stored_points") == 10_000_000
    for name in ("qveil_logged_points_total", "qveil_log_unlogged_points_total"):
        assert _metric(text, name) >= 0
    assert _metric(text, "qveil_log_mismatched_total") == 0
    assert _metric(text, "qveil_log_queued") >= 0
    for gone in (
        "qveil_new_points_total",
        "qveil_batches_total",
        "qveil_new_state_rate",
        "qveil_request_seconds",
    ):
        assert gone not in text


def test_access_log_and_authentication_failures_as_json(tmp_path: Path) -> None:
    """`--access-log --log-format json`: one JSON line per call (method, protocol, caller,
    release, code, states, latency; no state or value), and a WARNING line for a refused
    credential (never the credential itself); without `--access-log` no access line."""
    from qveil.client import UnauthenticatedError as Unauth

    bundle = make_bundle(tmp_path / "b", seed=5)
    tokens = make_tokens(tmp_path / "tokens.toml")
    common = ("--tokens-file", str(tokens.path), "--log-format", "json")
    for access in (True, False):
        sp = start_server(
            tmp_path,
            bundle,
            *common,
            *(["--access-log"] if access else []),
            store=f"sqlite:///{tmp_path / f'{access}.sqlite'}",
            name=f"access-{access}",
        )
        try:
            with ValueClient(sp.target, token=tokens.query) as c:
                c.values([0.25, 0.5, 0.75])
            with ValueClient(sp.target, token="not-a-token") as bad, pytest.raises(Unauth):
                bad.values([0.5])
        finally:
            assert sp.terminate() == 0, sp.output()
        lines = [json.loads(x) for x in sp.output().splitlines() if x.startswith("{")]
        got = [x for x in lines if x["logger"] == "qveil.access"]
        refused = [x for x in lines if x["logger"] == "qveil.auth"]
        assert refused and refused[0]["code"] == "UNAUTHENTICATED", lines
        assert "not-a-token" not in sp.output()
        if not access:
            assert not got, got
            continue
        (ok,) = [x for x in got if x["method"] == "GetValues" and x["code"] == "OK"]
        assert ok["protocol"] == "grpc" and ok["states"] == 3 and ok["ms"] >= 0
        assert ok["release"] == load_bundle(bundle).bundle_id
        assert ok["caller"].startswith("token:"), ok
        assert "0.25" not in json.dumps(ok)


# ----------------------------------------------------------------------------- foreign clients
def test_reflection_only_client(env: Env) -> None:
    """A client nobody here wrote: discovers the API through server reflection and speaks it
    with protobuf dynamic messages (no generated qveil stubs)."""
    from google.protobuf import descriptor_pool, message_factory
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    with grpc.insecure_channel(env.target) as ch:
        db = ProtoReflectionDescriptorDatabase(ch)
        assert "qveil.v1.ValueService" in db.get_services()
        pool = descriptor_pool.DescriptorPool(db)
        svc = pool.FindServiceByName("qveil.v1.ValueService")
        method = svc.methods_by_name["GetValues"]
        req_cls = message_factory.GetMessageClass(method.input_type)
        resp_cls = message_factory.GetMessageClass(method.output_type)
        call = ch.unary_unary(
            f"/{svc.full_name}/{method.name}",
            request_serializer=req_cls.SerializeToString,
            response_deserializer=resp_cls.FromString,
        )
        req = req_cls()
        req.states.extend([0.3, 1.5])
        resp = call(req, metadata=(("authorization", f"Bearer {env.tokens.query}"),), timeout=10)
        got = np.array(resp.values).reshape(2, len(resp.actions))
    with ValueClient(env.target, token=env.tokens.query) as c:
        np.testing.assert_array_equal(got, c.values([0.3, 1.5]))
    assert health_status(env.target) == "SERVING"
    for name in ("qveil.v1.ValueService", "qveil.v1.AdminService", "qveil.v1.AuditService"):
        assert health_status(env.target, name) == "SERVING"


# ----------------------------------------------------------------------------- restart
def test_same_answers_after_restart(env: Env) -> None:
    states = np.linspace(-1, 2, 33)
    with ValueClient(env.target, token=env.tokens.query) as c:
        before = c.values(states)
        card = c.release()
    assert env.server is not None and env.server.terminate() == 0
    env.start()
    with ValueClient(env.target, token=env.tokens.query) as c:
        np.testing.assert_array_equal(c.values(states), before)
        assert c.release().card == card.card
    with pytest.raises(RpcError):
        with ValueClient("127.0.0.1:1", timeout=0.5) as dead:
            dead.values([0.1])


# ----------------------------------------------------------------------------- the answer log
def test_a_graceful_stop_leaves_every_answer_in_the_log_once(tmp_path: Path) -> None:
    """What a server answered is in its store once it has stopped (SIGTERM: the answer log
    is flushed on close): every answered (action, state) once, a state answered twice (in one
    call, in two calls, by two clients, for a subset of actions first) logged once, each
    logged value the key's noise at the state's grid point; `qveil audit --bundle` recomputes
    every logged value from the key and passes."""
    bundle = make_bundle(tmp_path / "b", seed=4)
    b = load_bundle(bundle)
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    xs = np.linspace(-1.0, 2.0, 64)
    sp = start_server(tmp_path, bundle, store=url)
    try:
        with ValueClient(sp.target) as c1, ValueClient(sp.target) as c2:
            c1.values(xs[:40], [1])  # action 1 only, first
            c1.values(np.concatenate([xs[:40], xs[:5]]))  # asked again, with repeats
            c2.values(xs[::-1])  # another client: all 64, 40 of them answered before
            for x in xs[10:20]:
                c2.best_actions([x])
    finally:
        assert sp.terminate() == 0, sp.output()
    logged = logged_points(url, b.bundle_id)
    unit = grid_states(b, xs)[:, 0]
    assert {p: sorted(v) for p, v in logged.items()} == {a: sorted(unit) for a in range(3)}
    from qveil.server.store import open_store

    with open_store(url, create=False) as st:
        assert st.count_points(b.bundle_id) == 64 * 3  # once each, not once per answer
    for a in range(3):
        idx = np.rint(unit * 2.0**32).astype(np.uint64)
        want = b.noise_paths.path_values(a, idx)
        assert np.array([logged[a][x] for x in unit]).tobytes() == want.tobytes()
    r = subprocess.run(
        [QVEIL, "audit", "--store", url, "--bundle", str(bundle), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    (rel,) = json.loads(r.stdout)["releases"]
    assert rel["key_checked"] and all(a["key_checked"] for a in rel["actions"])


def _wait_metric(sp: ServerProcess, name: str, want: float, timeout: float = 30.0) -> str:
    import time

    deadline = time.monotonic() + timeout
    while True:
        text = _metrics(sp)
        if _metric(text, name) == want:
            return text
        assert time.monotonic() < deadline, (name, want, text)
        time.sleep(0.05)


def test_max_stored_points_stops_the_log_never_the_answers(tmp_path: Path) -> None:
    """``--max-stored-points 10``: the log writes while the release holds fewer than 10
    points (a write may pass the cap: 9 + 6 = 15), then stops logging it, counts what it did
    not log and says so once; every call is answered all along, with the key's values."""
    bundle = make_bundle(tmp_path / "b", seed=7)
    b = load_bundle(bundle)
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    sp = start_server(
        tmp_path, bundle, "--max-stored-points", "10", "--metrics-port", "0", store=url
    )
    got = []
    try:
        with ValueClient(sp.target) as c:
            asks = [[0.1, 0.2, 0.3], [0.4, 0.5], [0.6, 0.7, 0.8, 0.9], [1.0, 1.1]]
            got.append(c.values(asks[0]))
            _wait_metric(sp, "qveil_logged_points_total", 9)  # 9 < 10: logged
            got.append(c.values(asks[1]))
            _wait_metric(sp, "qveil_logged_points_total", 15)  # 9 < 10 before: logged
            got.append(c.values(asks[2]))
            _wait_metric(sp, "qveil_log_unlogged_points_total", 12)  # 15 >= 10: not logged
            got.append(c.values(asks[3]))
            text = _wait_metric(sp, "qveil_log_unlogged_points_total", 18)
            assert _metric(text, "qveil_logged_points_total") == 15
            assert _metric(text, "qveil_max_stored_points") == 10
            assert _metric(text, "qveil_states_answered_total") == 11 * 3
    finally:
        assert sp.terminate() == 0, sp.output()
    for states, vals in zip(asks, got, strict=True):
        assert vals.tobytes() == served_values(b, states).tobytes()
    logged = logged_points(url, b.bundle_id)
    assert {p: sorted(v) for p, v in logged.items()} == {
        a: sorted(grid_states(b, [0.1, 0.2, 0.3, 0.4, 0.5])[:, 0]) for a in range(3)
    }
    assert sp.output().count("the cap") == 1, sp.output()
