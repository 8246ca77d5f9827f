"""The store's interface: :class:`SamplePathStore`, the durable log of answered noise values,
composed of three parts with one job each: the release registry (:mod:`.releases`: the
releases it logs and their parameters), the path cache (:mod:`.pathcache`: the in-process
copy of each path's log, :meth:`record_paths`) and the group committer (:mod:`.groupcommit`:
logged points stored durably), over a backend's ``_db_*`` hooks (:mod:`.memory`,
:mod:`.sql`).

An answer never waits for the store: it is a pure function of the release and the state
(:mod:`qveil.keyed`); the server hands what it answered to its answer log
(:mod:`qveil.server.answer_log`), whose thread calls :meth:`record_paths` off the answer
path. Every backend keeps, per (release, path), an in-process copy of the logged points: a
map x -> g plus the high-water mark (largest seq seen) and the head hash. States not in the
copy are logged by group commit (:meth:`_resolve`): the points of every release and path
that arrive while a commit is in flight are stored together by the next transaction. That
transaction holds the lock of each of its (release, path) pairs (process-wide thread locks
taken in sorted order, plus the backend's cross-process lock: SQLite ``BEGIN IMMEDIATE``,
PostgreSQL ``pg_advisory_xact_lock`` per pair, in sorted order), and *inside* it, per pair:

1. read from the database every row committed since the copy's high-water mark (seq order),
   so a point another thread, process or replica logged is not logged twice (skipped when
   the backend can tell that nobody else wrote: SQLite ``PRAGMA data_version``);
2. keep the states the copy does not hold;
3. insert their rows (seq = high-water + 1, ..., chained hashes per pair) and check they
   were all written (a row that is not ours means a lost race: roll back and retry the
   whole transaction);
4. commit durably; then add the new points to the copies.

Replicas and copies of a release answer with the same values (one key per release), so any
number of them may log into one store or each into its own; ``qveil audit`` recomputes
every logged value from the release's key.

**One value per state without a unique index.** The database table is an append log
(migration 0005): its only key is (release, action, coordinate, seq). Step 1 makes the copy
complete under the lock, so step 2 keeps only states that no committed row holds. A writer
whose copy missed a row (a bug in step 1) is still stopped by the database in step 3: its
seqs start at its high-water mark + 1, which is the missed row's seq, so that insert is
skipped by the primary key, the confirm re-select sees a row that is not its own, and the
transaction is rolled back and retried with a full re-read (the version token is dropped).
A second row for one state can therefore only come from a bug or from tampering: loading
it (:meth:`SamplePathStore._apply`) refuses the path, which this process then no longer
logs (IntegrityError, nothing written), while the other paths of
a group commit are stored; ``verify`` and ``qveil audit`` report the row.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from qveil.errors import InvalidArgument, QveilError, Unavailable
from qveil.server.store.groupcommit import (
    MAX_ATTEMPTS,
    GroupCommitter,
    Retry,
    WriteTxn,
    _GroupCommit,
)
from qveil.server.store.integrity import (
    ChainHasher,
    IntegrityReport,
    verify_chain,
)
from qveil.server.store.pathcache import (
    FloatArray,
    FullRow,
    PathCache,
    Row,
    _ActionState,
    _process_lock,
)
from qveil.server.store.releases import (
    ReleaseRecord,
    ReleaseRegistry,
    check_action,
    check_status,
    new_identity,
    validate_betas,
    validate_release_fields,
)

__all__ = [
    "MAX_ATTEMPTS",
    "FloatArray",
    "FullRow",
    "ImportedRelease",
    "StoredPoint",
    "QveilError",
    "ReleaseRecord",
    "Retry",
    "Row",
    "SamplePathStore",
    "WriteTxn",
    "check_action",
    "check_status",
    "new_identity",
    "validate_betas",
    "validate_release_fields",
]

_PRIVATE = (_ActionState, _GroupCommit, _process_lock)  # used by the backends and tests


@dataclass(frozen=True, slots=True)
class ImportedRelease:
    """A release read from an export file (:mod:`qveil.server.store.export`): its record
    and every path's rows (path -> rows in seq order), inserted together."""

    rec: ReleaseRecord
    rows: dict[int, list[Row]]


