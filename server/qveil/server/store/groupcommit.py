"""The store's group committer: new points of every caller, release and path that arrive
while a commit is in flight are drawn and stored together by the next write transaction.

See :mod:`qveil.server.store.base` for the transaction's steps (read what other writers
committed, draw exactly given the stored neighbours, insert, confirm, commit durably, only
then apply to the copies). :class:`GroupCommitter` is that part of
:class:`~qveil.server.store.base.SamplePathStore`; the backends give it their write
transaction (:class:`WriteTxn`).
"""

from __future__ import annotations

import math
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from qveil.errors import Unavailable, echo
from qveil.noise import sample_batch
from qveil.server.store.pathcache import FullRow, Row, _ActionState, _process_lock
from qveil.server.store.releases import ReleaseRecord

__all__ = ["GroupCommitter", "InsertRecord", "MAX_ATTEMPTS", "Retry", "WriteTxn"]

MAX_ATTEMPTS = 8


@dataclass(frozen=True, slots=True)
class InsertRecord:
    """Debug record of one insertion: what it saw (nearest committed-or-earlier-in-batch
    neighbours) when it was drawn. Used by the concurrency tests."""

    seq: int
    x: float
    g: float
    left: float | None
    right: float | None


class _GroupCommit:
    """The store's group-commit queue: (release, action) -> states waiting for the next
    transaction, the leader lock (held by the thread running a transaction) and a
    generation counter bumped (under ``cond``) after every leader's transaction."""

    __slots__ = ("queue", "rels", "queue_lock", "leader", "cond", "gen")

    def __init__(self) -> None:
        self.queue: dict[tuple[str, int], dict[float, None]] = {}
        self.rels: dict[str, ReleaseRecord] = {}
        self.queue_lock = threading.Lock()
        self.leader = threading.Lock()
        self.cond = threading.Condition(threading.Lock())
        self.gen = 0


class WriteTxn(Protocol):
    """One write transaction of a backend, holding the cross-process locks of its actions."""

    def version(self) -> object | None:
        """A token that stays equal only while no other connection commits anything (SQLite
        ``PRAGMA data_version`` with a connection epoch), or None (always re-read)."""
        ...

    def fetch_since(self, release_id: str, action: int, hw: int) -> Sequence[Row]: ...
    def head(self, release_id: str, action: int) -> tuple[int, str | None]: ...
    def insert(self, rows: Sequence[FullRow]) -> None: ...
    def confirm(self, rows: Sequence[FullRow]) -> bool: ...


class Retry(Exception):  # noqa: N818 - control flow, not an error
    """Raised inside a write attempt: roll back and run the whole transaction again."""


