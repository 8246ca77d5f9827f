"""The append-log schema (migration 0005): no unique (release, action, coordinate, x) in the
database, and still one value per state.

What replaces the index, checked on real SQLite files and the real PostgreSQL:

* a writer whose copy missed a row collides with it on the primary key (its seqs start right
  after its high-water mark), sees in the confirm re-select that the row is not its own,
  rolls back and retries after a full re-read: the missed state is answered with the stored
  value and a new neighbour is drawn conditioned on it (a store that trusted its stale copy
  would store the missed state a second time, and the re-read would find two rows);
* two writers on one new state, from separate processes and from two store objects on one
  PostgreSQL that share no lock but the database's, store one value and all answer it;
* a row for an already stored state written behind the store's back (a valid next seq and
  even a valid chain link) is refused when the path is loaded (IntegrityError naming seqs,
  never a value), the path is then neither sampled nor answered, the other paths are, nothing
  is written, ``verify`` and ``qveil audit`` report it, and a server refuses to start on it.
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
from store_helpers import RID, check_seen, make_release
from store_worker import run_forked, same_x_writer

from qveil.client import DataLossError, ValueClient
from qveil.errors import IntegrityError
from qveil.server.store import InsertRecord, open_store
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
    """Append a second row for the stored state ``x``: the next seq and a valid chain link
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
    with open_store(url, rng=1) as s:
        make_release(s)
        s.get_or_sample(RID, 0, np.linspace(0, 1, 5))
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
    """Two store objects on one SQLite file. B stores x_new; A's copy misses it, and A is made
    to believe its copy is complete (its version token forged to the current one: a bug in
    the catch-up). A then asks x_new and a neighbour: its first attempt draws both at seqs
    21, 22; seq 21 is B's row, so the insert is skipped there, the confirm fails, the
    transaction rolls back, and the retry re-reads: x_new is answered with B's value and the
    neighbour is drawn conditioned on it. One row per state, chains verify."""
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    xs = np.linspace(0, 1, 20)
    x_new, x_near = 0.512, 0.513
    with open_store(url, rng=1) as a, open_store(url, rng=2) as b:
        make_release(a)
        a.get_or_sample(RID, 0, xs)
        g_b = float(b.get_or_sample(RID, 0, [x_new])[0])  # seq 21, unknown to A's copy
        st = a._states[(RID, 0)]
        assert st.hw == 20 and x_new not in st.values
        st.version = (a._wepoch, a._writer_scalar("PRAGMA data_version"))  # the forged token
        records: list[InsertRecord] = []
        a.set_debug_hook(lambda _r, _a, recs: records.extend(recs))
        g_a = a.get_or_sample(RID, 0, [x_new, x_near])
        assert float(g_a[0]) == g_b  # one value for x_new
        right = float(min(v for v in xs if v > x_near))
        assert [(r.seq, r.x, r.left, r.right) for r in records] == [(22, x_near, x_new, right)]
        assert a.points_drawn == 20 + 1
        rows = [(p.seq, p.x) for p in a.iter_points(RID, 0)]
        assert len(rows) == 22 == len({x for _s, x in rows})
        assert a.verify(RID).ok


