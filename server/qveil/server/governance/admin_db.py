"""Database access for the admin records (ledger, caps, audit log, release bundles).

The admin records live in the sample-path store's database (same URL, same Alembic history;
the store's ``open_store`` migrates it). This module opens its own small SQLAlchemy engine on
that URL, with the same durability rules as the store (non-negotiable 1 applies to privacy
spending too: a ledger entry is durable before the release it pays for exists):

* SQLite: WAL journal, ``synchronous=FULL``, a busy timeout, the driver's implicit transactions
  disabled and ``BEGIN IMMEDIATE`` for every write, so that two writers (two ``qveil admin``
  processes, or an admin process beside a running server) are serialized by the database;
* PostgreSQL: READ COMMITTED with ``pg_advisory_xact_lock`` on a key per record family as the
  first statement of every write transaction, so that "read the ledger, check the cap, append"
  is atomic across processes and replicas.

``memory://`` (tests, throw-away stores) gets a private in-memory SQLite database; its records
vanish with the process, which is said wherever such a ledger is shown.
"""

from __future__ import annotations

import hashlib
import sqlite3
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import ConnectionPoolEntry, Pool, StaticPool

from qveil.errors import FailedPrecondition, InvalidArgument, Unavailable
from qveil.server.governance import admin_tables as T
from qveil.server.governance.closing import Closing

if TYPE_CHECKING:  # for annotations only
    from qveil.server.store.base import SamplePathStore

__all__ = ["AdminDB", "admin_db_for", "open_admin_db"]

_TABLES = (T.ledger_events, T.ledger_caps, T.audit_log, T.release_bundles)
BUSY_TIMEOUT_MS = 30_000


def _lock_key(name: str) -> int:
    """A signed 64-bit advisory-lock key for ``name`` (PostgreSQL)."""
    return int.from_bytes(
        hashlib.sha256(f"qveil-admin:{name}".encode()).digest()[:8], "big", signed=True
    )


class AdminDB(Closing):
    """An engine on the store's database plus serialized write transactions."""

    def __init__(self, engine: Engine, *, url: str, ephemeral: bool) -> None:
        self.engine = engine
        self.url = url
        #: True for ``memory://``: the records disappear with the process.
        self.ephemeral = ephemeral
        self.dialect = engine.dialect.name

    def write(self, lock: str) -> AbstractContextManager[Connection]:
        """One serialized write transaction; ``lock`` names the record family (PostgreSQL key).

        Commits when the block exits normally, rolls back (nothing written) on any exception.
        """
        return self._transaction(lock)

    def lock(self, conn: Connection, name: str) -> None:
        """Take one more lock inside a write transaction (PostgreSQL; SQLite's BEGIN IMMEDIATE
        already serializes every writer). Locks are always taken in the order ledger, then
        audit log, so two writers never wait on each other in a cycle."""
        if self.dialect != "sqlite":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _lock_key(name)})

    def read(self) -> AbstractContextManager[Connection]:
        """A read-only connection (one consistent transaction on both backends)."""
        return self._transaction(None)

    @contextmanager
    def _transaction(self, lock: str | None) -> Iterator[Connection]:
        """A write transaction holding ``lock`` (SQLite ``BEGIN IMMEDIATE``, PostgreSQL the
        advisory lock) that commits when the block exits normally, or with ``lock=None`` a read
        transaction that never commits; both roll back on any exception."""
        try:
            with self.engine.connect() as conn:
                if self.dialect == "sqlite":
                    conn.exec_driver_sql("BEGIN" if lock is None else "BEGIN IMMEDIATE")
                else:
                    conn.begin()
                    if lock is not None:
                        self.lock(conn, lock)
                try:
                    yield conn
                except BaseException:
                    conn.rollback()
                    raise
                if lock is None:
                    conn.rollback()
                else:
                    conn.commit()
        except sa.exc.OperationalError as exc:
            raise Unavailable(f"admin records: database unavailable: {exc.orig}") from None

    def close(self) -> None:
        self.engine.dispose()


def _sqlite_engine(url: str, *, poolclass: type[Pool] | None = None) -> Engine:
    kw = {} if poolclass is None else {"poolclass": poolclass}
    engine = sa.create_engine(url, connect_args={"check_same_thread": False}, **kw)

    @event.listens_for(engine, "connect")
    def _on_connect(
        dbapi_conn: sqlite3.Connection, _record: ConnectionPoolEntry
    ) -> None:  # pragma: no cover - trivial
        # Disable the driver's implicit transactions: we issue BEGIN / BEGIN IMMEDIATE ourselves.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA journal_mode = WAL")  # "memory" for an in-memory database
        cur.execute("PRAGMA synchronous = FULL")
        cur.close()

    return engine


def open_admin_db(url: str | None, *, create: bool = False) -> AdminDB:
    """Open the admin records of the store at ``url``.

    ``memory://`` gives a private in-memory database with the tables created. For a real
    database the tables must exist (the store's migrations create them: open the store first,
    or pass ``create=True`` in tests); otherwise :class:`FailedPrecondition`.
    """
    if url is None or url == "" or url.startswith("memory://"):
        engine = _sqlite_engine("sqlite://", poolclass=StaticPool)
        db = AdminDB(engine, url="memory://", ephemeral=True)
        with engine.begin() as conn:
            T.metadata.create_all(conn, tables=list(_TABLES))
        return db
    try:
        surl = sa.engine.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise InvalidArgument(f"bad store URL {url!r}: {exc}") from None
    if surl.get_backend_name() == "sqlite":
        engine = _sqlite_engine(url)
    elif surl.get_backend_name() == "postgresql":
        engine = sa.create_engine(url, isolation_level="READ COMMITTED", pool_pre_ping=True)
    else:
        raise InvalidArgument(
            f"unsupported store URL {url!r}: use sqlite:///... or postgresql+psycopg://..."
        )
    db = AdminDB(engine, url=url, ephemeral=False)
    try:
        names = set(sa.inspect(engine).get_table_names())
    except sa.exc.OperationalError as exc:
        engine.dispose()
        raise Unavailable(f"admin records: cannot open {url!r}: {exc.orig}") from None
    missing = [t.name for t in _TABLES if t.name not in names]
    if missing:
        if create:
            with engine.begin() as conn:
                T.metadata.create_all(conn, tables=list(_TABLES))
        else:
            engine.dispose()
            raise FailedPrecondition(
                f"the store at {url!r} has no admin tables ({', '.join(missing)}); open it with "
                "the current qveil (its migrations create them: revision 0002_ledger_audit)"
            )
    return db


#: the admin records opened beside each store object (:func:`admin_db_for`)
_OPENED: weakref.WeakKeyDictionary[SamplePathStore, AdminDB] = weakref.WeakKeyDictionary()


def admin_db_for(store: SamplePathStore, store_url: str | None = None) -> AdminDB:
    """The admin records beside ``store`` (same database), opened once per store object."""
    db = _OPENED.get(store)
    if db is not None:
        return db
    url = store_url or getattr(store, "url", None) or getattr(store, "_url", None)
    if url is not None and not isinstance(url, str):  # a SQLAlchemy URL object
        url = url.render_as_string(hide_password=False)
    if url is None or str(url).startswith("memory:"):
        db = open_admin_db("memory://")  # a private in-memory admin database per memory store
    else:
        db = open_admin_db(str(url))
    _OPENED[store] = db
    return db