class GroupCommitter:
    """Group commit of new points (see the module docstring)."""

    _identity: str
    _rng: Any
    _hasher: Any
    _gc: _GroupCommit
    _drawn: int
    _drawn_guard: threading.Lock
    _insert_hook: Callable[[str, int, list[InsertRecord]], None] | None
    _pre_read_always: bool
    coalesce: bool

    if TYPE_CHECKING:

        def _state(self, release_id: str, action: int) -> _ActionState: ...
        def _apply(self, st: _ActionState, rows: Sequence[Row]) -> None: ...
        def _catch_up(self, st: _ActionState, fetch: Callable[[], Sequence[Row]]) -> None: ...
        def _db_fetch_since(self, release_id: str, action: int, hw: int) -> Sequence[Row]: ...
        def _witnessed(self, release_id: str, sts: Sequence[tuple[int, _ActionState]]) -> None: ...

    @abstractmethod
    def _db_write_txn(self, keys: Sequence[tuple[str, int]]) -> AbstractContextManager[WriteTxn]:
        """A write transaction holding the cross-process locks of the (release, action)
        ``keys`` (sorted; taken in that order); commits on clean exit (durably, before
        returning), rolls back on an exception. Backend errors come out as Unavailable /
        IntegrityError / :class:`Retry`."""

    def set_debug_hook(self, hook: Callable[[str, int, list[InsertRecord]], None] | None) -> None:
        """Test aid: after each commit, ``hook(release_id, action, records)`` with what every
        inserted point was conditioned on (draws are then made one by one; same law)."""
        self._insert_hook = hook

    def _resolve(self, rel: ReleaseRecord, wants: dict[int, list[float]]) -> None:
        """Store the states of ``wants`` (action -> states) not stored yet, in one write
        transaction, before returning (see the module docstring).

        Group commit (``coalesce``), the WAL-writer pattern: a thread queues its (release,
        action, state) triples in the store's queue, then either becomes the leader (the
        store's commit lock was free) and stores *everything queued so far, by any thread, of
        any release and action* in one transaction, or waits for the leader's commit to end
        and looks again (follower). New points that arrive while a commit is in flight thus
        go together into the next one. A caller returns only once its states are in the
        in-process copy, which happens only after the commit that holds them. If a leader's
        transaction fails, it raises to its own caller; the waiting threads' states are still
        missing, so one of them leads the next attempt with its own states again (nothing
        queued is silently dropped, nothing is answered).
        """
        rid = rel.release_id
        sts = {a: self._state(rid, a) for a in wants}
        if not self.coalesce:
            self._store_batch({(rid, a): xs for a, xs in wants.items()}, {rid: rel})
            for st in sts.values():
                st.check()
            return
        gc = self._gc
        while True:
            with gc.cond:
                gen = gc.gen
            todo = {}
            for a, xs in wants.items():
                st = sts[a]
                st.check()  # a path refused meanwhile (its log failed to load) is not waited on
                values = st.values
                left = [v for v in xs if v not in values]
                if left:
                    todo[a] = left
            if not todo:
                return  # a leader stored them all
            with gc.queue_lock:  # (re-)queue ours for the next leader
                gc.rels[rid] = rel
                for a, left in todo.items():
                    gc.queue.setdefault((rid, a), {}).update(dict.fromkeys(left))
            if gc.leader.acquire(blocking=False):
                try:
                    with gc.queue_lock:
                        batch = {k: list(v) for k, v in gc.queue.items()}
                        rels = dict(gc.rels)
                        gc.queue.clear()
                    self._store_batch(batch, rels)
                    # the witness of the whole batch, before any of its callers is woken:
                    # one publication per commit, and the next batch gathers every caller
                    # that arrived meanwhile (the callers still check it: _witnessed)
                    for r in rels:
                        self._witnessed(r, [(a, self._state(r, a)) for (r2, a) in batch if r2 == r])
                finally:
                    gc.leader.release()
                    with gc.cond:
                        gc.gen += 1
                        gc.cond.notify_all()
                continue  # ours were in that batch: the loop finds them and returns
            with gc.cond:  # a leader is committing: wait for its end (commit or failure)
                while gc.gen == gen:
                    gc.cond.wait(timeout=1.0)

    def _store_batch(
        self, batch: dict[tuple[str, int], list[float]], rels: dict[str, ReleaseRecord]
    ) -> None:
        """One write transaction storing the not-yet-stored states of ``batch`` ((release,
        action) -> states) under the locks of all its actions (process-wide thread locks
        taken in sorted order, plus the backend's cross-process locks); retried whole on a
        lost race. Points of one action are drawn in order, each conditioned on
        every point stored before it or earlier in the batch (:meth:`_draw`)."""
        keys = sorted(batch)
        locks = self._path_locks(keys)
        for lk in locks:
            lk.acquire()
        try:
            self._store_batch_locked(keys, batch, rels)
        finally:
            for lk in reversed(locks):
                lk.release()

    def _store_batch_locked(
        self,
        keys: list[tuple[str, int]],
        batch: dict[tuple[str, int], list[float]],
        rels: dict[str, ReleaseRecord],
    ) -> None:
        sts = {k: self._state(*k) for k in keys}
        for k in keys:
            st = sts[k]
            if st.broken is None and (st.hw == 0 or self._pre_read_always):
                # committed rows this process has not seen yet, read without the write lock
                # (on first touch this loads the whole action; later, other writers' rows)
                self._catch_up(st, _since(self._db_fetch_since, k, st))
        # a path whose log was refused is left out; its callers get the IntegrityError, the
        # other paths of the batch are stored
        keys = [k for k in keys if sts[k].broken is None]
        todo = {k: [v for v in batch[k] if v not in sts[k].values] for k in keys}
        todo = {k: v for k, v in todo.items() if v}
        if not todo:
            return
        last: Exception | None = None
        for attempt in range(MAX_ATTEMPTS):
            try:
                drawn: dict[tuple[str, int], tuple[list[Row], list[InsertRecord] | None]] = {}
                now = time.time()  # one created_at per transaction
                with self._db_write_txn(sorted(todo)) as tx:
                    tok = tx.version()
                    for k in sorted(todo):
                        st = sts[k]
                        if tok is None or st.version != tok:
                            self._catch_up(st, _since(tx.fetch_since, k, st))
                            if st.broken is not None:
                                continue  # refused: nothing drawn for it
                        new = [v for v in todo[k] if v not in st.values]
                        if new:
                            drawn[k] = self._draw(rels[k[0]], st, k[1], new, tx, now)
                    if not drawn:
                        return
                    rows = [(k[0], k[1], *r) for k in sorted(drawn) for r in drawn[k][0]]
                    tx.insert(rows)
                    if not tx.confirm(rows):
                        raise Retry("another writer stored rows concurrently")
                # committed durably: only now may the values be used
                with self._drawn_guard:
                    self._drawn += len(rows)
                for k in todo:
                    st = sts[k]
                    if k in drawn:
                        self._apply_committed(k, st, drawn[k][0])
                    # complete as of tok: re-read in the transaction, or nobody else wrote
                    # since, and our own rows are applied
                    st.version = tok
                for k, (_rows, seen) in drawn.items():
                    if self._insert_hook is not None and seen is not None:
                        self._insert_hook(k[0], k[1], seen)
                return
            except Retry as exc:
                last = exc
                # a lost race means some copy may be behind the database: the next attempt
                # re-reads every path under the lock, whatever the version token says
                for k in todo:
                    sts[k].version = None
                time.sleep(min(0.2, 0.002 * 2**attempt))
        where = ", ".join(f"release {echo(r)} action {a}" for r, a in sorted(todo))
        raise Unavailable(
            f"store: could not commit new noise points of {where} "
            f"after {MAX_ATTEMPTS} attempts ({last}); nothing was answered"
        )

    def _path_locks(self, keys: Sequence[tuple[str, int]]) -> list[threading.Lock]:
        """The process-wide locks of the (release, path) ``keys`` (sorted), taken in order
        around a write transaction (the backend's cross-process locks are taken inside)."""
        return [_process_lock(self._identity, r, a) for r, a in keys]

    def _chain_tail(
        self, release_id: str, st: _ActionState, path: int, tx: WriteTxn
    ) -> tuple[int, bytes]:
        """(seq, hash) the path's new rows chain onto: the copy's, complete under the lock."""
        return st.hw, st.head

    def _apply_committed(self, key: tuple[str, int], st: _ActionState, rows: list[Row]) -> None:
        """Add a committed transaction's own rows of one path to its copy."""
        self._apply(st, rows)

    def _draw(
        self,
        rel: ReleaseRecord,
        st: _ActionState,
        a: int,
        new: list[float],
        tx: WriteTxn,
        now: float,
    ) -> tuple[list[Row], list[InsertRecord] | None]:
        """Draw the distinct, not stored states ``new`` exactly, given the stored points, and
        chain their rows.

        The states are drawn, and take their seqs, in the order given, each conditioned on
        its nearest neighbours among the stored points and the batch's earlier states
        (:func:`qveil.noise.sample_batch`; the stored neighbours of the whole batch come
        from the copy's sorted index in two vectorised look-ups). Nothing enters the
        copy here: the caller applies the rows after the commit.
        """
        x = np.array(new, dtype=np.float64)
        lx, lg, rx, rg = st.index.neighbours(x)
        m = int(x.size)
        z = np.asarray(self._rng.standard_normal(m), dtype=np.float64).reshape(-1)
        if z.size != m or not np.isfinite(z).all():
            raise Unavailable("store: the normal source returned a bad draw; nothing was stored")
        g, seen_l, seen_r = sample_batch(
            x, lx, lg, rx, rg, beta=rel.path_beta(a), sigma=rel.sigma, z=z
        )
        seq, prev = self._chain_tail(rel.release_id, st, a, tx)
        xl = new
        gl: list[float] = g.tolist()
        hashes = self._hasher.links(prev, seq, xl, gl)
        rows: list[Row] = [
            (s, v, w, now, h.hex())
            for s, v, w, h in zip(range(seq + 1, seq + 1 + m), xl, gl, hashes, strict=True)
        ]
        recs = None
        if self._insert_hook is not None:  # what each draw was conditioned on (same rule)
            recs = [
                InsertRecord(
                    r[0],
                    r[1],
                    r[2],
                    None if lf == -math.inf else lf,
                    None if rt == math.inf else rt,
                )
                for r, lf, rt in zip(rows, seen_l.tolist(), seen_r.tolist(), strict=True)
            ]
        return rows, recs


def _since(
    fetch: Callable[[str, int, int], Sequence[Row]], key: tuple[str, int], st: Any
) -> Callable[[], Sequence[Row]]:
    """``fetch(release, action, hw)`` with the path's high-water mark read when it is
    called (under the catch-up's lock), not when it is built."""
    return lambda: fetch(key[0], key[1], st.hw)
