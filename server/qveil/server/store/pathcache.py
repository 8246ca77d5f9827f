"""The store's path cache: the in-process copy of every (release, path) and what is answered
from it.

Per path: the committed points as a dict x -> g (exact look-ups) and a sorted index
(:mod:`qveil.pathindex`, neighbours for new draws), the high-water mark (largest seq applied) and
the chain head. Values never change, so a state found in the copy is answered without the
database; :meth:`PathCache.known_values` answers a whole request that way. A request with new
states is admitted by :meth:`PathCache.reserve` (one read bringing the copies up to date,
then the quotas) and its new states go to the group committer
(:mod:`.groupcommit`); a value is answered only once it is in the copy, which happens only
after its commit, and only once the witness recorded its chain head
(:meth:`PathCache.set_witness`).
"""

from __future__ import annotations

import math
import threading
from abc import abstractmethod
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from qveil.errors import IntegrityError, InvalidArgument
from qveil.noise import validate_unit_states
from qveil.pathindex import SortedPoints
from qveil.server.store.releases import ReleaseRecord, check_action

__all__ = ["Admission", "FloatArray", "FullRow", "PathCache", "Row", "Witness"]

FloatArray = npt.NDArray[np.float64]
#: A stored row as the backends exchange it: (seq, x, g, created_at, hash hex).
Row = tuple[int, float, float, float, str]
#: A row with its key: (release_id, action, seq, x, g, created_at, hash hex).
FullRow = tuple[str, int, int, float, float, float, str]

#: ``witness(release_id, {path: (seq, head_hash_hex)})``: see :meth:`SamplePathStore.set_witness`.
Witness = Callable[[str, dict[int, tuple[int, str]]], None]


class _ActionState:
    """The in-process copy of one (release, action): every committed point with seq <= hw,
    as a dict x -> g (exact look-ups) and a :class:`SortedPoints` index (neighbours)."""

    __slots__ = ("values", "index", "hw", "head", "tip", "version", "broken", "published")

    def __init__(self, head: bytes) -> None:
        self.values: dict[float, float] = {}
        self.index = SortedPoints()
        self.hw = 0
        self.head = head
        #: (hw, head) as one reference, replaced after both: read without the path's lock
        self.tip = (0, head)
        #: the highest seq whose chain head the witness has recorded (see ``set_witness``)
        self.published = 0
        #: the backend's write-version token at which the copy was last known complete
        self.version: object | None = None
        #: why the stored log of this path was refused (a gap, a state stored twice); once
        #: set, nothing of the path is answered or drawn by this process again
        self.broken: str | None = None

    def check(self) -> None:
        """Raise IntegrityError when the path's log was refused (see ``broken``)."""
        if self.broken is not None:
            raise IntegrityError(self.broken)


