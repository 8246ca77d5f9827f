"""The store's group committer: answered points of every release and path that arrive
while a commit is in flight are logged together by the next write transaction.

See :mod:`qveil.server.store.base` for the transaction's steps (read what other writers
committed, keep the states not logged yet, insert with their chain hashes, confirm, commit
durably, then apply to the copies). A store builds one :class:`GroupCommitter` over its path
cache (:mod:`.pathcache`) and hands it out as ``store.committer``; the backend gives it its
write transaction (:class:`RowWriter`, :class:`WriteTxn`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from qveil.errors import Unavailable, echo
from qveil.server.store.integrity import ChainHasher
from qveil.server.store.pathcache import FullRow, PathCache, Row, _ActionState
from qveil.server.store.releases import ReleaseRecord

__all__ = ["GroupCommitter", "MAX_ATTEMPTS", "Retry", "RowWriter", "WriteTxn"]

MAX_ATTEMPTS = 8


class _GroupCommit:
    """The store's group-commit queue: (release, action) -> {state: value} waiting for the
    next transaction, the leader lock (held by the thread running a transaction) and a
    generation counter bumped (under ``cond``) after every leader's transaction."""

    __slots__ = ("queue", "rels", "queue_lock", "leader", "cond", "gen")

    def __init__(self) -> None:
        self.queue: dict[tuple[str, int], dict[float, float]] = {}
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


class RowWriter(Protocol):
    """The backend's write transaction and row reads (:mod:`.memory`, :mod:`.sql`)."""

    def _db_fetch_since(self, release_id: str, action: int, hw: int) -> Sequence[Row]: ...

    def _db_write_txn(self, keys: Sequence[tuple[str, int]]) -> AbstractContextManager[WriteTxn]:
        """A write transaction holding the cross-process locks of the (release, action)
        ``keys`` (sorted; taken in that order); commits on clean exit (durably, before
        returning), rolls back on an exception. Backend errors come out as Unavailable /
        IntegrityError / :class:`Retry`."""
        ...


