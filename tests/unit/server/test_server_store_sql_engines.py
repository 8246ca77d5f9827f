"""The SQL store's connections (qveil.server.store.sql_engines): an in-memory SQLite URL, an
unknown backend, a missing file (without create), a missing folder and a read-only database
in rollback-journal mode are refused at start-up with nothing created; the SQLite
durability settings (WAL, synchronous FULL, a busy timeout, BEGIN IMMEDIATE) are read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from qveil.errors import FailedPrecondition, InvalidArgument, Unavailable
from qveil.server.store import open_store


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
