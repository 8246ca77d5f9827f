"""Faults on the SQLite store: a full disk (SQLite ``max_page_count``) and a read-only database.

A write of new points must fail with a clear qveil.errors.Unavailable, nothing may be
half-written (the whole batch is rolled back, the in-process copy is unchanged), what was
logged reads back unchanged, from memory and from the database after reopening, and the next
write succeeds once the fault is gone (unsafe settings and bad URLs refused at start-up:
test_server_store_sql_engines.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from store_helpers import RID, keyed_paths, log_values, logged, make_release, path_values
from thread_helpers import run_threads

from qveil.errors import Unavailable
from qveil.server.store import open_store


def _as_dict(xs: np.ndarray, gs: np.ndarray) -> dict[float, float]:
    return dict(zip(xs.tolist(), gs.tolist(), strict=True))


def test_disk_full_fails_cleanly(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with open_store(url) as s:
        kp = keyed_paths(make_release(s))
        (known,), (g_known,), _w, _m = log_values(s, kp, RID, [0], [np.linspace(0, 1, 50)])
        pages = s._writer_scalar("PRAGMA page_count")  # type: ignore[attr-defined]
        s._sqlite_pragma_all(f"PRAGMA max_page_count = {pages}")  # type: ignore[attr-defined]
        new, g_new = path_values(kp, 0, np.random.default_rng(2).uniform(size=3000))
        with pytest.raises(Unavailable, match="disk full"):
            s.record_paths(
                RID, [0], [np.concatenate([known[:3], new])], [np.concatenate([g_known[:3], g_new])]
            )
        assert s.count_points(RID, 0) == 50 and s.paths.cached_points(RID, 0) == 50
        assert s.verify(RID).ok
        assert logged(s, RID, 0) == _as_dict(known, g_known)
        assert s.record_paths(RID, [0], [known], [g_known]) == (0, 0)  # logged: no write
        s._sqlite_pragma_all("PRAGMA max_page_count = 1073741823")  # type: ignore[attr-defined]
        # space again: the same object writes
        assert s.record_paths(RID, [0], [new[:100]], [g_new[:100]]) == (100, 0)
        assert s.count_points(RID, 0) == 150
    with open_store(url) as s:
        assert logged(s, RID, 0) == _as_dict(known, g_known) | _as_dict(new[:100], g_new[:100])
        assert s.verify(RID).ok


def test_disk_full_with_group_commit(tmp_path: Path) -> None:
    """8 threads logging new states while the disk is full: every one gets Unavailable (a
    failed leader's queued states are not silently dropped, nor reported logged), nothing
    is written; with space again, all of them are written by the next calls."""

    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with open_store(url) as s:
        kp = keyed_paths(make_release(s))
        log_values(s, kp, RID, [0], [np.linspace(0, 1, 11)])
        pages = s._writer_scalar("PRAGMA page_count")  # type: ignore[attr-defined]
        s._sqlite_pragma_all(f"PRAGMA max_page_count = {pages}")  # type: ignore[attr-defined]
        vals = [path_values(kp, 0, np.random.default_rng(i).uniform(size=400)) for i in range(8)]
        outcome: list[object] = [None] * 8

        def work(i: int) -> None:
            try:
                outcome[i] = s.record_paths(RID, [0], [vals[i][0]], [vals[i][1]])
            except Unavailable as exc:
                outcome[i] = exc

        run_threads(8, work)
        assert all(isinstance(o, Unavailable) for o in outcome), outcome
        assert s.count_points(RID, 0) == 11 and s.paths.cached_points(RID, 0) == 11
        s._sqlite_pragma_all("PRAGMA max_page_count = 1073741823")  # type: ignore[attr-defined]
        assert [s.record_paths(RID, [0], [x], [g]) for x, g in vals] == [(400, 0)] * 8
        assert s.count_points(RID, 0) == 11 + 8 * 400
        got = logged(s, RID, 0)
        for x, g in vals:
            assert all(got[xi] == gi for xi, gi in zip(x.tolist(), g.tolist(), strict=True))
        assert s.verify(RID).ok


def test_read_only_database(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    with open_store(f"sqlite:///{path}") as s:
        kp = keyed_paths(make_release(s))
        (known,), (g_known,), _w, _m = log_values(s, kp, RID, [1], [np.linspace(0, 1, 20)])
    # root ignores file modes, so open it the way a read-only mount looks to SQLite
    with open_store(f"sqlite:///file:{path}?mode=ro&uri=true") as s:
        assert logged(s, RID, 1) == _as_dict(known, g_known)
        assert s.record_paths(RID, [1], [known], [g_known]) == (0, 0)  # logged: no write
        with pytest.raises(Unavailable, match="read-only"):
            log_values(s, kp, RID, [1], [[0.3333, 0.6666]])
        with pytest.raises(Unavailable, match="read-only"):
            s.releases.create_release(
                release_id="other", fingerprint="f", sigma=1, beta=1, interval=(0, 1), n_actions=1
            )
        assert s.count_points(RID, 1) == 20 and s.paths.cached_points(RID, 1) == 20
        assert s.verify(RID).ok
    with open_store(f"sqlite:///{path}") as s:
        assert s.count_points() == 20
        assert logged(s, RID, 1) == _as_dict(known, g_known)
        assert log_values(s, kp, RID, [1], [[0.3333, 0.6666]])[2:] == (2, 0)  # writable again


@pytest.mark.postgres
def test_postgres_settings_and_lost_connections(pg_url: str) -> None:
    import psycopg

    with open_store(pg_url) as s:
        st = s.settings  # type: ignore[attr-defined]
        assert st["transaction_isolation"] == "read committed" and st["fsync"] == "on"
        kp = keyed_paths(make_release(s))
        (xs,), (gs,), _w, _m = log_values(s, kp, RID, [0], [[0.1, 0.2]])
        db = pg_url.rsplit("/", 1)[1]
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", autocommit=True) as c:
            c.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (db,),
            )
        # pooled connections are dead: the logged states are known from the copy, a write
        # is retried on a new connection, and the log reads back unchanged
        assert s.record_paths(RID, [0], [xs], [gs]) == (0, 0)
        (x2,), (g2,), written, _m = log_values(s, kp, RID, [0], [[0.15]])
        assert written == 1
        assert logged(s, RID, 0) == _as_dict(xs, gs) | _as_dict(x2, g2)
        assert s.verify(RID).ok
    with pytest.raises(Unavailable):
        open_store("postgresql+psycopg://postgres@127.0.0.1:1/nowhere", busy_timeout=1)
