"""The append-log schema (migration 0005): no unique (release, action, coordinate, x) in the
database, and still one row per state.

What replaces the index, checked on real SQLite files and the real PostgreSQL:

* a writer whose copy missed a row collides with it on the primary key (its seqs start right
  after its high-water mark), sees in the confirm re-select that the row is not its own,
  rolls back and retries after a full re-read: the missed state is not logged again, the
  other state of the call is (a store that trusted its stale copy would log the missed state
  a second time, and the re-read would find two rows);
* two writers on one new state, from separate processes and from two store objects on one
  PostgreSQL that share no lock but the database's, log it once, and exactly one of them
  counts it as written;
* a row for an already logged state written behind the store's back (a valid next seq and
  even a valid chain link) is refused when the path is loaded (IntegrityError naming seqs,
  never a value), nothing more is logged to the path, the other paths are logged, ``verify``
  reports it; a running server keeps answering the same values (answers never come from the
  log) and a server started on the store refuses the release.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from server_helpers import InProcessServer, make_bundle
from store_helpers import RID, keyed_paths, log_values, logged, make_release, path_values
from store_worker import forking, run_forked, same_x_writer

from qveil.answer import released_values
from qveil.bundle import load_bundle
from qveil.client import ValueClient
from qveil.errors import IntegrityError
from qveil.server.store import open_store
from qveil.server.store.base import Retry
from qveil.server.store.integrity import ChainHasher


def _url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'store.sqlite'}"
    return str(request.getfixturevalue("pg_url"))


KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _insert_behind(url: str, action: int, seq: int, x: float, g: float, h: str) -> None:
    """One row written by another connection, not through the store."""
    eng = sa.create_engine(url)
    try:
        with eng.begin() as c:
            c.execute(
                sa.text(
                    "INSERT INTO noise_points (release_id, action, coordinate, seq, x, g, "
                    "created_at, hash) VALUES (:r, :a, 0, :s, :x, :g, 0.0, :h)"
                ),
                {"r": RID, "a": action, "s": seq, "x": x, "g": g, "h": h},
            )
    finally:
        eng.dispose()


def _duplicate_with_valid_link(url: str, s: object, action: int, x: float, g: float) -> int:
    """Append a second row for the logged state ``x``: the next seq and a valid chain link
    (what someone who can compute the chain would write). Returns its seq."""
    pts = list(s.iter_points(RID, action))  # type: ignore[attr-defined]
    seq = pts[-1].seq + 1
    h = ChainHasher().link(bytes.fromhex(pts[-1].hash), seq, x, g).hex()
    _insert_behind(url, action, seq, x, g, h)
    return seq


@pytest.mark.parametrize("kind", KINDS)
def test_the_primary_key_stops_a_row_at_a_taken_seq(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The backstop itself: rows at a taken seq are not written, ``confirm`` says so (the
    SQLite row count, PostgreSQL RETURNING, then the re-select), and the rollback removes the
    batch's other rows too."""
    url = _url(kind, tmp_path, request)
    with open_store(url) as s:
        kp = keyed_paths(make_release(s))
        log_values(s, kp, RID, [0], [np.linspace(0, 1, 5)])
        before = [(p.seq, p.x, p.g, p.hash) for p in s.iter_points(RID, 0)]
        taken = (RID, 0, 5, 0.123, 0.5, 0.0, "a" * 64)  # seq 5 holds x = 1.0
        free = (RID, 0, 6, 0.456, 0.5, 0.0, "b" * 64)
        for rows in ([taken], [taken, free]):
            with pytest.raises(Retry):
                with s._db_write_txn([(RID, 0)]) as tx:
                    tx.insert(rows)
                    if not tx.confirm(rows):
                        raise Retry("row not ours")
        assert [(p.seq, p.x, p.g, p.hash) for p in s.iter_points(RID, 0)] == before
        assert s.verify(RID).ok