@dataclass(frozen=True, slots=True)
class StoredPoint:
    """A stored noise value: per-action insertion ``seq``, unit state ``x``, value ``g``,
    ``created_at`` (unix seconds, UTC) and its chain ``hash`` (hex)."""

    seq: int
    x: float
    g: float
    created_at: float
    hash: str

    @property
    def created_datetime(self) -> datetime:
        return datetime.fromtimestamp(self.created_at, UTC)


class SamplePathStore(ReleaseRegistry, PathCache, GroupCommitter, ABC):
    """The persistent per-(release, path) log of answered noise values (see the module
    docstring). ``key`` (bytes) makes the integrity chain an HMAC under that server key.
    """

    #: backend name ("memory", "sqlite", "postgresql")
    backend = "abstract"

    def __init__(self, *, identity: str, key: bytes | None = None) -> None:
        self._identity = identity
        self._hasher = ChainHasher(key)
        self._rel_cache: dict[str, ReleaseRecord] = {}
        self._states: dict[tuple[str, int], _ActionState] = {}
        self._states_guard = threading.Lock()
        self._closed = False
        self._drawn = 0  # points this object logged (metrics)
        self._drawn_guard = threading.Lock()
        self._pre_read_always = True
        #: group commit: a writer also stores the new states other threads queued meanwhile
        self.coalesce = True
        self._gc = _GroupCommit()

    # -- backend hooks ----------------------------------------------------------------------

    @abstractmethod
    def _db_iter_rows(self, release_id: str, action: int | None) -> Iterator[tuple[int, Row]]:
        """(action, row) in (action, seq) order."""

    @abstractmethod
    def _db_count(self, release_id: str | None, action: int | None) -> int: ...

    @abstractmethod
    def _db_import(self, release: ImportedRelease) -> None:
        """Insert a release and all its rows in one transaction (InvalidArgument if it
        exists)."""

    def _db_close(self) -> None:  # noqa: B027 - optional hook
        """Release the backend's resources (default: nothing)."""

    def iter_points(self, release_id: str, action: int) -> Iterator[StoredPoint]:
        """Stored points of one action in insertion-sequence order (read from the database)."""
        self._check_open()
        a = check_action(action, self._release(release_id).n_paths)
        for _a, (seq, x, g, c, h) in self._db_iter_rows(release_id, a):
            yield StoredPoint(seq, x, g, c, h)

    def count_points(self, release_id: str | None = None, action: int | None = None) -> int:
        self._check_open()
        if action is not None:
            if release_id is None:
                raise InvalidArgument("count_points: action needs a release_id")
            check_action(action, self._release(release_id).n_paths)
        elif release_id is not None:
            self._release(release_id)
        return self._db_count(release_id, action)

    # -- integrity ------------------------------------------------------------------

    def verify(self, release_id: str, action: int | None = None) -> IntegrityReport:
        """Recompute every chain of the release (or one action) from the database."""
        self._check_open()
        rel = self._release(release_id)
        acts = range(rel.n_paths) if action is None else [check_action(action, rel.n_paths)]
        results = []
        for a in acts:
            rows = ((s, x, g, h) for _a, (s, x, g, _c, h) in self._db_iter_rows(release_id, a))
            results.append(verify_chain(release_id, a, rows, self._hasher))
        return IntegrityReport(
            release_id=release_id,
            ok=all(r.ok for r in results),
            keyed=self._hasher.keyed,
            actions=tuple(results),
        )

    # -- lifecycle ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable("the store is closed")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._db_close()

    def __enter__(self) -> SamplePathStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._identity}>"