class GroupCommitter:
    """Group commit of new points (see the module docstring)."""

    def __init__(
        self, *, hasher: ChainHasher, paths: PathCache, db: RowWriter, pre_read_always: bool
    ) -> None:
        self._hasher = hasher
        self._paths = paths
        self._db = db
        #: read new rows before taking the write lock on every commit (PostgreSQL: rows other
        #: replicas stored are then found without the lock), else on first touch of a path
        self.pre_read_always = pre_read_always
        #: group commit: a writer also stores the new states other threads queued meanwhile
        self.coalesce = True
        self._gc = _GroupCommit()
        self._logged = 0
        self._logged_guard = threading.Lock()

    @property
    def points_logged(self) -> int:
        """Points this committer has written and committed since its store was opened."""
        return self._logged

    def commit(self, rel: ReleaseRecord, wants: dict[int, dict[float, float]]) -> None:
        """Log the states of ``wants`` (path -> {state: value}) not logged yet, in one write
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
        sts = {a: self._paths.state(rid, a) for a in wants}
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
                left = {v: g for v, g in xs.items() if v not in values}
                if left:
                    todo[a] = left
            if not todo:
                return  # a leader stored them all
            with gc.queue_lock:  # (re-)queue ours for the next leader
                gc.rels[rid] = rel
                for a, left in todo.items():
                    gc.queue.setdefault((rid, a), {}).update(left)
            if gc.leader.acquire(blocking=False):
                try:
                    with gc.queue_lock:
                        batch = {k: dict(v) for k, v in gc.queue.items()}
                        rels = dict(gc.rels)
                        gc.queue.clear()
                    self._store_batch(batch, rels)
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
        self, batch: dict[tuple[str, int], dict[float, float]], rels: dict[str, ReleaseRecord]
    ) -> None:
        """One write transaction logging the not-yet-logged states of ``batch`` ((release,
        path) -> {state: value}) under the locks of all its paths (process-wide thread locks
        taken in sorted order, plus the backend's cross-process locks); retried whole on a
        lost race. Points of one path take their seqs in the order given (:meth:`_rows`)."""
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
        batch: dict[tuple[str, int], dict[float, float]],
        rels: dict[str, ReleaseRecord],
    ) -> None:
        sts = {k: self._paths.state(*k) for k in keys}
        for k in keys:
            st = sts[k]
            if st.broken is None and (st.hw == 0 or self.pre_read_always):
                # committed rows this process has not seen yet, read without the write lock
                # (on first touch this loads the whole action; later, other writers' rows)
                self._paths.catch_up(st, _since(self._db._db_fetch_since, k, st))
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
                written: dict[tuple[str, int], list[Row]] = {}
                now = time.time()  # one created_at per transaction
                with self._db._db_write_txn(sorted(todo)) as tx:
                    tok = tx.version()
                    for k in sorted(todo):
                        st = sts[k]
                        if tok is None or st.version != tok:
                            self._paths.catch_up(st, _since(tx.fetch_since, k, st))
                            if st.broken is not None:
                                continue  # refused: nothing logged for it
                        new = [v for v in todo[k] if v not in st.values]
                        if new:
                            written[k] = self._rows(rels[k[0]], st, k[1], new, batch[k], tx, now)
                    if not written:
                        return
                    rows = [(k[0], k[1], *r) for k in sorted(written) for r in written[k]]
                    tx.insert(rows)
                    if not tx.confirm(rows):
                        raise Retry("another writer stored rows concurrently")
                # committed durably: only now do the rows enter the copies
                with self._logged_guard:
                    self._logged += len(rows)
                for k in todo:
                    st = sts[k]
                    if k in written:
                        self._apply_committed(k, st, written[k])
                    # complete as of tok: re-read in the transaction, or nobody else wrote
                    # since, and our own rows are applied
                    st.version = tok
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
            f"store: could not log the answered points of {where} "
            f"after {MAX_ATTEMPTS} attempts ({last})"
        )

    def _path_locks(self, keys: Sequence[tuple[str, int]]) -> list[threading.Lock]:
        """The process-wide locks of the (release, path) ``keys`` (sorted), taken in order
        around a write transaction (the backend's cross-process locks are taken inside)."""
        return [self._paths.lock(r, a) for r, a in keys]

    def _chain_tail(
        self, release_id: str, st: _ActionState, path: int, tx: WriteTxn
    ) -> tuple[int, bytes]:
        """(seq, hash) the path's new rows chain onto: the copy's, complete under the lock."""
        return st.hw, st.head

    def _apply_committed(self, key: tuple[str, int], st: _ActionState, rows: list[Row]) -> None:
        """Add a committed transaction's own rows of one path to its copy."""
        self._paths.apply(st, rows)

    def _rows(
        self,
        rel: ReleaseRecord,
        st: _ActionState,
        a: int,
        new: list[float],
        given: dict[float, float],
        tx: WriteTxn,
        now: float,
    ) -> list[Row]:
        """The chained rows of the distinct, not logged states ``new`` with their values from
        ``given``, taking seqs in the order given. Nothing enters the copy here: the caller
        applies the rows after the commit."""
        seq, prev = self._chain_tail(rel.release_id, st, a, tx)
        gl = [given[v] for v in new]
        hashes = self._hasher.links(prev, seq, new, gl)
        return [
            (s, v, w, now, h.hex())
            for s, v, w, h in zip(range(seq + 1, seq + 1 + len(new)), new, gl, hashes, strict=True)
        ]


def _since(
    fetch: Callable[[str, int, int], Sequence[Row]], key: tuple[str, int], st: _ActionState
) -> Callable[[], Sequence[Row]]:
    """``fetch(release, action, hw)`` with the path's high-water mark read when it is
    called (under the catch-up's lock), not when it is built."""
    return lambda: fetch(key[0], key[1], st.hw)