def test_a_writer_that_missed_a_row_collides_on_seq_and_retries(tmp_path: Path) -> None:
    """Two store objects on one SQLite file. B logs x_new; A's copy misses it, and A is made
    to believe its copy is complete (its version token forged to the current one: a bug in
    the catch-up). A then logs x_new and another state: its first attempt writes both at
    seqs 21, 22; seq 21 is B's row, so the insert is skipped there, the confirm fails, the
    transaction rolls back, and the retry re-reads: x_new is not logged again, the other
    state is logged at seq 22. One row per state, chains verify."""
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    units = np.linspace(0, 1, 20)
    with open_store(url) as a, open_store(url) as b:
        kp = keyed_paths(make_release(a))
        log_values(a, kp, RID, [0], [units])
        (x_new,), _g, written, _m = log_values(b, kp, RID, [0], [[0.512]])  # seq 21
        assert written == 1
        st = a.paths._states[(RID, 0)]
        assert st.hw == 20 and float(x_new[0]) not in st.values
        st.version = (a._wepoch, a._writer_scalar("PRAGMA data_version"))  # the forged token
        xs, gs, written, mism = log_values(a, kp, RID, [0], [[0.512, 0.513]])
        assert (written, mism) == (1, 0)
        assert a.committer.points_logged == 20 + 1
        pts = list(a.iter_points(RID, 0))
        assert [(p.seq, p.x) for p in pts[-2:]] == [(21, xs[0][0]), (22, xs[0][1])]
        assert logged(a, RID, 0) == logged(b, RID, 0)  # one row per state
        assert len(pts) == 22 and a.verify(RID).ok