@pytest.mark.parametrize("kind", KINDS)
def test_same_new_state_from_two_processes(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two processes (each its own store and connections) ask the same 60 new states, one per
    call, in the same order, starting together: every call races the other process on the
    same new state. One stored row per state; both processes answered the same value."""
    url = _url(kind, tmp_path, request)
    with open_store(url, rng=3) as s:
        make_release(s, n_actions=1)
    xs = np.random.default_rng(4).uniform(size=60).tolist()
    start = time.time() + 0.3
    logs = [tmp_path / f"p{i}.jsonl" for i in range(2)]
    pids = [
        run_forked(same_x_writer, url, RID, 0, 10 + i, xs, str(logs[i]), start) for i in range(2)
    ]
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    answers = [[json.loads(line) for line in log.read_text().splitlines()] for log in logs]
    assert [d["x"] for d in answers[0]] == [d["x"] for d in answers[1]] == xs
    assert [d["g"] for d in answers[0]] == [d["g"] for d in answers[1]]
    with open_store(url) as s:
        stored = {p.x: p.g for p in s.iter_points(RID, 0)}
        assert s.count_points(RID, 0) == len(stored) == 60
        assert s.verify(RID).ok
    assert all(stored[d["x"]] == d["g"] for d in answers[0])


@pytest.mark.postgres
def test_two_store_objects_on_one_postgres_share_only_the_advisory_lock(pg_url: str) -> None:
    """Two SQLStore objects whose identities differ (so they share no process-wide lock) on
    one PostgreSQL database, 6 threads each, every round all 12 threads ask the same new
    state and one of 3 neighbours: one value per state for all, each insertion conditioned
    on everything committed before it (check_seen), chains verify."""
    a_url, b_url = (f"{pg_url}?application_name=qveil_{n}" for n in "ab")
    records: list[InsertRecord] = []
    answers: list[tuple[float, float]] = []
    errors: list[BaseException] = []
    guard = threading.Lock()
    with open_store(a_url, rng=5) as a, open_store(b_url, rng=6) as b:
        assert a._identity != b._identity  # type: ignore[attr-defined]
        make_release(a, n_actions=1)

        def hook(_r: str, _a: int, recs: list[InsertRecord]) -> None:
            with guard:
                records.extend(recs)

        a.set_debug_hook(hook)
        b.set_debug_hook(hook)
        rounds = np.sort(np.random.default_rng(7).uniform(size=(25, 4)), axis=1)
        barrier = threading.Barrier(12)

        def work(i: int) -> None:
            s = a if i % 2 else b
            rng = np.random.default_rng(100 + i)
            try:
                for r in rounds:
                    xs = [float(r[0]), float(r[1 + int(rng.integers(0, 3))])]
                    barrier.wait()
                    gs = s.get_or_sample(RID, 0, xs).tolist()
                    with guard:
                        answers.extend(zip(xs, gs, strict=True))
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
                barrier.abort()

        ts = [threading.Thread(target=work, args=(i,)) for i in range(12)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errors, errors
        rows = [(p.seq, p.x) for p in a.iter_points(RID, 0)]
        value = {p.x: p.g for p in a.iter_points(RID, 0)}
        assert a.verify(RID).ok
    assert len(rows) == len(value) == len(records)  # one row per state, each drawn once
    assert all(value[x] == g for x, g in answers)
    assert check_seen(rows, records) == []


@pytest.mark.parametrize("kind", KINDS)
def test_state_stored_twice_is_refused_and_reported(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = _url(kind, tmp_path, request)
    xs = np.linspace(0, 1, 20)
    with open_store(url, rng=1) as s:
        make_release(s)
        g0 = s.get_or_sample(RID, 0, xs)
        g1 = s.get_or_sample(RID, 1, xs)
        seq = _duplicate_with_valid_link(url, s, 0, float(xs[7]), 0.25)
        assert seq == 21
        # this store has action 0 loaded: its next catch-up finds the row and refuses
        with pytest.raises(IntegrityError, match="the row at seq 21 repeats a stored state"):
            s.get_or_sample(RID, 0, [0.123])
        with pytest.raises(IntegrityError, match="stores one state twice") as exc:
            s.get_or_sample(RID, 0, xs[:3])  # known states of the refused path: refused too
        assert "0.25" not in str(exc.value) and repr(float(g0[7])) not in str(exc.value)
        with pytest.raises(IntegrityError, match="stores one state twice"):
            s.get_or_sample_paths(RID, [0, 1], [[0.5], [0.5]])
        # the other action is answered and sampled as before
        assert np.array_equal(s.get_or_sample(RID, 1, xs), g1)
        s.get_or_sample(RID, 1, [0.123])
        assert (s.count_points(RID, 0), s.count_points(RID, 1)) == (21, 21)
    with open_store(url) as t:  # a fresh process: loading the path refuses it
        with pytest.raises(IntegrityError, match="seq 21 repeats a stored state"):
            t.get_or_sample(RID, 0, xs[:1])
        assert np.array_equal(t.get_or_sample(RID, 1, xs), g1)
        rep = t.verify(RID)
        assert not rep.ok and rep.actions[1].ok
        a0 = rep.actions[0]
        assert a0.first_broken is None and a0.gaps == ()  # the link itself is valid
        assert a0.problems == (f"seq 21: state {float(xs[7])!r} stored twice (first at seq 8)",)
        assert (t.count_points(RID, 0), t.count_points(RID, 1)) == (21, 21)  # nothing written


def test_server_refuses_an_action_with_a_state_stored_twice(tmp_path: Path) -> None:
    """A running server answers DATA_LOSS for the refused path (new and known states) and
    stores nothing; a server started on the store refuses the release at verification."""
    bundle = make_bundle(tmp_path / "b", seed=3)
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    states = np.linspace(-1.0, 2.0, 12)
    with InProcessServer(bundle, url) as srv:
        with ValueClient(srv.target) as c:
            known = c.values(states)
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
            n1 = srv.store.count_points(rid, 1)
            with pytest.raises(DataLossError, match="stores one state twice"):
                c.values([0.321])  # found by this call's catch-up
            n = srv.store.count_points(rid)
            with pytest.raises(DataLossError, match="stores one state twice"):
                c.values(states[:2])  # known states: refused from then on
            with pytest.raises(DataLossError, match="stores one state twice"):
                c.values([0.654])  # new ones too, before anything is drawn
            assert np.array_equal(c.values(states[:2], actions=[0, 2]), known[:2][:, [0, 2]])
            # nothing written to the refused path; nothing at all once it is known refused
            assert srv.store.count_points(rid, 1) == n1
            assert srv.store.count_points(rid) == n
    with InProcessServer(bundle, url, start=False) as srv:
        with pytest.raises(IntegrityError, match="fails verification"):
            srv.services.releases.start(bundle)
