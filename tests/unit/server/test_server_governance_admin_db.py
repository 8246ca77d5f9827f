"""The admin records' database (qveil.server.governance.admin_db) on real SQLite files: opened
beside a store (same file, once per store object), durable SQLite settings, write transactions
that commit or roll back whole and serialize writers, read transactions that never commit, and
bad or unprepared URLs refused with a clear error."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from qveil.errors import FailedPrecondition, InvalidArgument, Unavailable
from qveil.server.governance import admin_tables as T
from qveil.server.governance.admin_db import _lock_key, admin_db_for, open_admin_db
from qveil.server.store import open_store


def _count(db: object) -> int:
    with db.read() as conn:  # type: ignore[attr-defined]
        return int(conn.execute(sa.select(sa.func.count()).select_from(T.audit_log)).scalar())


def _row(seq: int) -> dict[str, object]:
    return {
        "seq": seq,
        "at": "2026-01-01T00:00:00+00:00",
        "actor": "t",
        "action": "test",
        "target": "x",
        "params_json": "{}",
        "outcome": "ok",
        "detail": "",
        "prev_hash": "0" * 64,
        "hash": f"{seq:064d}",
    }


def test_memory_is_private_and_ephemeral() -> None:
    a, b = open_admin_db("memory://x"), open_admin_db(None)
    try:
        assert a.ephemeral and a.url == "memory://" and a.dialect == "sqlite"
        with a.write("audit") as conn:
            conn.execute(T.audit_log.insert().values(**_row(1)))
        assert _count(a) == 1 and _count(b) == 0
    finally:
        a.close()
        b.close()


def test_writes_commit_whole_or_not_at_all_and_reads_never_commit(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.sqlite'}"
    with open_admin_db(url, create=True) as db:
        assert not db.ephemeral and db.url == url
        with db.read() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
        with db.write("audit") as conn:
            conn.execute(T.audit_log.insert().values(**_row(1)))
        with pytest.raises(RuntimeError), db.write("audit") as conn:
            conn.execute(T.audit_log.insert().values(**_row(2)))
            raise RuntimeError("the caller failed mid-transaction")
        with db.read() as conn:
            conn.execute(T.audit_log.insert().values(**_row(3)))  # read: rolled back
        assert _count(db) == 1


def test_two_writers_are_serialized(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.sqlite'}"
    with open_admin_db(url, create=True) as one, open_admin_db(url) as two:
        inside, release, order = threading.Event(), threading.Event(), []

        def first() -> None:
            with one.write("audit") as conn:
                conn.execute(T.audit_log.insert().values(**_row(1)))
                inside.set()
                assert release.wait(30)
                order.append("first commits")

        t = threading.Thread(target=first)
        t.start()
        assert inside.wait(30)
        done = threading.Event()

        def second() -> None:
            with two.write("audit") as conn:
                order.append("second writes")
                conn.execute(T.audit_log.insert().values(**_row(2)))
            done.set()

        t2 = threading.Thread(target=second)
        t2.start()
        assert not done.wait(0.2)  # BEGIN IMMEDIATE waits for the first writer
        release.set()
        t.join(30)
        t2.join(30)
        assert order == ["first commits", "second writes"] and _count(two) == 2


def test_beside_a_store_once_per_store_object(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    with open_store(url) as st:
        db = admin_db_for(st)
        assert admin_db_for(st) is db and db.url == url and not db.ephemeral
        with db.write("audit") as conn:
            conn.execute(T.audit_log.insert().values(**_row(1)))
    with open_store(f"memory://{tmp_path.name}") as mem:
        assert admin_db_for(mem).ephemeral
    with open_admin_db(url) as again:  # the store's migrations made the tables
        assert _count(again) == 1


def test_bad_and_unprepared_urls_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="bad store URL 'not a url'"):
        open_admin_db("not a url")
    with pytest.raises(InvalidArgument, match="unsupported store URL 'mysql://h/db'"):
        open_admin_db("mysql://h/db")
    bare = tmp_path / "bare.sqlite"
    with pytest.raises(FailedPrecondition, match="has no admin tables \\(ledger_events"):
        open_admin_db(f"sqlite:///{bare}")
    with pytest.raises(Unavailable, match="admin records: cannot open"):
        open_admin_db(f"sqlite:///{tmp_path / 'no' / 'dir' / 'x.sqlite'}")
    assert not (tmp_path / "no").exists()


def test_lock_keys_are_signed_64_bit_and_distinct() -> None:
    keys = {_lock_key(n) for n in ("ledger", "audit", "bundles")}
    assert len(keys) == 3 and all(-(2**63) <= k < 2**63 for k in keys)
    assert _lock_key("ledger") == _lock_key("ledger")
