"""The store's path cache: the in-process copy of every (release, path) of the answer log.

Per path: the logged points as a dict x -> g, the high-water mark (largest seq applied) and
the chain head. It is what makes "one value per state" hold without a unique index: the
store's :meth:`~qveil.server.store.base.SamplePathStore.record_paths` sends to the group
committer (:mod:`.groupcommit`) only the states the copy does not hold, and the committer
brings the copy up to date under the path's write lock before it writes. A store hands it out
as ``store.paths`` (the answer log asks it how many points a release holds, :meth:`refresh`,
:meth:`known_points`); it reads rows through the backend's hooks (:class:`RowReader`).
Nothing is answered from here: an answer is a pure function of the release
(:mod:`qveil.keyed`), and the log only keeps what was released.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from qveil.errors import IntegrityError
from qveil.server.store.integrity import ChainHasher
from qveil.server.store.releases import ReleaseRegistry

__all__ = ["FloatArray", "FullRow", "PathCache", "Row", "RowReader"]

FloatArray = npt.NDArray[np.float64]
#: A stored row as the backends exchange it: (seq, x, g, created_at, hash hex).
Row = tuple[int, float, float, float, str]
#: A row with its key: (release_id, action, seq, x, g, created_at, hash hex).
FullRow = tuple[str, int, int, float, float, float, str]


class _ActionState:
    """The in-process copy of one (release, action): every committed point with seq <= hw,
    as a dict x -> g."""

    __slots__ = ("values", "hw", "head", "tip", "version", "broken")

    def __init__(self, head: bytes) -> None:
        self.values: dict[float, float] = {}
        self.hw = 0
        self.head = head
        #: (hw, head) as one reference, replaced after both: read without the path's lock
        self.tip = (0, head)
        #: the backend's write-version token at which the copy was last known complete
        self.version: object | None = None
        #: why the stored log of this path was refused (a gap, a state stored twice); once
        #: set, nothing more of the path is logged by this process
        self.broken: str | None = None

    def check(self) -> None:
        """Raise IntegrityError when the path's log was refused (see ``broken``)."""
        if self.broken is not None:
            raise IntegrityError(self.broken)