@pytest.mark.parametrize("kind", KINDS)
def test_same_new_state_from_two_processes(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two processes (each its own store and connections) log the same 60 new states, one per
    call, in the same order, starting together: every call races the other process on the
    same new state. One row per state, and each state counted as written by exactly one of
    them."""
    url = _url(kind, tmp_path, request)
    with open_store(url) as s:
        kp = keyed_paths(make_release(s, n_actions=1))
    xs = np.random.default_rng(4).uniform(size=60).tolist()
    start = time.time() + 0.3
    logs = [tmp_path / f"p{i}.jsonl" for i in range(2)]
    with forking():
        pids = [run_forked(same_x_writer, url, RID, 0, xs, str(logs[i]), start) for i in range(2)]
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    answers = [[json.loads(line) for line in log.read_text().splitlines()] for log in logs]
    want_x, want_g = path_values(kp, 0, xs)
    for ans in answers:
        assert [d["x"] for d in ans] == want_x.tolist()
        assert [d["g"] for d in ans] == want_g.tolist()
    assert [d0["w"] + d1["w"] for d0, d1 in zip(*answers, strict=True)] == [1] * 60
    with open_store(url) as s:
        assert logged(s, RID, 0) == dict(zip(want_x.tolist(), want_g.tolist(), strict=True))
        assert s.count_points(RID, 0) == 60
        assert s.verify(RID).ok


@pytest.mark.postgres
def test_two_store_objects_on_one_postgres_share_only_the_advisory_lock(pg_url: str) -> None:
    """Two SQLStore objects whose identities differ (so they share no process-wide lock) on
    one PostgreSQL database, 6 threads each; every round all 12 threads log the same new
    state and one of 3 others: one row per state, every row written by exactly one of the
    two objects (their written counts add up to the rows), chains verify."""
    a_url, b_url = (f"{pg_url}?application_name=qveil_{n}" for n in "ab")
    handed: dict[float, float] = {}
    errors: list[BaseException] = []
    guard = threading.Lock()
    with open_store(a_url) as a, open_store(b_url) as b:
        assert a._identity != b._identity  # type: ignore[attr-defined]
        kp = keyed_paths(make_release(a, n_actions=1))
        rounds = np.sort(np.random.default_rng(7).uniform(size=(25, 4)), axis=1)
        barrier = threading.Barrier(12)

        def work(i: int) -> None:
            s = a if i % 2 else b
            rng = np.random.default_rng(100 + i)
            try:
                for r in rounds:
                    units = [float(r[0]), float(r[1 + int(rng.integers(0, 3))])]
                    barrier.wait()
                    (xs,), (gs,), _w, mism = log_values(s, kp, RID, [0], [units])
                    assert mism == 0
                    with guard:
                        handed.update(zip(xs.tolist(), gs.tolist(), strict=True))
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
                barrier.abort()

        ts = [threading.Thread(target=work, args=(i,)) for i in range(12)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errors, errors
        assert logged(a, RID, 0) == handed
        assert (
            a.committer.points_logged + b.committer.points_logged
            == a.count_points(RID, 0)
            == len(handed)
        )
        assert a.verify(RID).ok


@pytest.mark.parametrize("kind", KINDS)
def test_state_logged_twice_is_refused_and_reported(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = _url(kind, tmp_path, request)
    units = np.linspace(0, 1, 20)
    with open_store(url) as s:
        kp = keyed_paths(make_release(s))
        xs, gs, _w, _m = log_values(s, kp, RID, [0, 1], [units, units])
        seq = _duplicate_with_valid_link(url, s, 0, float(xs[0][7]), 0.25)
        assert seq == 21
        # this store has path 0 loaded: its next catch-up finds the row and refuses
        with pytest.raises(IntegrityError, match="the row at seq 21 repeats a stored state"):
            log_values(s, kp, RID, [0], [[0.123]])
        with pytest.raises(IntegrityError, match="stores one state twice") as exc:
            log_values(s, kp, RID, [0], [units[:3]])  # logged states of the refused path too
        assert "0.25" not in str(exc.value) and repr(float(gs[0][7])) not in str(exc.value)
        with pytest.raises(IntegrityError, match="stores one state twice"):
            log_values(s, kp, RID, [0, 1], [[0.5], [0.5]])
        # the other path is logged as before
        assert log_values(s, kp, RID, [1], [units])[2:] == (0, 0)
        assert log_values(s, kp, RID, [1], [[0.123]])[2:] == (1, 0)
        assert (s.count_points(RID, 0), s.count_points(RID, 1)) == (21, 21)
    with open_store(url) as t:  # a fresh process: loading the path refuses it
        with pytest.raises(IntegrityError, match="seq 21 repeats a stored state"):
            log_values(t, kp, RID, [0], [units[:1]])
        assert log_values(t, kp, RID, [1], [units])[2:] == (0, 0)
        rep = t.verify(RID)
        assert not rep.ok and rep.actions[1].ok
        a0 = rep.actions[0]
        assert a0.first_broken is None and a0.gaps == ()  # the link itself is valid
        assert a0.problems == (f"seq 21: state {float(xs[0][7])!r} stored twice (first at seq 8)",)
        assert (t.count_points(RID, 0), t.count_points(RID, 1)) == (21, 21)  # nothing written


def test_server_answers_on_and_refuses_the_release_on_restart(tmp_path: Path) -> None:
    """A running server whose log gets a second row for a state keeps answering the same
    values, known states and new ones (answers never come from the log); its answer log
    writes nothing more to the refused path and goes on logging the others. A server
    started on the store refuses the release at verification."""
    bundle = make_bundle(tmp_path / "b", seed=3)
    b = load_bundle(bundle)
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    states = np.linspace(-1.0, 2.0, 12)
    new = np.array([0.321, 0.654])
    with InProcessServer(bundle, url) as srv:
        with ValueClient(srv.target) as c:
            known = c.values(states)
            assert srv.answers.flush()
            rid = srv.services.ctx.holder.peek().release_id  # type: ignore[union-attr]
            pts = list(srv.store.iter_points(rid, 1))
            seq = pts[-1].seq + 1
            h = ChainHasher().link(bytes.fromhex(pts[-1].hash), seq, pts[3].x, 0.0).hex()
            eng = sa.create_engine(url)
            with eng.begin() as conn:
                conn.execute(
                    sa.text(
                        "INSERT INTO noise_points (release_id, action, coordinate, seq, x, g, "
                        "created_at, hash) VALUES (:r, 1, 0, :s, :x, 0.0, 0.0, :h)"
                    ),
                    {"r": rid, "s": seq, "x": pts[3].x, "h": h},
                )
            eng.dispose()
            counts = [srv.store.count_points(rid, a) for a in range(b.n_actions)]
            got = c.values(new)  # new states: the log finds the row while logging them
            assert np.array_equal(c.values(states), known)
            assert np.array_equal(got, released_values(b, b.box.to_unit(new)))
            assert srv.answers.flush()
            after = [srv.store.count_points(rid, a) for a in range(b.n_actions)]
            assert after[1] == counts[1] == seq  # nothing more on the refused path
            assert all(after[a] == counts[a] + len(new) for a in (0, 2)), (counts, after)
            assert srv.answers.unlogged == len(new) + len(states)  # path 1's, counted
    with InProcessServer(bundle, url, start=False) as srv:
        with pytest.raises(IntegrityError, match="fails verification"):
            srv.services.releases.start(bundle)
