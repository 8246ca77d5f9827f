"""The store's path cache: the in-process copy of every (release, path) of the answer log.

Per path: the logged points as a dict x -> g (exact look-ups) and a sorted index
(:mod:`qveil.pathindex`, used by the audit's replay), the high-water mark (largest seq
applied) and the chain head. :meth:`PathCache.record_paths` logs answered values: a state
already in the copy is not written again (a different value there is counted as a mismatch,
which ``qveil audit`` reports), the others go to the group committer (:mod:`.groupcommit`).
Nothing is answered from here: an answer is a pure function of the release
(:mod:`qveil.keyed`), and the log only keeps what was released.
"""

from __future__ import annotations

import math
import threading
from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from qveil.errors import IntegrityError, InvalidArgument
from qveil.noise import validate_unit_states
from qveil.pathindex import SortedPoints
from qveil.server.store.releases import ReleaseRecord, check_action

__all__ = ["FloatArray", "FullRow", "PathCache", "Row"]

FloatArray = npt.NDArray[np.float64]
#: A stored row as the backends exchange it: (seq, x, g, created_at, hash hex).
Row = tuple[int, float, float, float, str]
#: A row with its key: (release_id, action, seq, x, g, created_at, hash hex).
FullRow = tuple[str, int, int, float, float, float, str]


class _ActionState:
    """The in-process copy of one (release, action): every committed point with seq <= hw,
    as a dict x -> g (exact look-ups) and a :class:`SortedPoints` index (neighbours)."""

    __slots__ = ("values", "index", "hw", "head", "tip", "version", "broken")

    def __init__(self, head: bytes) -> None:
        self.values: dict[float, float] = {}
        self.index = SortedPoints()
        self.hw = 0
        self.head = head
        #: (hw, head) as one reference, replaced after both: read without the path's lock
        self.tip = (0, head)
        #: the backend's write-version token at which the copy was last known complete
        self.version: object | None = None
        #: why the stored log of this path was refused (a gap, a state stored twice); once
        #: set, nothing of the path is answered or drawn by this process again
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


class PathCache:
    """The in-process copies and the answers from them (see the module docstring)."""

    _identity: str
    _states: dict[tuple[str, int], _ActionState]
    _states_guard: threading.Lock
    _drawn: int
    _hasher: Any

    if TYPE_CHECKING:

        def _check_open(self) -> None: ...
        def _release(self, release_id: str) -> ReleaseRecord: ...
        def _resolve(self, rel: ReleaseRecord, wants: dict[int, dict[float, float]]) -> None: ...

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

    def _state(self, release_id: str, action: int) -> _ActionState:
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
    def _apply(st: _ActionState, rows: Sequence[Row]) -> None:
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
        st.index.add(pairs)

    def _catch_up(self, st: _ActionState, fetch: Callable[[], Sequence[Row]]) -> None:
        """``_apply(st, fetch())``; a log refused by ``_apply`` marks the path broken (its
        callers get the IntegrityError) instead of failing the other paths of the batch."""
        try:
            self._apply(st, fetch())
        except IntegrityError:
            if st.broken is None:  # not a refused log: a database error
                raise

    @property
    def points_logged(self) -> int:
        """Points this store object has logged and committed since it was opened."""
        return self._drawn

    def known_points(self, release_id: str) -> int:
        """The release's points in the in-process copies (no database read): what
        :meth:`refresh` last loaded plus what this process committed since."""
        self._check_open()
        rel = self._release(release_id)
        return sum(len(self._state(release_id, a).values) for a in range(rel.n_paths))

    def refresh(self, release_id: str, *, wait: bool = True) -> int:
        """Bring the in-process copies of every path of the release up to date with the
        database (rows committed by other threads, processes or replicas; the first call
        loads them) in one read (:meth:`_db_fetch_since_many`), and return the release's
        stored points, all paths. The paths' locks are held, in path order, from the read to
        the last copy updated (a commit of this process cannot interleave).

        ``wait=False``: the read takes no lock, and each path's
        rows are applied only if its lock is free, past the seqs a commit applied meanwhile;
        a path whose commit is in flight is left as it is (that commit reads what other
        writers stored under the write lock before it writes)."""
        self._check_open()
        rel = self._release(release_id)
        paths = range(rel.n_paths)
        sts = [self._state(release_id, p) for p in paths]
        locks = [_process_lock(self._identity, release_id, p) for p in paths]
        if not wait:
            rows = self._db_fetch_since_many(
                release_id, {p: st.hw for p, st in zip(paths, sts, strict=True)}
            )
            for p, st, lk in zip(paths, sts, locks, strict=True):
                if rows[p] and lk.acquire(blocking=False):
                    try:
                        hw = st.hw
                        self._apply(st, [r for r in rows[p] if r[0] > hw])
                    finally:
                        lk.release()
            return sum(len(st.values) for st in sts)
        for lk in locks:
            lk.acquire()
        try:
            rows = self._db_fetch_since_many(
                release_id, {p: st.hw for p, st in zip(paths, sts, strict=True)}
            )
            for p, st in zip(paths, sts, strict=True):
                self._apply(st, rows[p])
        finally:
            for lk in reversed(locks):
                lk.release()
        return sum(len(st.values) for st in sts)

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
        rel = self._release(release_id)
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
            st = self._state(release_id, p)
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
        before = self._drawn
        if wants:
            self._resolve(rel, wants)
            # states the copy did not hold before but the log did (written by another
            # process, or not loaded yet): compared once the copy holds them
            for p, miss in wants.items():
                values = self._state(release_id, p).values
                mismatched += sum(1 for xi, gi in miss.items() if values.get(xi, gi) != gi)
        return self._drawn - before, mismatched

    def cached_points(self, release_id: str, action: int) -> int:
        """How many points of (release, action) this process holds in memory."""
        st = self._states.get((release_id, int(action)))
        return 0 if st is None else len(st.values)