_LOCKS: dict[tuple[str, str, int], threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _process_lock(identity: str, release_id: str, action: int) -> threading.Lock:
    key = (identity, release_id, action)
    lock = _LOCKS.get(key)
    if lock is None:
        with _LOCKS_GUARD:
            lock = _LOCKS.setdefault(key, threading.Lock())
    return lock


class RowReader(Protocol):
    """The backend's reads of logged rows (:mod:`.memory`, :mod:`.sql`)."""

    def _check_open(self) -> None: ...

    def _db_fetch_since(self, release_id: str, action: int, hw: int) -> Sequence[Row]:
        """Rows with seq > hw in seq order (a read, no lock)."""
        ...

    def _db_fetch_since_many(
        self, release_id: str, hws: dict[int, int]
    ) -> dict[int, Sequence[Row]]:
        """For each path p of ``hws``: its rows with seq > hws[p], in seq order."""
        ...


class PathCache:
    """The in-process copies of one store's paths (see the module docstring)."""

    def __init__(
        self, *, identity: str, hasher: ChainHasher, releases: ReleaseRegistry, db: RowReader
    ) -> None:
        self._identity = identity
        self._hasher = hasher
        self._releases = releases
        self._db = db
        self._states: dict[tuple[str, int], _ActionState] = {}
        self._states_guard = threading.Lock()

    def lock(self, release_id: str, path: int) -> threading.Lock:
        """The process-wide write lock of (release, path) of this store's database."""
        return _process_lock(self._identity, release_id, path)

    def state(self, release_id: str, action: int) -> _ActionState:
        """The copy of (release, path), created empty (its genesis head) on first use."""
        key = (release_id, action)
        st = self._states.get(key)
        if st is None:
            with self._states_guard:
                st = self._states.get(key)
                if st is None:
                    st = _ActionState(self._hasher.genesis(release_id, action))
                    self._states[key] = st
        return st

    @staticmethod
    def apply(st: _ActionState, rows: Sequence[Row]) -> None:
        """Add committed rows (consecutive seqs after st.hw) to the in-process copy."""
        if not rows:
            return
        values = st.values
        expect = st.hw + 1
        if [r[0] for r in rows] != list(range(expect, expect + len(rows))):
            found = next(r[0] for k, r in enumerate(rows) if r[0] != expect + k)
            st.broken = (
                f"noise log has a gap or reorder: expected seq {expect}.., found {found}; "
                "refusing to log into an incomplete path (run "
                "qveil audit)"
            )
            raise IntegrityError(st.broken)
        pairs = {r[1]: r[2] for r in rows}
        if len(pairs) != len(rows) or not values.keys().isdisjoint(pairs):
            # the append log has no unique x (migration 0005): a second row for one state is
            # a bug or tampering. The path is refused whole; the message names seqs only
            # (errors reach callers; a stored value never does)
            first: dict[float, int] = {}
            for r in rows:
                if r[1] in values or r[1] in first:
                    again = f" (also at seq {first[r[1]]})" if r[1] in first else ""
                    st.broken = (
                        f"noise log stores one state twice: the row at seq {r[0]} repeats a "
                        f"stored state{again}; refusing to log into this path "
                        "(run qveil audit)"
                    )
                    raise IntegrityError(st.broken)
                first[r[1]] = r[0]
        # the high-water mark first: a reader without the lock that finds a value in the
        # copy then sees an hw at least its seq (what the witness must have recorded)
        st.hw = expect + len(rows) - 1
        st.head = bytes.fromhex(rows[-1][4])
        st.tip = (st.hw, st.head)
        values.update(pairs)

    def catch_up(self, st: _ActionState, fetch: Callable[[], Sequence[Row]]) -> None:
        """``apply(st, fetch())``; a log refused by ``apply`` marks the path broken (its
        callers get the IntegrityError) instead of failing the other paths of the batch."""
        try:
            self.apply(st, fetch())
        except IntegrityError:
            if st.broken is None:  # not a refused log: a database error
                raise

    def known_points(self, release_id: str) -> int:
        """The release's points in the in-process copies (no database read): what
        :meth:`refresh` last loaded plus what this process committed since."""
        self._db._check_open()
        rel = self._releases.release(release_id)
        return sum(len(self.state(release_id, a).values) for a in range(rel.n_paths))

    def refresh(self, release_id: str, *, wait: bool = True) -> int:
        """Bring the in-process copies of every path of the release up to date with the
        database (rows committed by other threads, processes or replicas; the first call
        loads them) in one read (``_db_fetch_since_many``), and return the release's
        stored points, all paths. The paths' locks are held, in path order, from the read to
        the last copy updated (a commit of this process cannot interleave).

        ``wait=False``: the read takes no lock, and each path's
        rows are applied only if its lock is free, past the seqs a commit applied meanwhile;
        a path whose commit is in flight is left as it is (that commit reads what other
        writers stored under the write lock before it writes)."""
        self._db._check_open()
        rel = self._releases.release(release_id)
        paths = range(rel.n_paths)
        sts = [self.state(release_id, p) for p in paths]
        locks = [self.lock(release_id, p) for p in paths]
        if not wait:
            rows = self._db._db_fetch_since_many(
                release_id, {p: st.hw for p, st in zip(paths, sts, strict=True)}
            )
            for p, st, lk in zip(paths, sts, locks, strict=True):
                if rows[p] and lk.acquire(blocking=False):
                    try:
                        hw = st.hw
                        self.apply(st, [r for r in rows[p] if r[0] > hw])
                    finally:
                        lk.release()
            return sum(len(st.values) for st in sts)
        for lk in locks:
            lk.acquire()
        try:
            rows = self._db._db_fetch_since_many(
                release_id, {p: st.hw for p, st in zip(paths, sts, strict=True)}
            )
            for p, st in zip(paths, sts, strict=True):
                self.apply(st, rows[p])
        finally:
            for lk in reversed(locks):
                lk.release()
        return sum(len(st.values) for st in sts)

    def cached_points(self, release_id: str, action: int) -> int:
        """How many points of (release, action) this process holds in memory."""
        st = self._states.get((release_id, int(action)))
        return 0 if st is None else len(st.values)
