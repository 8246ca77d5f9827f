"""Faults on the SQLite store: a full disk (SQLite ``max_page_count``) and a read-only database.

New points must fail with a clear qveil.errors.Unavailable, nothing may be half-written (the
whole batch is rolled back, the in-process copy is unchanged) and known points must still be
answered, from memory and from the database after reopening. Plus: unsafe settings and bad
URLs are refused at start-up.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from store_helpers import RID, make_release
from thread_helpers import run_threads

from qveil.errors import FailedPrecondition, InvalidArgument, Unavailable
from qveil.server.store import open_store


def test_disk_full_fails_cleanly(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    known = np.linspace(0, 1, 50)
    with open_store(url, rng=1) as s:
        make_release(s)
        g_known = s.get_or_sample(RID, 0, known)
        pages = s._writer_scalar("PRAGMA page_count")  # type: ignore[attr-defined]
        s._sqlite_pragma_all(f"PRAGMA max_page_count = {pages}")  # type: ignore[attr-defined]
        new = np.random.default_rng(2).uniform(size=3000)
        with pytest.raises(Unavailable, match="disk full"):
            s.get_or_sample(RID, 0, np.concatenate([known[:3], new]))
        assert s.count_points(RID, 0) == 50 and s.cached_points(RID, 0) == 50
        assert s.verify(RID).ok
        assert np.array_equal(s.get_or_sample(RID, 0, known), g_known)
        s._sqlite_pragma_all("PRAGMA max_page_count = 1073741823")  # type: ignore[attr-defined]
        g_new = s.get_or_sample(RID, 0, new[:100])  # space again: works, same object
        assert s.count_points(RID, 0) == 150
    with open_store(url) as s:
        assert np.array_equal(s.get_or_sample(RID, 0, known), g_known)
        assert np.array_equal(s.get_or_sample(RID, 0, new[:100]), g_new)
        assert s.verify(RID).ok


def test_disk_full_with_group_commit(tmp_path: Path) -> None:
    """8 threads asking for new states while the disk is full: every one gets Unavailable
    (a failed leader's queued states are not silently dropped, not answered), nothing is
    stored; with space again, all of them are stored by the next calls."""

    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with open_store(url, rng=5) as s:
        make_release(s)
        s.get_or_sample(RID, 0, np.linspace(0, 1, 11))
        pages = s._writer_scalar("PRAGMA page_count")  # type: ignore[attr-defined]
        s._sqlite_pragma_all(f"PRAGMA max_page_count = {pages}")  # type: ignore[attr-defined]
        xs = [np.random.default_rng(i).uniform(size=400) for i in range(8)]
        outcome: list[object] = [None] * 8

        def work(i: int) -> None:
            try:
                outcome[i] = s.get_or_sample(RID, 0, xs[i])
            except Unavailable as exc:
                outcome[i] = exc

        run_threads(8, work)
        assert all(isinstance(o, Unavailable) for o in outcome), outcome
        assert s.count_points(RID, 0) == 11 and s.cached_points(RID, 0) == 11
        s._sqlite_pragma_all("PRAGMA max_page_count = 1073741823")  # type: ignore[attr-defined]
        got = [s.get_or_sample(RID, 0, x) for x in xs]
        assert s.count_points(RID, 0) == 11 + 8 * 400
        for x, g in zip(xs, got, strict=True):
            assert np.array_equal(s.get_or_sample(RID, 0, x), g)
        assert s.verify(RID).ok


def test_read_only_database(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    known = np.linspace(0, 1, 20)
    with open_store(f"sqlite:///{path}", rng=3) as s:
        make_release(s)
        g_known = s.get_or_sample(RID, 1, known)
    # root ignores file modes, so open it the way a read-only mount looks to SQLite
    with open_store(f"sqlite:///file:{path}?mode=ro&uri=true", rng=4) as s:
        assert np.array_equal(s.get_or_sample(RID, 1, known), g_known)
        with pytest.raises(Unavailable, match="read-only"):
            s.get_or_sample(RID, 1, [0.3333, 0.6666])
        with pytest.raises(Unavailable, match="read-only"):
            s.create_release(
                release_id="other", fingerprint="f", sigma=1, beta=1, interval=(0, 1), n_actions=1
            )
        assert s.count_points(RID, 1) == 20 and s.cached_points(RID, 1) == 20
        assert s.verify(RID).ok
    with open_store(f"sqlite:///{path}") as s:
        assert s.count_points() == 20
        assert np.array_equal(s.get_or_sample(RID, 1, known), g_known)


def test_refuses_unsafe_or_bad_setup(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        open_store("sqlite://")  # in-memory SQLite: not durable
    with pytest.raises(InvalidArgument):
        open_store("mysql://x@localhost/db")
    with pytest.raises(FailedPrecondition, match="does not exist"):
        open_store(f"sqlite:///{tmp_path / 'missing.sqlite'}", create=False)
    assert not (tmp_path / "missing.sqlite").exists()
    with pytest.raises(Unavailable):
        open_store(f"sqlite:///{tmp_path / 'no' / 'dir.sqlite'}")
    # a database in rollback-journal mode opened read-only cannot be switched to WAL
    import sqlite3

    p = tmp_path / "journal.sqlite"
    sqlite3.connect(p).execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises((FailedPrecondition, Unavailable)):
        open_store(f"sqlite:///file:{p}?mode=ro&uri=true")


def test_settings_are_read_back(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path / 's.sqlite'}") as s:
        st = s.settings  # type: ignore[attr-defined]
        assert st["journal_mode"] == "wal" and st["synchronous"] == 2
        assert st["busy_timeout_ms"] > 0 and st["driver_isolation_level"] is None
        assert st["begin"] == "IMMEDIATE"


@pytest.mark.postgres
def test_postgres_settings_and_lost_connections(pg_url: str) -> None:
    import psycopg

    with open_store(pg_url, rng=5) as s:
        st = s.settings  # type: ignore[attr-defined]
        assert st["transaction_isolation"] == "read committed" and st["fsync"] == "on"
        make_release(s)
        g = s.get_or_sample(RID, 0, [0.1, 0.2])
        db = pg_url.rsplit("/", 1)[1]
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", autocommit=True) as c:
            c.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (db,),
            )
        # pooled connections are dead: pre-ping replaces them; values unchanged
        assert np.array_equal(s.get_or_sample(RID, 0, [0.1, 0.2]), g)
        s.get_or_sample(RID, 0, [0.15])
        assert s.verify(RID).ok
    with pytest.raises(Unavailable):
        open_store("postgresql+psycopg://postgres@127.0.0.1:1/nowhere", busy_timeout=1)
