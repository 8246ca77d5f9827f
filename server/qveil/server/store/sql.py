"""SQLite and PostgreSQL backend: one implementation on SQLAlchemy Core.

Durability and serialisation (checked at start-up, refused without them):

* SQLite: WAL journal, ``synchronous=FULL`` (a commit is fsynced before it returns), the
  driver's implicit transactions disabled (``isolation_level=None``) and ``BEGIN IMMEDIATE``
  emitted for every write transaction (the database write lock is taken *before* the
  neighbours are read), a busy timeout, and one writer connection per store (a process-wide
  lock per (release, action) serialises threads; ``BEGIN IMMEDIATE`` serialises processes).
  Reads use a separate small pool (WAL readers do not block the writer).
* PostgreSQL: READ COMMITTED, ``pg_advisory_xact_lock`` per (release, action) as the first
  statement of every write transaction, ``INSERT ... ON CONFLICT DO NOTHING RETURNING seq``
  (the rows actually written; if any was skipped, a re-select of the seq range shows which,
  and the whole transaction is rolled back and retried), whole-transaction retry on
  serialisation failures, deadlocks and lost connections; fsync and synchronous_commit must
  be on. Single-statement reads run in autocommit (no BEGIN/ROLLBACK round trips).

A row written in an attempt that did not commit never enters the in-process copy: a retry
re-reads the committed rows (including, after an ambiguous lost COMMIT, rows that did land)
and logs only states still missing.

Database errors come out as :class:`qveil.errors.Unavailable` (disk full, read-only, busy
beyond the timeout, connection lost) with the transaction rolled back: nothing half-written.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy import bindparam, func, select
from sqlalchemy.dialects import sqlite as _sqlite_dialect
from sqlalchemy.dialects.postgresql import Insert as PGInsert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import Insert as SQLiteInsert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, make_url
from sqlalchemy.sql.elements import BindParameter

from qveil.errors import (
    FailedPrecondition,
    IntegrityError,
    InvalidArgument,
    QveilError,
    Unavailable,
    echo,
)
from qveil.server.store import migrate
from qveil.server.store.base import (
    FullRow,
    ImportedRelease,
    ReleaseRecord,
    Retry,
    Row,
    SamplePathStore,
)
from qveil.server.store.integrity import ChainHasher
from qveil.server.store.models import STORE_ID_KEY, TableRow
from qveil.server.store.models import noise_points as NP  # noqa: N812
from qveil.server.store.models import releases as REL  # noqa: N812
from qveil.server.store.models import store_meta as META  # noqa: N812
from qveil.server.store.sql_engines import (
    Settings,
    check_settings,
    postgres_engines,
    sqlite_engine,
    sqlite_url,
)

__all__ = ["SQLStore", "advisory_key"]

_T = TypeVar("_T")

_RETRY_SQLSTATES = {"40001", "40P01"}  # serialization_failure, deadlock_detected
#: rows per SQLite insert statement (8 parameters a row: 4000 parameters, far below
#: SQLite's limit of 32766)
INSERT_CHUNK = 500


def advisory_key(release_id: str, action: int) -> int:
    """The signed 64-bit pg_advisory_xact_lock key of (release, action)."""
    d = hashlib.sha256(f"qveil.noise:{release_id}:{int(action)}".encode()).digest()
    return int.from_bytes(d[:8], "big", signed=True)


def _to_record(row: TableRow) -> ReleaseRecord:
    created = row.created_at
    if isinstance(created, str):
        created = datetime.fromisoformat(created)
    if created.tzinfo is None:
        created = created.replace(tzinfo=UTC)
    betas = tuple(float.fromhex(v) for v in json.loads(row.betas)) if row.betas else ()
    return ReleaseRecord(
        release_id=row.release_id,
        status=row.status,
        sigma=float(row.sigma),
        beta=float(row.beta),
        interval=(float(row.interval_lo), float(row.interval_hi)),
        n_actions=int(row.n_actions),
        fingerprint=row.fingerprint,
        created_at=created,
        dims=int(row.dims),
        betas=betas,
    )


def _release_row(rec: ReleaseRecord) -> dict[str, object]:
    """The releases-table row of ``rec`` (column names of ``models.releases``)."""
    return {
        "release_id": rec.release_id,
        "fingerprint": rec.fingerprint,
        "sigma": rec.sigma,
        "beta": rec.beta,
        "interval_lo": rec.interval[0],
        "interval_hi": rec.interval[1],
        "n_actions": rec.n_actions,
        "status": rec.status,
        "created_at": rec.created_at,
        "dims": rec.dims,
        "betas": json.dumps([float.hex(v) for v in rec.betas]) if rec.betas else None,
    }


class _SqlTxn:
    """One write transaction over any number of (release, action) pairs."""

    __slots__ = ("_store", "_conn", "_inserted", "_version")

    def __init__(self, store: SQLStore, conn: sa.Connection, version: object | None) -> None:
        self._store = store
        self._conn = conn
        self._inserted: int | None = None
        self._version = version

    def version(self) -> object | None:
        return self._version

    def fetch_since(self, release_id: str, action: int, hw: int) -> Sequence[Row]:
        st = self._store
        a, j = st.releases.split(release_id, action)
        if st._since_sql is not None:  # SQLite: the compiled Core select on the raw cursor
            cur = self._conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            try:
                rows: Sequence[Row] = cur.execute(st._since_sql, (release_id, a, j, hw)).fetchall()
                return rows
            finally:
                cur.close()
        res = self._conn.execute(st._q_since, {"r": release_id, "a": a, "j": j, "hw": hw})
        return [tuple(r) for r in res]

    def head(self, release_id: str, action: int) -> tuple[int, str | None]:
        a, j = self._store.releases.split(release_id, action)
        params = {"r": release_id, "a": a, "j": j}
        row = self._conn.execute(self._store._q_head, params).first()
        return (0, None) if row is None else (int(row[0]), row[1])

    def insert(self, rows: Sequence[FullRow]) -> None:
        st = self._store
        # (action, coordinate) of each path, once per path, not once per row
        sp = {k: st.releases.split(*k) for k in {(r[0], r[1]) for r in rows}}
        if st._ins_points_sql is not None:  # SQLite: the compiled Core insert, positional
            # one statement of many rows (VALUES (..), (..), ..) per chunk, not executemany:
            # sqlite3 releases the interpreter lock for every statement it steps, and a
            # committing thread on a busy server waits to get it back each time
            flat = [(r[0], *sp[r[0], r[1]], *r[2:]) for r in rows]
            inserted = 0
            for at in range(0, len(flat), INSERT_CHUNK):
                chunk = flat[at : at + INSERT_CHUNK]
                res = self._conn.exec_driver_sql(
                    st._insert_rows_sql(len(chunk)), tuple(v for row in chunk for v in row)
                )
                # the rows this statement inserted: DO NOTHING skips are not counted, so
                # all-inserted <=> the total == len(rows)
                inserted += res.rowcount
            self._inserted = inserted
            return
        res = self._conn.execute(
            st._ins_points,
            [
                {
                    "release_id": r,
                    "action": sp[r, p][0],
                    "coordinate": sp[r, p][1],
                    "seq": s,
                    "x": x,
                    "g": g,
                    "created_at": c,
                    "hash": h,
                }
                for r, p, s, x, g, c, h in rows
            ],
        )
        self._inserted = len(res.all())  # PostgreSQL: RETURNING lists the rows inserted

    def confirm(self, rows: Sequence[FullRow]) -> bool:
        if self._inserted == len(rows):  # every row is ours (SQLite row count, PG RETURNING)
            return True
        # something was skipped by ON CONFLICT DO NOTHING: re-select to say what (then retry)
        by_key: dict[tuple[str, int], list[tuple[object, ...]]] = {}
        for r in rows:
            by_key.setdefault((r[0], r[1]), []).append(tuple(r[2:]))
        for (rid, p), mine in by_key.items():
            a, j = self._store.releases.split(rid, p)
            got = self._conn.execute(
                self._store._q_range,
                {"r": rid, "a": a, "j": j, "lo": mine[0][0], "hi": mine[-1][0]},
            ).all()
            if [tuple(g) for g in got] != mine:
                return False
        return True


class SQLStore(SamplePathStore):
    """The persistent store on SQLite (``sqlite:///abs/path``) or PostgreSQL."""

    def __init__(
        self,
        url: str | URL,
        *,
        key: bytes | None = None,
        create: bool = True,
        new_ok: bool = True,
        busy_timeout: float = 30.0,
        pool_size: int = 4,
    ) -> None:
        try:
            u = make_url(url)
        except Exception as exc:  # noqa: BLE001 - any parse failure is bad input
            raise InvalidArgument(f"bad store URL {url!r}: {exc}") from None
        self._busy = float(busy_timeout)
        self._writer_lock = threading.Lock()
        self._wconn: sa.Connection | None = None
        self._wepoch = 0
        self._engines: list[sa.Engine] = []
        backend = u.get_backend_name()
        if backend == "sqlite":
            self.backend = "sqlite"
            u, identity = sqlite_url(u, url, create=create, new_ok=new_ok)
        elif backend == "postgresql":
            self.backend = "postgresql"
            if u.get_driver_name() != "psycopg":
                u = u.set(drivername="postgresql+psycopg")
            identity = f"postgresql:{u.render_as_string(hide_password=True)}"
        else:
            raise InvalidArgument(
                f"unsupported store URL scheme {u.drivername!r} (memory://, sqlite:///path, "
                "postgresql+psycopg://...)"
            )
        super().__init__(identity=identity, key=key)
        # read new rows before taking the write lock on every miss on PostgreSQL (points
        # other replicas stored are then found without the advisory lock); on SQLite only
        # on first touch (a write transaction that writes nothing costs no fsync there)
        self.committer.pre_read_always = self.backend == "postgresql"
        self._url = u
        self._build_statements()
        try:
            with self._translated("open"):
                if self.backend == "sqlite":
                    self._writer, self._reader, mig = self._sqlite_engines(pool_size)
                else:
                    self._writer, self._reader, mig = self._postgres_engines(u, pool_size)
                self.schema_revision = migrate.upgrade(
                    mig,
                    create=create,
                    read_engine=self._reader,
                    new_ok=new_ok,
                    where=f"store {identity}",
                    lock_path=self._identity.removeprefix("sqlite:")
                    if self.backend == "sqlite"
                    else None,
                )
                self.settings = self._check_settings()
                self._check_key()
        except BaseException:
            self._db_close()
            raise

    # -- engines, settings ----------------------------------------------------------------

    def _postgres_engines(self, u: URL, pool_size: int) -> tuple[sa.Engine, sa.Engine, sa.Engine]:
        """The writer (also the migration engine) and reader engines on PostgreSQL."""
        writer, reader = postgres_engines(u, busy=self._busy, pool_size=pool_size)
        return self._track(writer), self._track(reader), writer

    def _track(self, eng: sa.Engine) -> sa.Engine:
        self._engines.append(eng)
        return eng

    def _sqlite_engines(self, pool_size: int) -> tuple[sa.Engine, sa.Engine, sa.Engine]:
        """(writer, reader, migrations): the one writer connection, BEGIN IMMEDIATE (every
        write transaction holds the file's write lock from its first statement), also
        migrating; a pool of readers."""
        writer = self._sqlite_engine(pool_size=1, begin=True, implicit=False)
        reader = self._sqlite_engine(pool_size=pool_size, begin=False, implicit=False)
        return writer, reader, writer

    def _sqlite_engine(self, *, pool_size: int, begin: bool, implicit: bool) -> sa.Engine:
        """A SQLite engine with qveil's pragmas (:func:`sqlite_engine`), closed with the store."""
        return self._track(
            sqlite_engine(
                self._url, busy=self._busy, pool_size=pool_size, begin=begin, implicit=implicit
            )
        )

    def _check_settings(self) -> Settings:
        """Read back the durability settings; refuse (FailedPrecondition) without them."""
        return check_settings(
            self._writer, backend=self.backend, begin_mode=self._begin_mode, where=self._identity
        )

    def _build_statements(self) -> None:
        r: BindParameter[str] = bindparam("r")
        a: BindParameter[int] = bindparam("a")
        cols = (NP.c.seq, NP.c.x, NP.c.g, NP.c.created_at, NP.c.hash)
        j: BindParameter[int] = bindparam("j")
        mine = (NP.c.release_id == r, NP.c.action == a, NP.c.coordinate == j)
        self._q_since = select(*cols).where(*mine, NP.c.seq > bindparam("hw")).order_by(NP.c.seq)
        self._q_range = (
            select(*cols)
            .where(*mine, NP.c.seq >= bindparam("lo"), NP.c.seq <= bindparam("hi"))
            .order_by(NP.c.seq)
        )
        self._q_head = select(NP.c.seq, NP.c.hash).where(*mine).order_by(NP.c.seq.desc()).limit(1)
        self._q_all = (
            select(NP.c.action, NP.c.coordinate, *cols)
            .where(NP.c.release_id == r)
            .order_by(NP.c.action, NP.c.coordinate, NP.c.seq)
        )
        self._q_action = select(NP.c.action, NP.c.coordinate, *cols).where(*mine).order_by(NP.c.seq)
        self._q_lock = select(func.pg_advisory_xact_lock(bindparam("k", type_=sa.BigInteger)))
        points = self._points_insert()
        self._ins_points: sa.Insert = points
        if self.backend == "postgresql":  # one multi-row INSERT ... RETURNING per batch
            self._ins_points = points.returning(NP.c.seq)
        # RETURNING: the row count of INSERT .. ON CONFLICT DO NOTHING is not reliable through
        # every driver (psycopg reports -1 here); a returned key means "inserted"
        self._ins_release = self._insert(REL).on_conflict_do_nothing().returning(REL.c.release_id)
        # SQLite hot path: the same Core statement compiled once to positional SQL, executed
        # with tuples (saves SQLAlchemy's per-row parameter processing, ~10 us a row)
        self._ins_points_sql: str | None = None
        self._rows_sql: dict[int, str] = {}  # k -> the insert of k rows in one statement
        self._since_sql: str | None = None
        if self.backend == "sqlite":
            comp = self._ins_points.compile(
                dialect=_sqlite_dialect.dialect(paramstyle="qmark"),
                column_keys=[c.name for c in NP.c],
            )
            names = list(comp.positiontup or [])
            assert names == [c.name for c in NP.c], names
            self._ins_points_sql = str(comp)
            comp = self._q_since.compile(dialect=_sqlite_dialect.dialect(paramstyle="qmark"))
            assert list(comp.positiontup or []) == ["r", "a", "j", "hw"], comp.positiontup
            self._since_sql = str(comp)

    # -- error translation ----------------------------------------------------------------

    #: how a SQLite write transaction begins (reported in ``settings``)
    _begin_mode = "IMMEDIATE"

    def _insert_rows_sql(self, k: int) -> str:
        """The SQLite insert of ``k`` rows in one statement (the compiled insert with its
        VALUES tuple repeated), kept per k."""
        got = self._rows_sql.get(k)
        if got is None:
            sql = self._ins_points_sql
            assert sql is not None
            head, sep, tail = sql.partition(" VALUES ")
            one, close, rest = tail.partition(")")
            assert sep and close and one.startswith("("), sql
            got = head + sep + ", ".join([one + close] * k) + rest
            self._rows_sql[k] = got
        return got

    def _insert(self, table: sa.Table) -> SQLiteInsert | PGInsert:
        """The INSERT of ``table`` in the store's dialect (SQLite or PostgreSQL: each has
        its own ON CONFLICT clauses)."""
        return sqlite_insert(table) if self.backend == "sqlite" else pg_insert(table)

    def _points_insert(self) -> SQLiteInsert | PGInsert:
        """The insert of new rows: a row already there is skipped (ON CONFLICT DO NOTHING),
        which :meth:`_SqlTxn.confirm` then finds (a lost race, retried)."""
        return self._insert(NP).on_conflict_do_nothing()

    def _map(self, exc: sa.exc.StatementError, what: str, *, retry_lost: bool) -> Exception:
        orig = exc.orig
        where = f"store {self._identity}"
        if self.backend == "sqlite":
            name = getattr(orig, "sqlite_errorname", "") or ""
            msg = str(orig)
            if isinstance(exc, sa.exc.IntegrityError):
                return IntegrityError(f"{where}: constraint violated during {what}: {msg}")
            if name == "SQLITE_FULL" or "disk is full" in msg:
                return Unavailable(
                    f"{where}: disk full during {what}; the transaction was "
                    "rolled back, nothing was written"
                )
            if name.startswith("SQLITE_READONLY") or "readonly" in msg:
                return Unavailable(f"{where} is read-only; cannot {what} (nothing was written)")
            if name.startswith("SQLITE_BUSY") or "locked" in msg:
                return Unavailable(
                    f"{where} stayed locked beyond the busy timeout "
                    f"({self._busy:g} s) during {what}"
                )
            return Unavailable(f"{where}: database error during {what}: {msg}")
        code = getattr(orig, "sqlstate", None) or ""
        if code in _RETRY_SQLSTATES:
            return Retry(f"sqlstate {code}")
        if isinstance(exc, sa.exc.IntegrityError):
            return IntegrityError(f"{where}: constraint violated during {what}: {orig}")
        if code == "53100":
            return Unavailable(f"{where}: disk full during {what}; nothing was written")
        if code == "25006":
            return Unavailable(f"{where} is read-only; cannot {what} (nothing was written)")
        if exc.connection_invalidated or code.startswith("08") or code.startswith("57P"):
            if retry_lost:  # a read, or a write its caller repeats whole
                return Retry(f"connection lost ({orig})")  # retried on a new connection
            return Unavailable(f"{where}: database connection lost during {what}; retry it")
        return Unavailable(f"{where}: database error during {what}: {orig}")

    @contextmanager
    def _translated(self, what: str, *, retry_lost: bool = False) -> Iterator[None]:
        """Database errors as qveil's errors; a lost connection as :class:`Retry` when
        ``retry_lost`` (the caller runs the operation again on a fresh connection), else
        Unavailable."""
        try:
            yield
        except (QveilError, Retry):
            raise
        except sa.exc.DBAPIError as exc:
            raise self._map(exc, what, retry_lost=retry_lost) from exc
        except sqlite3.Error as exc:  # the hot path's raw cursor: wrap as SQLAlchemy would
            wrapped = sa.exc.DBAPIError.instance(None, None, exc, sqlite3.Error)
            raise self._map(wrapped, what, retry_lost=retry_lost) from exc
        except sa.exc.TimeoutError as exc:
            raise Unavailable(
                f"store {self._identity}: no connection free within {self._busy:g} s during {what}"
            ) from exc
        except OSError as exc:
            raise Unavailable(f"store {self._identity}: {exc} during {what}") from exc

    @contextmanager
    def _write(
        self, what: str, lock_keys: Sequence[int] = (), *, retry_lost: bool = False
    ) -> Iterator[sa.Connection]:
        """One write transaction: commit (durably) on clean exit, roll back otherwise. A lost
        connection raises :class:`Retry` when ``retry_lost`` (the caller repeats the whole
        transaction), else Unavailable."""
        if self.backend == "sqlite":
            # the one writer connection of this store, kept checked out (no pool round trip
            # per transaction); dropped and reopened after any error
            with self._writer_lock:
                ok = False
                try:
                    with self._translated(what, retry_lost=retry_lost):
                        if self._wconn is None:
                            self._wconn = self._writer.connect()
                            self._wepoch += 1  # data_version is per connection
                        with self._wconn.begin():
                            yield self._wconn
                    ok = True
                finally:
                    if not ok and self._wconn is not None:
                        try:
                            self._wconn.close()
                        except Exception:  # noqa: BLE001 - already broken
                            pass
                        self._wconn = None
            return
        with (
            self._translated(what, retry_lost=retry_lost),
            self._writer.connect() as conn,
            conn.begin(),
        ):
            if self.backend == "postgresql":
                for k in lock_keys:  # sorted by the caller: replicas never deadlock
                    conn.execute(self._q_lock, {"k": k})
            yield conn

    @contextmanager
    def _read(self, what: str) -> Iterator[sa.Connection]:
        with self._translated(what, retry_lost=True), self._reader.connect() as conn:
            yield conn

    def _read_call(self, what: str, fn: Callable[[sa.Connection], _T]) -> _T:
        """``fn(conn)`` on a reader connection; once more on a fresh one if the pooled
        connection turned out to be dead."""
        for attempt in (0, 1):
            try:
                with self._read(what) as conn:
                    return fn(conn)
            except Retry as exc:
                if attempt:
                    raise Unavailable(
                        f"store {self._identity}: database connection lost during {what} ({exc})"
                    ) from None
        raise AssertionError("unreachable")

    # -- backend hooks --------------------------------------------------------------------

    def _db_insert_release(self, rec: ReleaseRecord) -> bool:
        with self._write("create a release") as conn:
            res = conn.execute(self._ins_release, _release_row(rec))
            return res.first() is not None

    def _db_get_release(self, release_id: str) -> ReleaseRecord | None:
        row = self._read_call(
            "read a release",
            lambda c: c.execute(select(REL).where(REL.c.release_id == release_id)).first(),
        )
        return None if row is None else _to_record(row)

    def _db_list_releases(self) -> list[ReleaseRecord]:
        rows = self._read_call(
            "read releases",
            lambda c: c.execute(select(REL).order_by(REL.c.created_at, REL.c.release_id)).all(),
        )
        return [_to_record(r) for r in rows]

    def _db_set_status(self, release_id: str, status: str) -> bool:
        with self._write("set a release status") as conn:
            res = conn.execute(
                sa.update(REL).where(REL.c.release_id == release_id).values(status=status)
            )
            return bool(res.rowcount == 1)

    def _db_fetch_since(self, release_id: str, action: int, hw: int) -> Sequence[Row]:
        a, j = self.releases.split(release_id, action)
        params = {"r": release_id, "a": a, "j": j, "hw": hw}
        rows: Sequence[Row] = self._read_call(
            "read noise points", lambda c: [tuple(r) for r in c.execute(self._q_since, params)]
        )
        return rows

    def _db_fetch_since_many(
        self, release_id: str, hws: dict[int, int]
    ) -> dict[int, Sequence[Row]]:
        """SQLite: every path's statement on one pooled connection's raw cursor (one checkout,
        no SQLAlchemy per row); PostgreSQL: one statement per path (the default)."""
        if self._since_sql is None or len(hws) < 2:
            return super()._db_fetch_since_many(release_id, hws)
        sql = self._since_sql
        keys = {p: self.releases.split(release_id, p) for p in hws}

        def run(c: sa.Connection) -> dict[int, Sequence[Row]]:
            cur = c.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            try:
                return {
                    p: cur.execute(sql, (release_id, *keys[p], hw)).fetchall()
                    for p, hw in hws.items()
                }
            finally:
                cur.close()

        out: dict[int, Sequence[Row]] = self._read_call("read noise points", run)
        return out

    def _db_write_txn(self, keys: Sequence[tuple[str, int]]) -> AbstractContextManager[_SqlTxn]:
        return self._txn(keys)

    @contextmanager
    def _txn(self, keys: Sequence[tuple[str, int]]) -> Iterator[_SqlTxn]:
        lock_keys = sorted({advisory_key(r, a) for r, a in keys})
        with self._write("log new noise points", lock_keys, retry_lost=True) as conn:
            yield self._new_txn(conn)

    def _new_txn(self, conn: sa.Connection) -> _SqlTxn:
        version: object | None = None
        if self.backend == "sqlite":
            # under BEGIN IMMEDIATE: changes only when another connection committed
            dv = conn.connection.dbapi_connection.execute(  # type: ignore[union-attr]
                "PRAGMA data_version"
            ).fetchone()[0]
            version = (self._wepoch, dv)
        return _SqlTxn(self, conn, version)

    def _db_iter_rows(self, release_id: str, action: int | None) -> Iterator[tuple[int, Row]]:
        q = self._q_all if action is None else self._q_action
        params: dict[str, str | int] = {"r": release_id}
        if action is not None:
            params["a"], params["j"] = self.releases.split(release_id, action)
        d = self.releases.dims(release_id)
        # PostgreSQL streams through a server-side cursor, which needs a transaction (the
        # READ COMMITTED engine; one statement = one snapshot); SQLite reads from the pool
        eng = self._writer if self.backend == "postgresql" else self._reader
        try:
            with self._translated("read noise points", retry_lost=True), eng.connect() as conn:
                res = conn.execution_options(yield_per=20000).execute(q, params)
                for a, j, s, x, g, c, h in res:
                    yield a * d + j, (s, x, g, c, h)
        except Retry as exc:  # a lost connection mid-iteration: no silent restart
            raise Unavailable(
                f"store {self._identity}: database connection lost while reading points ({exc})"
            ) from None

    def _db_count(self, release_id: str | None, action: int | None) -> int:
        q = select(func.count()).select_from(NP)
        if release_id is not None:
            q = q.where(NP.c.release_id == release_id)
        if action is not None:
            assert release_id is not None
            a, j = self.releases.split(release_id, action)
            q = q.where(NP.c.action == a, NP.c.coordinate == j)
        return int(self._read_call("read a count", lambda c: c.execute(q).scalar_one()))

    def _db_store_id(self) -> str:
        row = self._read_call(
            "read the store id",
            lambda c: c.execute(select(META.c.value).where(META.c.key == STORE_ID_KEY)).first(),
        )
        if row is None:
            raise IntegrityError(f"store {self._identity} has no store id (store_meta)")
        return str(row[0])

    def _check_key(self) -> None:
        """The first opener records the integrity key's check value; a later opener with
        another key (or none where there was one) is refused before anything is read, with
        its own message: it is a configuration error, not tampering."""
        want = self._hasher.key_check(self.releases.store_id)
        q = select(META.c.value).where(META.c.key == "key_check")
        got = self._read_call("read the integrity key check", lambda c: c.execute(q).scalar())
        if got is None:  # the first opener since migration 0003 (written once, then only read)
            with self._write("record the integrity key check") as conn:
                conn.execute(
                    self._insert(META).on_conflict_do_nothing(), {"key": "key_check", "value": want}
                )
                got = conn.execute(q).scalar()
        if got != want:
            raise FailedPrecondition(
                f"the integrity key does not match this store ({self._identity}): "
                + (
                    "QVEIL_STORE_KEY is set, but the store was created without a key"
                    if self._hasher.keyed
                    and got == ChainHasher(None).key_check(self.releases.store_id)
                    else "check QVEIL_STORE_KEY (it must be the key the store was created with)"
                )
                + "; nothing was read or written"
            )

    def _db_meta(self, key: str) -> str | None:
        q = select(META.c.value).where(META.c.key == key)
        got = self._read_call("read the store metadata", lambda c: c.execute(q).scalar())
        return None if got is None else str(got)

    def _db_set_meta(self, values: dict[str, str], *, only_if_absent: bool) -> None:
        with self._write("write the store metadata") as conn:
            for k, v in values.items():
                stmt = self._insert(META).values(key=k, value=v)
                conn.execute(
                    stmt.on_conflict_do_nothing()
                    if only_if_absent
                    else stmt.on_conflict_do_update(index_elements=[META.c.key], set_={"value": v})
                )

    def _db_import(self, release: ImportedRelease) -> None:
        rec, rows = release.rec, release.rows
        with self._write("import a release") as conn:
            res = conn.execute(self._ins_release, _release_row(rec))
            if res.first() is None:
                raise InvalidArgument(
                    f"release {echo(rec.release_id)} already exists in this store"
                )
            for p, rs in rows.items():
                a, j = rec.split(p)
                for k in range(0, len(rs), 10000):
                    conn.execute(
                        sa.insert(NP),
                        [
                            {
                                "release_id": rec.release_id,
                                "action": a,
                                "coordinate": j,
                                "seq": s,
                                "x": x,
                                "g": g,
                                "created_at": c,
                                "hash": h,
                            }
                            for s, x, g, c, h in rs[k : k + 10000]
                        ],
                    )

    def _db_close(self) -> None:
        if self._wconn is not None:
            with self._writer_lock:
                try:
                    self._wconn.close()
                except Exception:  # noqa: BLE001
                    pass
                self._wconn = None
        for eng in self._engines:
            eng.dispose()
        self._engines.clear()

    # -- test aids --------------------------------------------------------------------------

    def _writer_scalar(self, sql: str) -> object:
        """Test aid: one statement on the writer connection (rolled back), its scalar."""
        with self._writer_lock:
            if self._wconn is None:
                self._wconn = self._writer.connect()
            try:
                return self._wconn.exec_driver_sql(sql).scalar()
            finally:
                self._wconn.rollback()

    def _sqlite_pragma_all(self, sql: str) -> None:
        """Test aid: run a PRAGMA on the writer and every pooled reader (e.g. max_page_count)."""
        self._writer_scalar(sql)
        with self._reader.connect() as conn:
            conn.exec_driver_sql(sql)
            conn.rollback()
