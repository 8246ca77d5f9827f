"""Serving a release of d > 1 state coordinates through the one serving path:
a CartPole-v1 kernel fqi release (d = 4, 2 actions, configs/cartpole-private.toml) trained by
the real CLI, served by the real gRPC server on 127.0.0.1 port 0 over a real SQLite file (and
PostgreSQL for the store-level checks), queried with [n, 4] states through the SDK and the
``qveil query`` CLI.

What is checked: the noise of a state is sum_j g_{a,j}(x_j) of d keyed 1-D paths per action
(computed here from the bundle's key, and the same as the answer log's rows, keyed
(release, action, coordinate, x_j)); a repeated state gets the same bits, across a server
restart; a state sharing coordinates with a logged one logs only its new coordinates'
points; a wrong d is INVALID_ARGUMENT with nothing answered or logged; the chains verify,
the audit recomputes every logged value from the key and passes, and export/import
round-trips the coordinates."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from config_helpers import CARTPOLE_BETAS, CARTPOLE_CONFIG
from server_helpers import (
    InProcessServer,
    fresh_bundle,
    make_bundle,
    qveil,
)

from qveil.bundle import load_bundle
from qveil.client import AsyncValueClient, InvalidArgumentError, ValueClient
from qveil.server.store import open_store
from qveil.server.store.export import export_release, import_release
from qveil.v1 import value_service_pb2 as value_pb

CONFIG, BETAS = CARTPOLE_CONFIG, CARTPOLE_BETAS
D, M = 4, 2


@pytest.fixture(scope="module")
def template(cartpole_release: tuple[Path, str]) -> Path:
    """A CartPole kernel bundle, never served itself (each test serves a copy charged in its
    own registry)."""
    return cartpole_release[0]


@pytest.fixture
def served(template: Path, tmp_path: Path) -> Iterator[tuple[InProcessServer, Path, str]]:
    bundle = fresh_bundle(template, tmp_path / "bundle")
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    with InProcessServer(bundle, url) as s:
        yield s, bundle, url


def _rows(url: str, s: InProcessServer | None = None) -> list[tuple[int, int, float]]:
    """The answer log's rows (action, coordinate, x), once ``s``'s log has written what it
    answered."""
    if s is not None:
        assert s.answers.flush(30)
    eng = sa.create_engine(url)
    try:
        with eng.connect() as c:
            return [
                tuple(r)  # type: ignore[misc]
                for r in c.exec_driver_sql(
                    "SELECT action, coordinate, x FROM noise_points "
                    "ORDER BY action, coordinate, seq"
                )
            ]
    finally:
        eng.dispose()


STATES = np.array(
    [
        [0.0, 0.1, 0.0, 0.2],
        [0.05, 0.1, 0.01, 0.2],
        [9.0, -9.0, 9.0, 9.0],  # clipped into the box (public post-processing)
    ]
)


def test_values_are_mean_plus_additive_keyed_noise(
    served: tuple[InProcessServer, Path, str],
) -> None:
    """value(s, a) = grid_round(Q(x, a) + sum_j g_{a,j}(x_j)) at the snapped unit state x:
    bit for bit what the bundle's key gives (qveil.answer.released_values), and the same
    sum recomputed from the answer log's rows; a wrong implementation (1-D noise, one path
    per action, a different coordinate order) differs by O(sigma)."""
    from server_helpers import grid_states, served_values

    s, bundle, url = served
    b = load_bundle(bundle)
    with ValueClient(s.target) as c:
        rel = c.release()
        assert rel.dims == D and rel.betas == tuple(BETAS)
        assert rel.state_intervals == tuple(tuple(iv) for iv in b.card["state_intervals"])
        v = c.get_values(STATES)
    assert v.values.shape == (3, M)
    assert v.values.tobytes() == served_values(b, STATES).tobytes()
    x = grid_states(b, STATES)
    assert s.answers.flush(30)
    stored = {(a, j, xx): g for a, j, xx, g in _points(s, rel.release_id)}
    assert len(stored) == M * sum(len(set(x[:, j].tolist())) for j in range(D))
    q = b.q_values_unit(x)
    for i in range(3):
        for a in range(M):
            g = 0.0
            for j in range(D):
                g += stored[(a, j, float(x[i, j]))]
            assert abs(v.values[i, a] - (q[i, a] + g)) <= v.value_grid
    # row 2 was clipped: the same as the box corner it clips to
    with ValueClient(s.target) as c:
        corner = c.get_values([[0.3, -1.5, 0.2095, 2.0]]).values
    np.testing.assert_array_equal(corner[0], v.values[2])


def _points(s: InProcessServer, rid: str) -> list[tuple[int, int, float, float]]:
    rec = s.store.releases.get_release(rid)
    out = []
    for p in range(rec.n_paths):
        a, j = rec.split(p)
        out += [(a, j, pt.x, pt.g) for pt in s.store.iter_points(rid, p)]
    return out


def test_repeats_are_bit_identical_across_a_restart(template: Path, tmp_path: Path) -> None:
    bundle = fresh_bundle(template, tmp_path / "bundle")
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    with InProcessServer(bundle, url) as s, ValueClient(s.target) as c:
        first = c.get_values(STATES).values
        best = c.get_best_actions(STATES)
        again = c.get_values(STATES[::-1]).values[::-1]
        n = len(_rows(url, s))
    np.testing.assert_array_equal(first, again)
    with InProcessServer(bundle, url) as s, ValueClient(s.target) as c:  # restart
        after = c.get_values(STATES).values
        best2 = c.get_best_actions(STATES)
    assert first.tobytes() == after.tobytes()
    np.testing.assert_array_equal(best.actions, best2.actions)
    np.testing.assert_array_equal(best.values, best2.values)
    assert len(_rows(url)) == n  # nothing new was logged


def test_shared_coordinates_log_only_the_new_ones(
    served: tuple[InProcessServer, Path, str],
) -> None:
    s, _bundle, url = served
    with ValueClient(s.target) as c:
        c.get_values([[0.0, 0.1, 0.0, 0.2]])
        assert len(_rows(url, s)) == M * D  # one point per (action, coordinate)
        c.get_values([[0.0, 0.1, 0.0, 0.7]])  # shares 3 coordinates
        rows = _rows(url, s)
        assert len(rows) == M * (D + 1)
        new = [r for r in rows if r[1] == 3]
        assert sorted({r[2] for r in new}) == pytest.approx([0.55, 0.675])
        # a batch with repeated coordinate values logs each value once per path
        c.get_values([[0.1, 0.1, 0.0, 0.2], [0.1, 0.2, 0.0, 0.2], [0.1, 0.2, 0.0, 0.2]])
        assert len(_rows(url, s)) == M * (D + 1) + M * 2


def test_wrong_dims_is_invalid_argument_and_logs_nothing(
    served: tuple[InProcessServer, Path, str],
) -> None:
    s, _bundle, url = served
    with ValueClient(s.target) as c:
        for bad in (np.zeros((2, 3)), np.zeros((1, 5)), [0.1, 0.2], 0.3):
            with pytest.raises(InvalidArgumentError, match="coordinate"):
                c.get_values(bad)
            with pytest.raises(InvalidArgumentError, match="coordinate"):
                c.get_best_actions(bad)
        with pytest.raises(InvalidArgumentError, match="finite"):
            c.get_values([[0.0, np.nan, 0.0, 0.0]])
        # a matrix whose values are not a multiple of dims, and states + matrix at once
        raw = c._stub  # the generated stub: requests the SDK would not build
        for req in (
            value_pb.GetValuesRequest(state_matrix=value_pb.StateMatrix(values=[0.1] * 7, dims=4)),
            value_pb.GetValuesRequest(
                states=[0.1], state_matrix=value_pb.StateMatrix(values=[0.1] * 4, dims=4)
            ),
            value_pb.GetValuesRequest(state_matrix=value_pb.StateMatrix(values=[0.1] * 4)),
        ):
            with pytest.raises(InvalidArgumentError):
                c._call(raw.GetValues, req, timeout=10)
    assert _rows(url, s) == []
    assert s.services.ctx.metrics.states_answered == 0


def test_integrity_audit_and_export_import(template: Path, tmp_path: Path) -> None:
    """Integrity, export/import and the audit of a d = 4 release's 8 logged paths: every
    logged value recomputed from the release's key (the check that decides: a log written
    by anything else fails it), and the law test of each path.

    The release's key comes from OS entropy (``qveil train`` in fqi mode takes no seed), so
    the law test runs at level 2e-7 (Bonferroni over 4 tests: a correct path fails with
    probability < 1e-6); tests/unit/server/test_server_governance_audit.py tests the law test's
    power."""
    bundle = fresh_bundle(template, tmp_path / "bundle")
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    with InProcessServer(bundle, url) as s:
        _audit_and_export(s, tmp_path, load_bundle(bundle))


def _audit_and_export(s: InProcessServer, tmp_path: Path, bundle: object) -> None:
    with ValueClient(s.target) as c:
        rid = c.release().release_id
        rng = np.random.default_rng(3)
        box = np.asarray(c.release().state_intervals)
        c.get_values(rng.uniform(box[:, 0], box[:, 1], size=(50, D)))  # 50 new values a path
    assert s.answers.flush(30)
    rep = s.store.verify(rid)
    assert rep.ok and len(rep.actions) == M * D
    out = tmp_path / "export.jsonl"
    n = export_release(s.store, rid, out)
    assert n == M * D * 50
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[0]["dims"] == D and lines[0]["betas"] == BETAS
    assert {(p["action"], p["coordinate"]) for p in lines[1:-1]} == {
        (a, j) for a in range(M) for j in range(D)
    }
    with open_store(f"sqlite:///{tmp_path / 'other.sqlite'}") as other:
        rec = import_release(other, out)
        assert rec.dims == D and rec.betas == tuple(BETAS)
        for p in range(rec.n_paths):
            assert [(q.x, q.g) for q in other.iter_points(rid, p)] == [
                (q.x, q.g) for q in s.store.iter_points(rid, p)
            ]
    from qveil.server.governance.admin_db import admin_db_for
    from qveil.server.governance.audit import audit_store

    keys = {rid: bundle.noise_paths}  # type: ignore[attr-defined]
    report = audit_store(s.store, admin_db_for(s.store), release_id=rid, keys=keys, level=2e-7)
    r = report.releases[0]
    assert len(r.actions) == M * D and r.passed, (r.problems, [a.problems for a in r.actions])
    assert r.key_checked and all(a.key_checked and a.tested for a in r.actions)


def test_cli_query_takes_one_state_of_d_coordinates(
    served: tuple[InProcessServer, Path, str],
) -> None:
    s, _bundle, url = served
    r = qveil("query", "--target", s.target, "--state", "0.1,0.2,0.03,0.4", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["states"] == [[0.1, 0.2, 0.03, 0.4]] and len(out["values"]) == 1
    with ValueClient(s.target) as c:
        v = c.get_values([[0.1, 0.2, 0.03, 0.4]]).values
    assert out["values"] == v.tolist()
    r = qveil("query", "--target", s.target, "--best", "--state", "0.1,0.2,0.03,0.4")
    assert r.returncode == 0 and "0.1,0.2,0.03,0.4" in r.stdout, r.stdout
    r = qveil("query", "--target", s.target, "--state", "0.1,0.2")
    assert r.returncode != 0 and "4" in r.stderr and "coordinate" in r.stderr, r.stderr
    assert len(_rows(url, s)) == M * D


def test_sdk_reads_a_flat_list_of_d_numbers_as_one_state(
    served: tuple[InProcessServer, Path, str], tmp_path: Path
) -> None:
    """The SDK learns the release's dims: on a d = 4 release a flat list of 4 numbers is one
    state (sync and async clients, values and best actions, also as a new client's first
    call), [n, 4] arrays are unchanged, any other flat length is still the server's
    INVALID_ARGUMENT; on a 1-D release a flat list stays n states."""
    s, _bundle, _url = served
    flat = [0.0, 0.1, 0.0, 0.2]
    with ValueClient(s.target) as c:  # the flat list first: dims learnt on this call
        one = c.values(flat)
        best = c.best_actions(flat)
    with ValueClient(s.target) as c:
        rows = c.values(STATES)
        assert rows.shape == (3, M)
        np.testing.assert_array_equal(c.values([flat]), one)
        np.testing.assert_array_equal(c.best_actions([flat]), best)
        np.testing.assert_array_equal(c.values(np.asarray(STATES[0])), rows[:1])
        with pytest.raises(InvalidArgumentError, match="coordinate"):
            c.values(flat * 2)  # 8 numbers: not one state of this release
    assert one.shape == (1, M) and best.shape == (1,)

    async def flat_async() -> tuple[np.ndarray, np.ndarray]:
        async with AsyncValueClient(s.target) as ac:
            return await ac.values(flat), await ac.best_actions(flat)

    avals, abest = asyncio.run(flat_async())
    np.testing.assert_array_equal(avals, one)
    np.testing.assert_array_equal(abest, best)

    one_d = make_bundle(tmp_path / "b1", actions=3)
    with InProcessServer(one_d, f"sqlite:///{tmp_path / 'one.sqlite'}") as s1:
        with ValueClient(s1.target) as c:
            four = c.values([0.1, 0.2, 0.3, 0.4])
            assert four.shape == (4, 3)
            np.testing.assert_array_equal(four, c.values([[0.1], [0.2], [0.3], [0.4]]))
            assert c.best_actions([0.1, 0.2, 0.3, 0.4]).shape == (4,)


@pytest.mark.postgres
def test_postgres_store_keys_paths_by_coordinate(pg_url: str) -> None:
    """The log level on PostgreSQL: d paths per action, each with its beta; rows keyed by
    (action, coordinate); a logged coordinate value is logged once, and a value that differs
    from the logged one is counted, not written."""
    with open_store(pg_url) as st:
        st.releases.create_release(
            release_id="pg-md",
            fingerprint="f" * 64,
            sigma=1.0,
            beta=2.0,
            interval=(0.0, 1.0),
            n_actions=2,
            betas=[2.0, 3.0, 4.0],
        )
        rec = st.releases.get_release("pg-md")
        assert rec.dims == 3 and rec.n_paths == 6 and rec.path_beta(5) == 4.0
        first = st.record_paths("pg-md", [0, 4], [[0.1, 0.2], [0.1]], [[1.5, -0.5], [0.25]])
        assert first == (3, 0)
        xs, gs = [[0.1], [0.2, 0.1, 0.3]], [[0.25], [-0.5, 9.0, 2.0]]
        again = st.record_paths("pg-md", [4, 0], xs, gs)
        assert again == (1, 1)  # 0.3 is new; 0.1 of path 0 was logged as 1.5, not 9.0
        assert st.count_points("pg-md") == 4 and st.count_points("pg-md", 4) == 1
        assert [(p.x, p.g) for p in st.iter_points("pg-md", 0)] == [
            (0.1, 1.5),
            (0.2, -0.5),
            (0.3, 2.0),
        ]
        assert st.verify("pg-md").ok
    eng = sa.create_engine(pg_url)
    with eng.connect() as c:
        rows = c.exec_driver_sql(
            "SELECT action, coordinate FROM noise_points WHERE release_id = 'pg-md' "
            "ORDER BY action, coordinate"
        ).all()
    eng.dispose()
    assert [tuple(r) for r in rows] == [(0, 0), (0, 0), (0, 0), (1, 1)]


def test_open_inference_protocol_takes_state_of_d_coordinates(
    served: tuple[InProcessServer, Path, str],
) -> None:
    """The v2 binding (same handlers): STATE FP64 [n, 4] answers what GetValues answers, bit
    for bit; STATE [n, 1] is INVALID_ARGUMENT with nothing logged."""
    import grpc

    from qveil.oip import grpc_predict_v2_pb2 as pb
    from qveil.oip import grpc_predict_v2_pb2_grpc as pb_grpc

    s, _bundle, url = served
    xs = STATES[:2]
    with grpc.insecure_channel(s.target) as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        meta = stub.ModelMetadata(pb.ModelMetadataRequest(name="qveil"))
        assert list(meta.inputs[0].shape) == [-1, D]
        bad = pb.ModelInferRequest.InferInputTensor(name="STATE", datatype="FP64", shape=[4, 1])
        bad.contents.fp64_contents.extend([0.1] * 4)
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(pb.ModelInferRequest(model_name="qveil", inputs=[bad]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert _rows(url, s) == []
        t = pb.ModelInferRequest.InferInputTensor(name="STATE", datatype="FP64", shape=[2, D])
        t.contents.fp64_contents.extend(xs.reshape(-1).tolist())
        resp = stub.ModelInfer(pb.ModelInferRequest(model_name="qveil", inputs=[t]))
        q = np.array(resp.outputs[0].contents.fp64_contents).reshape(2, -1)
    with ValueClient(s.target) as c:
        assert q.tobytes() == c.values(xs).tobytes()


def test_audit_service_streams_each_coordinate_path(template: Path, tmp_path: Path) -> None:
    """AuditService for a d > 1 release: "action" names the path action * d + coordinate;
    its points map back into that coordinate's interval; GetStats counts every coordinate."""
    from server_helpers import make_tokens

    from qveil.client import AdminClient, AuditClient

    tok = make_tokens(tmp_path / "tokens.toml")
    bundle = fresh_bundle(template, tmp_path / "bundle")
    b = load_bundle(bundle)
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    with InProcessServer(bundle, url, tokens=tok.path) as s:
        with ValueClient(s.target, token=tok.query) as c:
            c.get_values(STATES[:2])
        assert s.answers.flush(30)
        with AuditClient(s.target, token=tok.auditor) as au:
            for p in range(M * D):
                j = p % D
                pts = list(au.noise_points(p))
                lo, hi = b.card["state_intervals"][j]
                want = sorted({float(v) for v in np.clip(STATES[:2, j], lo, hi)})
                assert sorted(q.state for q in pts) == pytest.approx(want)
            with pytest.raises(InvalidArgumentError):
                list(au.noise_points(M * D))
            assert au.verify(action=M * D - 1).ok
        with AdminClient(s.target, token=tok.admin) as ad:
            stats = ad.stats()
    # STATES[:2] share coordinates 1 and 3: 2 + 1 + 2 + 1 new values per action
    assert stats.stored_points == {a: 6 for a in range(M)}
