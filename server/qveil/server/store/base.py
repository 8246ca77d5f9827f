"""The store: :class:`SamplePathStore`, the durable log of answered noise values, over a
backend's ``_db_*`` hooks (:mod:`.memory`, :mod:`.sql`). It composes three objects with one
job each and hands them out, as KServe's data plane is handed its model repository:

* ``store.releases``: the release registry (:mod:`.releases`: the releases it logs, their
  parameters and status, the store's identity and metadata);
* ``store.paths``: the path cache (:mod:`.pathcache`: the in-process copy of each path's
  log);
* ``store.committer``: the group committer (:mod:`.groupcommit`: logged points stored
  durably).

The store itself logs (:meth:`SamplePathStore.record_paths`) and reads the log back
(:meth:`~SamplePathStore.iter_points`, :meth:`~SamplePathStore.count_points`,
:meth:`~SamplePathStore.verify`); export and import are functions over it (:mod:`.export`).

An answer never waits for the store: it is a pure function of the release and the state
(:mod:`qveil.keyed`); the server hands what it answered to its answer log
(:mod:`qveil.server.serving.answer_log`), whose thread calls :meth:`SamplePathStore.record_paths`
off the answer path. Per (release, path), the path cache holds the logged points: a map x -> g plus
the high-water mark (largest seq seen) and the head hash. States not in the copy are logged by group
commit (:meth:`GroupCommitter.commit`): the points of every release and path that arrive while a
commit is in flight are stored together by the next transaction. That transaction holds the lock of
each of its (release, path) pairs (process-wide thread locks taken in sorted order, plus the
backend's cross-process lock: SQLite ``BEGIN IMMEDIATE``, PostgreSQL ``pg_advisory_xact_lock`` per
pair, in sorted order), and *inside* it, per pair:

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
it (:meth:`PathCache.apply`) refuses the path, which this process then no longer
logs (IntegrityError, nothing written), while the other paths of
a group commit are stored; ``verify`` and ``qveil audit`` report the row.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from qveil.errors import InvalidArgument, QveilError, Unavailable
from qveil.noise import validate_unit_states
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


class SamplePathStore(ABC):
    """The persistent per-(release, path) log of answered noise values (see the module
    docstring), over one backend. ``key`` (bytes) makes the integrity chain an HMAC under that
    server key.
    """

    #: backend name ("memory", "sqlite", "postgresql")
    backend = "abstract"

    def __init__(self, *, identity: str, key: bytes | None = None) -> None:
        self._identity = identity
        self._hasher = ChainHasher(key)
        self._closed = False
        #: the releases this store logs (:class:`ReleaseRegistry`)
        self.releases = ReleaseRegistry(self)
        #: the in-process copy of every path's log (:class:`PathCache`)
        self.paths = PathCache(
            identity=identity, hasher=self._hasher, releases=self.releases, db=self
        )
        #: logged points stored durably, many callers' in one transaction
        #: (:class:`GroupCommitter`)
        self.committer = self._new_committer()

    def _new_committer(self) -> GroupCommitter:
        """The store's group committer (a test's broken store makes its own)."""
        return GroupCommitter(hasher=self._hasher, paths=self.paths, db=self, pre_read_always=True)

    # -- backend hooks ----------------------------------------------------------------------
    # the registry's (:class:`~qveil.server.store.releases.ReleaseTable`)

    @abstractmethod
    def _db_insert_release(self, rec: ReleaseRecord) -> bool:
        """Insert; False when the id exists (nothing changed)."""

    @abstractmethod
    def _db_get_release(self, release_id: str) -> ReleaseRecord | None: ...

    @abstractmethod
    def _db_list_releases(self) -> list[ReleaseRecord]: ...

    @abstractmethod
    def _db_set_status(self, release_id: str, status: str) -> bool: ...

    @abstractmethod
    def _db_store_id(self) -> str:
        """The store's random persistent identity (``store_meta.store_id``)."""

    @abstractmethod
    def _db_meta(self, key: str) -> str | None:
        """A value of the store's key-value metadata (``store_meta``), None when absent."""

    @abstractmethod
    def _db_set_meta(self, values: dict[str, str], *, only_if_absent: bool) -> None:
        """Write metadata values in one transaction (insert, or also overwrite)."""

    # the path cache's (:class:`~qveil.server.store.pathcache.RowReader`) and the committer's
    # (:class:`~qveil.server.store.groupcommit.RowWriter`)

    @abstractmethod
    def _db_fetch_since(self, release_id: str, action: int, hw: int) -> Sequence[Row]:
        """Rows with seq > hw in seq order (a read, no lock)."""

    def _db_fetch_since_many(
        self, release_id: str, hws: dict[int, int]
    ) -> dict[int, Sequence[Row]]:
        """For each path p of ``hws``: its rows with seq > hws[p], in seq order (a read, no
        lock). Default: one :meth:`_db_fetch_since` per path; a backend overrides it with
        one connection or one statement."""
        return {p: self._db_fetch_since(release_id, p, hw) for p, hw in hws.items()}

    @abstractmethod
    def _db_write_txn(self, keys: Sequence[tuple[str, int]]) -> AbstractContextManager[WriteTxn]:
        """A write transaction holding the cross-process locks of the (release, action)
        ``keys`` (sorted; taken in that order); commits on clean exit (durably, before
        returning), rolls back on an exception. Backend errors come out as Unavailable /
        IntegrityError / :class:`Retry`."""

    # the store's own reads, and import (:mod:`.export`)

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

    # -- the log ----------------------------------------------------------------------------

    def record_paths(
        self,
        release_id: str,
        paths: Sequence[int],
        xs: Sequence[npt.ArrayLike],
        gs: Sequence[npt.ArrayLike],
    ) -> tuple[int, int]:
        """Log the answered values ``gs[k][i] = g_{paths[k]}(xs[k][i])`` (unit states on the
        release's grid): the states not logged yet of every path in ONE durable transaction
        (group commit). Returns (points written, states whose logged value differs from the
        one given: a log that is not this release's noise, which ``qveil audit`` reports).
        Bad input raises InvalidArgument and writes nothing."""
        self._check_open()
        rel = self.releases.release(release_id)
        ps = [check_action(p, rel.n_paths) for p in paths]
        if len(set(ps)) != len(ps) or len(ps) != len(xs) or len(xs) != len(gs):
            raise InvalidArgument("paths must be distinct, one list of states and values each")
        wants: dict[int, dict[float, float]] = {}
        mismatched = 0
        for p, x, g in zip(ps, xs, gs, strict=True):
            xl: list[float] = validate_unit_states(x).tolist()
            gl: list[float] = np.asarray(g, dtype=np.float64).reshape(-1).tolist()
            if len(gl) != len(xl) or not all(math.isfinite(v) for v in gl):
                raise InvalidArgument("one finite value per state")
            st = self.paths.state(release_id, p)
            st.check()
            values = st.values
            miss: dict[float, float] = {}
            for xi, gi in zip(xl, gl, strict=True):
                old = values.get(xi)
                if old is None:
                    miss[xi] = gi
                elif old != gi:
                    mismatched += 1
            if miss:
                wants[p] = miss
        before = self.committer.points_logged
        if wants:
            self.committer.commit(rel, wants)
            # states the copy did not hold before but the log did (written by another
            # process, or not loaded yet): compared once the copy holds them
            for p, miss in wants.items():
                values = self.paths.state(release_id, p).values
                mismatched += sum(1 for xi, gi in miss.items() if values.get(xi, gi) != gi)
        return self.committer.points_logged - before, mismatched

    def iter_points(self, release_id: str, action: int) -> Iterator[StoredPoint]:
        """Stored points of one action in insertion-sequence order (read from the database)."""
        self._check_open()
        a = check_action(action, self.releases.release(release_id).n_paths)
        for _a, (seq, x, g, c, h) in self._db_iter_rows(release_id, a):
            yield StoredPoint(seq, x, g, c, h)

    def count_points(self, release_id: str | None = None, action: int | None = None) -> int:
        self._check_open()
        if action is not None:
            if release_id is None:
                raise InvalidArgument("count_points: action needs a release_id")
            check_action(action, self.releases.release(release_id).n_paths)
        elif release_id is not None:
            self.releases.release(release_id)
        return self._db_count(release_id, action)

    # -- integrity ------------------------------------------------------------------

    def verify(self, release_id: str, action: int | None = None) -> IntegrityReport:
        """Recompute every chain of the release (or one action) from the database."""
        self._check_open()
        rel = self.releases.release(release_id)
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
