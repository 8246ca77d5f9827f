"""A deliberately broken SQLite store, for the tests that prove the real one's locking matters.

:class:`BrokenSQLStore` is :class:`qveil.server.store.sql.SQLStore` without serialisation:
no process-wide path locks, no group commit (one transaction per action), the driver's
implicit deferred BEGIN on a pool of writer connections (so a transaction takes the file's
write lock only at its first write, after the logged states were read), new rows chained onto
whatever head the database shows at that moment, a plain INSERT whose conflict is retried
and no confirm. Concurrent writers then decide "not logged yet" on a stale read and log one
state twice; tests/integration/test_store_concurrency.py shows that loading and ``verify``
catch it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from qveil.server.store.base import FullRow, ReleaseRecord, Retry, Row, WriteTxn
from qveil.server.store.groupcommit import GroupCommitter
from qveil.server.store.models import noise_points as NP  # noqa: N812
from qveil.server.store.models import releases as REL  # noqa: N812
from qveil.server.store.sql import SQLStore, _SqlTxn

__all__ = ["BrokenSQLStore"]


class _BrokenTxn(_SqlTxn):
    __slots__ = ()

    def head(self, release_id: str, action: int) -> tuple[int, str | None]:
        # the driver's implicit BEGIN starts here, at the first write, so the seq/head read
        # next are current but the logged states were read before (the 25 ms pause only
        # widens that race window, so a short test shows it)
        time.sleep(0.025)
        self._conn.execute(
            sa.update(REL).where(REL.c.release_id == release_id).values(status=REL.c.status)
        )
        return super().head(release_id, action)

    def confirm(self, rows: Sequence[FullRow]) -> bool:
        return True


class BrokenSQLStore(SQLStore):
    """SQLite only; see the module docstring."""

    _begin_mode = "driver-implicit DEFERRED"

    def __init__(self, url: str, **kw: Any) -> None:
        if not str(url).startswith("sqlite"):
            raise ValueError("the broken store exists for SQLite only")
        super().__init__(url, **kw)

    def _sqlite_engines(self, pool_size: int) -> tuple[sa.Engine, sa.Engine, sa.Engine]:
        writer = self._sqlite_engine(pool_size=pool_size, begin=False, implicit=True)
        reader = self._sqlite_engine(pool_size=pool_size, begin=False, implicit=False)
        return writer, reader, self._sqlite_engine(pool_size=1, begin=True, implicit=False)

    def _points_insert(self) -> Any:
        return sa.insert(NP)  # a conflict raises (and is retried, _map)

    def _map(self, exc: sa.exc.DBAPIError, what: str) -> Exception:
        if isinstance(exc, sa.exc.IntegrityError):
            return Retry(str(exc.orig))
        return super()._map(exc, what)

    @contextmanager
    def _write(
        self, what: str, lock_keys: Sequence[int] = (), *, retry_lost: bool = False
    ) -> Iterator[sa.Connection]:
        with (
            self._translated(what, retry_lost=retry_lost),
            self._writer.connect() as conn,
            conn.begin(),
        ):
            yield conn

    def _new_txn(self, conn: sa.Connection) -> _SqlTxn:
        return _BrokenTxn(self, conn, None)

    def _new_committer(self) -> GroupCommitter:
        return _BrokenCommitter(
            hasher=self._hasher, paths=self.paths, db=self, pre_read_always=True
        )


class _BrokenCommitter(GroupCommitter):
    """The group committer without its locks and group commit (see the module docstring)."""

    def _path_locks(self, keys: Sequence[tuple[str, int]]) -> list[Any]:
        return []

    def _chain_tail(self, release_id: str, st: Any, path: int, tx: WriteTxn) -> tuple[int, bytes]:
        seq, head = tx.head(release_id, path)  # whatever the head is right now
        return seq, bytes.fromhex(head) if head else self._hasher.genesis(release_id, path)

    def _apply_committed(self, key: tuple[str, int], st: Any, rows: list[Row]) -> None:
        # seqs came from the head
        self._paths.apply(st, self._db._db_fetch_since(key[0], key[1], st.hw))

    def commit(self, rel: ReleaseRecord, wants: dict[int, dict[float, float]]) -> None:
        rid = rel.release_id
        for a, xs in wants.items():  # no group commit: one transaction per path
            self._store_batch({(rid, a): xs}, {rid: rel})
            self._paths.state(rid, a).check()