class Admission(Protocol):
    """What :meth:`SamplePathStore.reserve` asks to admit a request's new points
    (``qveil.server.quotas.Quotas``)."""

    def admit(
        self,
        caller: str,
        release_id: str,
        *,
        new_states: int,
        new_points: int,
        stored: int | Callable[[], int],
        still_new: Callable[[], int] | None = None,
    ) -> int: ...


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
    _witness: Witness | None
    _witness_lock: threading.Lock
    _hasher: Any

    if TYPE_CHECKING:

        def _check_open(self) -> None: ...
        def _release(self, release_id: str) -> ReleaseRecord: ...
        def _resolve(self, rel: ReleaseRecord, wants: dict[int, list[float]]) -> None: ...

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

    def set_witness(self, witness: Witness | None) -> None:
        """Before any value with a seq above what ``witness`` last recorded for its path is
        answered, ``witness(release_id, {path: (seq, head_hash_hex)})`` records the path's
        chain head outside this store (the registry), so that a restored backup missing an
        answered point is found behind. A witness that fails makes the call fail: nothing
        is answered that the witness has not recorded."""
        self._witness = witness

    def _witnessed(self, release_id: str, sts: Sequence[tuple[int, _ActionState]]) -> None:
        """Publish the chain heads of the (path, state) pairs ``sts`` (the caller's, already
        looked up) that are ahead of the witness (no-op without one, and for paths already
        published: an integer compare per path).

        What the caller answers is in the copies now, so its seqs are at most each path's
        high-water mark now: that is what must be published. A caller that waited for the
        witness lock while another published finds its seqs covered and publishes nothing;
        so under concurrent new states one publication covers a whole group commit's
        callers, not one publication each."""
        w = self._witness
        if w is None:
            return
        need = [(p, st, st.hw) for p, st in sts if st.hw > st.published]
        if not need:
            return
        with self._witness_lock:
            if all(hw <= st.published for _, st, hw in need):
                return  # published meanwhile by another caller
            # (seq, head) of each path read as one tuple (``tip``: a commit in flight is not
            # waited for) and captured once: a commit may advance hw meanwhile, and only what
            # the witness recorded may be marked published
            ahead = []
            for p, st in sts:
                hw, head = st.tip
                if hw > st.published:
                    ahead.append((p, st, hw, head.hex()))
            if ahead:
                w(release_id, {p: (hw, head) for p, _, hw, head in ahead})
                for _, st, hw, _ in ahead:
                    st.published = max(st.published, hw)

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
                "refusing to sample against an incomplete path or answer from it (run "
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
                        f"stored state{again}; refusing to sample or answer from this path "
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
    def points_drawn(self) -> int:
        """New noise points this store object has drawn and committed since it was opened."""
        return self._drawn

    def count_new(self, release_id: str, action: int, xs: npt.ArrayLike) -> int:
        """How many distinct unit states of ``xs`` are not in the in-process copy of
        (release, action). No database read: after :meth:`refresh` it is exact (up to points
        committed meanwhile); before, it may count a point another process stored. Used to
        classify a request before anything is sampled."""
        self._check_open()
        rel = self._release(release_id)
        a = check_action(action, rel.n_paths)
        values = self._state(release_id, a).values
        return sum(1 for v in dict.fromkeys(validate_unit_states(xs).tolist()) if v not in values)

    def new_mask(self, release_id: str, action: int, xs: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """For each unit state of ``xs`` (in order, duplicates included): True when it is not
        in the in-process copy of (release, action). No database read, as :meth:`count_new`:
        a request's new states are the states with a new point on any of its paths."""
        self._check_open()
        rel = self._release(release_id)
        a = check_action(action, rel.n_paths)
        values = self._state(release_id, a).values
        xl: list[float] = validate_unit_states(xs).tolist()
        return np.fromiter((v not in values for v in xl), dtype=np.bool_, count=len(xl))

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

        ``wait=False`` (admission, :meth:`reserve`): the read takes no lock, and each path's
        rows are applied only if its lock is free, past the seqs a commit applied meanwhile;
        a path whose commit is in flight is left as it is (that commit reads what other
        writers stored under the write lock before it draws). No caller waits for another
        caller's fsync just to count its new states."""
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

    def check_paths(self, release_id: str, paths: Sequence[int]) -> None:
        """Raise as :meth:`known_values` would for these paths without looking anything up:
        the store is closed, or a path's log was refused (IntegrityError). For a caller
        answering values it kept from earlier answers of the paths."""
        self._check_open()
        for p in paths:
            st = self._states.get((release_id, p))
            if st is not None:
                st.check()

    def known_values(
        self,
        release_id: str,
        paths: Sequence[int],
        columns: Sequence[FloatArray],
        *,
        publish: bool = True,
    ) -> list[FloatArray] | None:
        """The answer to a request whose states are all stored: ``out[k][i]`` =
        g_{paths[k]}(columns[k][i]) from the in-process copies, or None as soon as one state
        of one path is not in its copy (the caller then goes through :meth:`reserve` and
        :meth:`get_or_sample_paths`). No database read, no Python per state (one C-level
        dict look-up per value); a state that is not a stored unit state (out of [0, 1],
        NaN) is simply not found. Paths are checked; a refused path raises IntegrityError.
        Chain heads ahead of the witness are published before the values are returned, as
        on every answer (:meth:`set_witness`); with ``publish=False`` (a caller that must not
        block, the event loop) a request that would need that publication gets None."""
        self._check_open()
        rel = self._release(release_id)
        out: list[FloatArray] = []
        sts: list[tuple[int, _ActionState]] = []
        for p, col in zip(paths, columns, strict=True):
            a = check_action(p, rel.n_paths)
            st = self._state(release_id, a)
            st.check()
            n = int(col.size)
            v = np.fromiter(
                map(st.values.get, col.tolist(), repeat(math.nan, n)), np.float64, count=n
            )
            if np.isnan(v).any():  # stored values are finite: NaN marks a state not stored
                return None
            out.append(v)
            sts.append((a, st))
        if not publish:
            w = self._witness
            return None if w is not None and any(st.hw > st.published for _, st in sts) else out
        self._witnessed(release_id, sts)
        return out

    def reserve(
        self,
        release_id: str,
        pairs: Sequence[tuple[int, FloatArray]],
        *,
        quotas: Admission,
        caller: str,
        rows: tuple[FloatArray, Sequence[npt.NDArray[np.intp]]] | None = None,
        refresh: bool = True,
    ) -> int:
        """Admission of a request before anything is sampled: count its new states and new
        points and reserve them under ``caller``'s budget and the release's cap
        (``quotas.admit``), returning the reservation's ticket (0: nothing new; pass it to
        ``quotas.done`` once the request's points are committed or failed), or raise
        ResourceExhausted with nothing stored.

        ``pairs``: (store path, unique unit values) of the request: each (action, coordinate)
        path with that coordinate's unique values, and ``rows``: the request's states
        [n, d] and, per pair, the index of each state's value in the pair's values (None:
        every pair holds the same unique states, each a whole state).
        A new state is a state with a new point on any path; it costs one point per new
        value of each path. Stored states pass without a database read; otherwise the
        release's copies are brought up to date first in one read (:meth:`refresh`), so
        points other processes or replicas stored are known, not new, and count against
        the cap. ``refresh=False``: the caller has just refreshed the release (one read for
        the reservations of a whole batch)."""
        rid = release_id

        def still_new() -> int:
            return sum(self.count_new(rid, p, u) for p, u in pairs)

        masks = [self.new_mask(rid, p, u) for p, u in pairs]
        if not any(m.any() for m in masks):
            return 0
        if refresh:
            self.refresh(rid, wait=False)
            masks = [self.new_mask(rid, p, u) for p, u in pairs]
        new_points = sum(int(m.sum()) for m in masks)
        if rows is None:  # every pair holds the same unique states
            new_states = int(np.logical_or.reduce(masks).sum()) if masks else 0
        else:
            xs, index = rows
            row_new = np.zeros(xs.shape[0], dtype=np.bool_)
            for m, idx in zip(masks, index, strict=True):
                row_new |= m[idx]
            k = int(row_new.sum())
            new_states = k if k <= 1 else int(np.unique(xs[row_new], axis=0).shape[0])
        return quotas.admit(
            caller,
            rid,
            new_states=new_states,
            new_points=new_points,
            stored=lambda: self.known_points(rid),
            still_new=still_new,
        )

    def get_or_sample(self, release_id: str, path: int, xs: npt.ArrayLike) -> FloatArray:
        """``g_path(x)`` for each unit state of ``xs``: :meth:`get_or_sample_paths` for one path."""
        return self.get_or_sample_paths(release_id, [path], [xs])[0]

    def get_or_sample_paths(
        self, release_id: str, paths: Sequence[int], xs: Sequence[npt.ArrayLike]
    ) -> list[FloatArray]:
        """``out[k][i] = g_{paths[k]}(xs[k][i])``: each path with its own unit states (a release
        of d coordinates: path a * d + j takes the j-th coordinates; d = 1: path a). Stored
        values as stored; new states drawn exactly given their stored neighbours, the new
        points of all the paths committed in ONE durable transaction (group commit) before
        this returns. Duplicates get one value; bad input raises InvalidArgument and stores
        nothing."""
        self._check_open()
        rel = self._release(release_id)
        ps = [check_action(p, rel.n_paths) for p in paths]
        if len(set(ps)) != len(ps) or len(ps) != len(xs):
            raise InvalidArgument("paths must be distinct, one list of states per path")
        xls: list[list[float]] = [validate_unit_states(x).tolist() for x in xs]
        return self._get_or_sample_many(rel, ps, xls)

    def _get_or_sample_many(
        self, rel: ReleaseRecord, paths: list[int], xls: list[list[float]]
    ) -> list[FloatArray]:
        """The body of :meth:`get_or_sample_paths` (paths checked and distinct, states
        validated): every path's missing states stored in ONE :meth:`_resolve` transaction,
        then each path's values read back."""
        sts = [self._state(rel.release_id, p) for p in paths]
        wants: dict[int, list[float]] = {}
        for p, st, xl in zip(paths, sts, xls, strict=True):
            st.check()
            values = st.values
            miss = [v for v in dict.fromkeys(xl) if v not in values]
            if miss:
                wants[p] = miss
        if wants:
            self._resolve(rel, wants)
        self._witnessed(rel.release_id, list(zip(paths, sts, strict=True)))
        out = []
        for st, xl in zip(sts, xls, strict=True):
            get = st.values.__getitem__
            out.append(np.array([get(v) for v in xl], dtype=np.float64))
        return out

    def cached_points(self, release_id: str, action: int) -> int:
        """How many points of (release, action) this process holds in memory."""
        st = self._states.get((release_id, int(action)))
        return 0 if st is None else len(st.values)
