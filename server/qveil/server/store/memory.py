"""In-memory backend: for training, tests and experiments (nothing survives the process).

``memory://`` is a fresh, private store; ``memory://NAME`` names a process-global store, so
closing and reopening the same name sees the same data (as a file would).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from qveil.errors import InvalidArgument, echo
from qveil.server.store.base import (
    FullRow,
    ImportedRelease,
    ReleaseRecord,
    Row,
    SamplePathStore,
    new_identity,
)

__all__ = ["MemoryStore"]


class _MemData:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.releases: dict[str, ReleaseRecord] = {}
        self.rows: dict[tuple[str, int], list[Row]] = {}
        self.store_id = uuid.uuid4().hex  # volatile like the rest: a new store per process
        self.meta: dict[str, str] = {}


_NAMED: dict[str, _MemData] = {}
_NAMED_GUARD = threading.Lock()


class _MemTxn:
    def __init__(self, data: _MemData) -> None:
        self._data = data
        self.staged: list[FullRow] = []

    def version(self) -> object | None:
        return None

    def fetch_since(self, release_id: str, action: int, hw: int) -> Sequence[Row]:
        return list(self._data.rows.get((release_id, action), ())[hw:])

    def head(self, release_id: str, action: int) -> tuple[int, str | None]:
        rows = self._data.rows.get((release_id, action), [])
        return (rows[-1][0], rows[-1][4]) if rows else (0, None)

    def insert(self, rows: Sequence[FullRow]) -> None:
        self.staged.extend(rows)

    def confirm(self, rows: Sequence[FullRow]) -> bool:
        return True


class MemoryStore(SamplePathStore):
    backend = "memory"

    def __init__(self, name: str = "", *, key: bytes | None = None) -> None:
        if name:
            with _NAMED_GUARD:
                self._data = _NAMED.setdefault(name, _MemData())
            identity = f"memory:{name}"
        else:
            self._data = _MemData()
            identity = new_identity("memory")
        super().__init__(identity=identity, key=key)

    def _db_insert_release(self, rec: ReleaseRecord) -> bool:
        with self._data.lock:
            if rec.release_id in self._data.releases:
                return False
            self._data.releases[rec.release_id] = rec
            return True

    def _db_get_release(self, release_id: str) -> ReleaseRecord | None:
        return self._data.releases.get(release_id)

    def _db_list_releases(self) -> list[ReleaseRecord]:
        with self._data.lock:
            return sorted(self._data.releases.values(), key=lambda r: r.created_at)

    def _db_set_status(self, release_id: str, status: str) -> bool:
        with self._data.lock:
            rec = self._data.releases.get(release_id)
            if rec is None:
                return False
            self._data.releases[release_id] = replace(rec, status=status)
            return True

    def _db_fetch_since(self, release_id: str, action: int, hw: int) -> Sequence[Row]:
        with self._data.lock:
            return list(self._data.rows.get((release_id, action), ())[hw:])

    @contextmanager
    def _db_write_txn(self, keys: Sequence[tuple[str, int]]) -> Iterator[_MemTxn]:
        with self._data.lock:
            tx = _MemTxn(self._data)
            yield tx
            for r, a, *row in tx.staged:  # "commit": all rows or none
                self._data.rows.setdefault((r, a), []).append(tuple(row))  # type: ignore[arg-type]

    def _db_iter_rows(self, release_id: str, action: int | None) -> Iterator[tuple[int, Row]]:
        with self._data.lock:
            keys = sorted(
                k
                for k in self._data.rows
                if k[0] == release_id and (action is None or k[1] == action)
            )
            snap = [(k[1], list(self._data.rows[k])) for k in keys]
        for a, rows in snap:
            for r in rows:
                yield a, r

    def _db_count(self, release_id: str | None, action: int | None) -> int:
        with self._data.lock:
            return sum(
                len(v)
                for k, v in self._data.rows.items()
                if (release_id is None or k[0] == release_id) and (action is None or k[1] == action)
            )

    def _db_import(self, release: ImportedRelease) -> None:
        rec, rows = release.rec, release.rows
        with self._data.lock:
            if rec.release_id in self._data.releases:
                raise InvalidArgument(
                    f"release {echo(rec.release_id)} already exists in this store"
                )
            self._data.releases[rec.release_id] = rec
            for a, rs in rows.items():
                if rs:
                    self._data.rows[(rec.release_id, a)] = list(rs)

    def _db_store_id(self) -> str:
        return self._data.store_id

    def _db_meta(self, key: str) -> str | None:
        return self._data.meta.get(key)

    def _db_set_meta(self, values: dict[str, str], *, only_if_absent: bool) -> None:
        with self._data.lock:
            for k, v in values.items():
                if not only_if_absent or k not in self._data.meta:
                    self._data.meta[k] = v
