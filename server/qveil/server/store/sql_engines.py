"""The SQL store's connections: the SQLite file (created owner-only), SQLAlchemy engines with
qveil's durability settings for SQLite and PostgreSQL, and the check that reads the settings
back and refuses to run the store without them (:class:`qveil.server.store.sql.SQLStore`)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import cast

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL
from sqlalchemy.pool import ConnectionPoolEntry

from qveil.errors import FailedPrecondition, InvalidArgument, Unavailable

__all__ = ["Settings", "check_settings", "postgres_engines", "sqlite_engine", "sqlite_url"]

#: the durability settings a store reads back (name -> the database's value)
Settings = dict[str, str | int | None]


def sqlite_url(u: URL, url: str | URL, *, create: bool, new_ok: bool) -> tuple[URL, str]:
    """The SQLite URL with its file's absolute path, and the store's identity; creates the
    empty database file owner-only when it may."""
    db = u.database or ""
    is_uri = str(u.query.get("uri", "")).lower() in ("true", "1")
    if db.startswith("file:") and is_uri:
        db = db[len("file:") :]  # sqlite:///file:/abs/path?mode=ro&uri=true
    if db in ("", ":memory:") or db.startswith("file:") or "mode=memory" in str(u):
        raise InvalidArgument(
            f"SQLite store needs a file path (sqlite:////abs/path.sqlite), got {url!r}"
        )
    path = Path(db).expanduser().resolve()
    if not path.exists():
        if not create or not new_ok:
            raise FailedPrecondition(f"SQLite store {path} does not exist (nothing was created)")
        if not path.parent.is_dir():
            raise Unavailable(f"directory {path.parent} of the store does not exist")
        # create the empty file 0600 before SQLite opens it, whatever the umask:
        # SQLite gives the -wal and -shm files the database file's mode, so all three
        # are owner-only (an empty file is a valid empty database)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # created meanwhile by another process: its mode
            pass
        else:
            os.fchmod(fd, 0o600)
            os.close(fd)
    u = u.set(database=("file:" if is_uri else "") + str(path))
    return u, f"sqlite:{path}"


def postgres_engines(u: URL, *, busy: float, pool_size: int) -> tuple[sa.Engine, sa.Engine]:
    """(writer, reader) on PostgreSQL: READ COMMITTED writes, AUTOCOMMIT single-statement
    reads (no BEGIN/ROLLBACK round trips). No pre-ping (a round trip per checkout): a dead
    pooled connection fails its statement, is invalidated, and the operation is retried."""
    cargs = {"connect_timeout": max(1, int(busy))}

    def engine(level: str) -> sa.Engine:
        return sa.create_engine(
            u,
            isolation_level=level,
            pool_size=pool_size,
            max_overflow=pool_size,
            connect_args=cargs,
        )

    return engine("READ COMMITTED"), engine("AUTOCOMMIT")


def sqlite_engine(
    url: URL, *, busy: float, pool_size: int, begin: bool, implicit: bool
) -> sa.Engine:
    """A SQLite engine with qveil's pragmas (WAL, synchronous FULL, a busy timeout, foreign
    keys); ``begin``: every transaction starts with BEGIN IMMEDIATE (the writer: it holds the
    file's write lock from its first statement) and a larger page cache; ``implicit``: keep
    the driver's own deferred BEGIN instead of turning it off (``isolation_level``)."""
    args: dict[str, float | bool | None] = {"timeout": busy, "check_same_thread": False}
    if not implicit:
        args["isolation_level"] = None
    eng = sa.create_engine(
        url,
        pool_size=pool_size,
        max_overflow=0,
        pool_timeout=max(busy, 1.0),
        connect_args=args,
    )
    ms = int(busy * 1000)

    @event.listens_for(eng, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _rec: ConnectionPoolEntry) -> None:
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {ms}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = FULL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    if begin:  # the writer: a larger page cache keeps the x index's inner pages hot

        @event.listens_for(eng, "connect")
        def _cache(dbapi_conn: sqlite3.Connection, _rec: ConnectionPoolEntry) -> None:
            dbapi_conn.execute("PRAGMA cache_size = -65536")  # 64 MiB

        @event.listens_for(eng, "begin")
        def _on_begin(conn: sa.Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    return eng


def check_settings(writer: sa.Engine, *, backend: str, begin_mode: str, where: str) -> Settings:
    """Read back the durability settings through ``writer``; refuse (FailedPrecondition)
    a store without them. ``begin_mode``: the writer's BEGIN (``IMMEDIATE`` for qveil's)."""
    bad: list[str] = []
    if backend == "sqlite":
        with writer.connect() as conn:
            # the pysqlite driver's connection (an SQLite URL)
            dbapi = cast(sqlite3.Connection, conn.connection.dbapi_connection)
            cur = dbapi.cursor()  # raw: no BEGIN IMMEDIATE just to read settings
            journal: str = cur.execute("PRAGMA journal_mode").fetchone()[0]
            synchronous: int = cur.execute("PRAGMA synchronous").fetchone()[0]
            busy_ms: int = cur.execute("PRAGMA busy_timeout").fetchone()[0]
            isolation: str | None = getattr(dbapi, "isolation_level", "?")
            cur.close()
        s: Settings = {
            "journal_mode": journal,
            "synchronous": synchronous,
            "busy_timeout_ms": busy_ms,
            "driver_isolation_level": isolation,
            "begin": begin_mode,
        }
        if str(journal).lower() != "wal":
            bad.append(f"journal_mode={journal} (need wal)")
        if int(synchronous) < 2:
            bad.append(f"synchronous={synchronous} (need FULL=2 or EXTRA=3)")
        if int(busy_ms) <= 0:
            bad.append("busy_timeout is 0")
        if begin_mode == "IMMEDIATE" and isolation is not None:
            bad.append("the driver's implicit transactions are enabled")
    else:
        with writer.connect() as conn:
            s = {
                k: conn.exec_driver_sql(f"SHOW {k}").scalar()
                for k in (
                    "transaction_isolation",
                    "fsync",
                    "synchronous_commit",
                    "full_page_writes",
                    "default_transaction_read_only",
                )
            }
            conn.rollback()
        if s["transaction_isolation"] != "read committed":
            bad.append(f"transaction_isolation={s['transaction_isolation']}")
        if s["fsync"] != "on":
            bad.append("fsync is off")
        if s["synchronous_commit"] in ("off",):
            bad.append("synchronous_commit is off")
        if s["full_page_writes"] != "on":
            bad.append("full_page_writes is off")
    if bad:
        raise FailedPrecondition(
            f"refusing to run the store on {where}: unsafe settings: " + "; ".join(bad)
        )
    return s
