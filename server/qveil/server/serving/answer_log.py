"""The answer log: what the server answered, written to the store off the answer path.

An answer is a pure function of the release and the state (:mod:`qveil.keyed`), so nothing
has to be stored before it is answered. The store keeps what was released, for audit
(``qveil audit`` recomputes every logged value from the release's key): each answered
call hands its snapped unit states and the value of every (action, coordinate) path it
used to :meth:`AnswerLog.submit`, which only appends them to a queue (the same constant work
for a state asked before and a new one: nothing public depends on it). One thread takes
everything queued at most every ``LINGER_SECONDS`` (so one take and one group commit serve
many calls, and the thread seldom competes with the answer path for the interpreter), keeps
per (release, path) each answered state once (numpy: sorted unique states and their values),
and logs those the store does not hold yet with one group commit
(:meth:`qveil.server.store.SamplePathStore.record_paths`). :meth:`AnswerLog.flush` and
:meth:`AnswerLog.close` do not wait for the linger.

If the store fails, the thread keeps what it took and tries again (at most
``MAX_PENDING_POINTS`` points are held; past that the oldest are dropped and counted). Past
``--max-stored-points`` points of a release the log stops writing that release's new points
(answers go on), counts them and warns once. A logged value that differs from the one
answered (a store that is not this release's log) is counted; ``qveil audit`` names it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from qveil.errors import IntegrityError

if TYPE_CHECKING:  # for annotations only
    from qveil.server.store.base import SamplePathStore

__all__ = ["AnswerLog", "MAX_PENDING_POINTS"]

log = logging.getLogger("qveil.server")

#: answered points held in memory while the store is unavailable
MAX_PENDING_POINTS = 2_000_000
#: seconds between attempts while the store fails
RETRY_SECONDS = 0.5
#: seconds the thread lets calls accumulate after the first one it is woken for (unless a
#: flush or close is waiting): one take and one commit per many calls
LINGER_SECONDS = 0.05

_Entry = tuple[str, npt.NDArray[np.float64], list[int], npt.NDArray[np.float64]]


class AnswerLog:
    """The background writer of answered values (see the module docstring)."""

    def __init__(self, store: SamplePathStore, *, max_points: int) -> None:
        self.store = store
        self.max_points = int(max_points)
        self._queue: deque[_Entry] = deque()
        self._wake = threading.Event()
        #: set while a flush or close waits: the thread does not linger
        self._hurry = threading.Event()
        self._flushers = 0
        self._idle = threading.Condition()
        self._busy = False
        self._stop = False
        self._thread: threading.Thread | None = None
        #: (release, path) -> (sorted unique states, their values) taken from the queue and
        #: not logged yet
        self._pending: dict[
            tuple[str, int], tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]
        ] = {}
        self._warned_full: set[str] = set()
        self._refused: set[tuple[str, int]] = set()  # paths whose log the store refused
        self._loaded: set[str] = set()  # releases whose logged points are in the copies
        #: counts for metrics and tests
        self.logged = 0
        self.unlogged = 0
        self.mismatched = 0
        self.failures = 0

    # -- the answer path ---------------------------------------------------------------------
    def submit(
        self,
        release_id: str,
        xs: npt.NDArray[np.float64],
        actions: list[int],
        coords: npt.NDArray[np.float64],
    ) -> None:
        """Queue one call's answered values: unit states ``xs`` [n, d] (snapped), the
        ``actions`` answered and ``coords`` [n, len(actions), d], g_{a d + j}(x_j)."""
        self._queue.append((release_id, xs, actions, coords))
        self._wake.set()

    @property
    def queued(self) -> int:
        """Calls submitted and not taken by the thread yet."""
        return len(self._queue)

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="qveil-answer-log", daemon=True)
            self._thread.start()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything submitted so far is logged (True) or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        with self._idle:
            self._flushers += 1
            self._hurry.set()
        self._wake.set()
        try:
            with self._idle:
                while self._queue or self._busy or self._pending:
                    left = deadline - time.monotonic()
                    if left <= 0 or self._thread is None:
                        return False
                    self._idle.wait(min(left, 0.05))
                    self._wake.set()
            return True
        finally:
            with self._idle:
                self._flushers -= 1
                if not self._flushers and not self._stop:
                    self._hurry.clear()

    def close(self, timeout: float = 10.0) -> bool:
        """Log what is queued (up to ``timeout``), then stop the thread."""
        done = self.flush(timeout)
        self._stop = True
        self._hurry.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        return done

    # -- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(timeout=RETRY_SECONDS)
            if self._queue and not self._hurry.is_set():
                self._hurry.wait(LINGER_SECONDS)  # let more calls arrive (not on flush)
            self._wake.clear()
            with self._idle:
                self._busy = True
            try:
                self._take()
                if self._pending:
                    self._write()
            except Exception:  # noqa: BLE001 - the log must outlive any one failure
                self.failures += 1
                log.warning("answer log: could not write to the store; retrying", exc_info=True)
                time.sleep(RETRY_SECONDS)
            finally:
                with self._idle:
                    self._busy = False
                    self._idle.notify_all()

    def _take(self) -> None:
        """Move the queue into ``_pending``: per (release, path), every state answered once
        (sorted; a state's value is the same in every answer, so any one is kept)."""
        pending = self._pending
        parts: dict[tuple[str, int], list[tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]]]
        parts = {}
        while self._queue:
            rid, xs, acts, coords = self._queue.popleft()
            d = xs.shape[1]
            for k, a in enumerate(acts):
                for j in range(d):
                    parts.setdefault((rid, a * d + j), []).append((xs[:, j], coords[:, k, j]))
        for key, got in parts.items():
            old = pending.get(key)
            if old is not None:
                got.insert(0, old)
            x = np.concatenate([x for x, _g in got])
            g = np.concatenate([g for _x, g in got])
            x, first = np.unique(x, return_index=True)
            pending[key] = (x, g[first])
        held = sum(x.size for x, _g in pending.values())
        while held > MAX_PENDING_POINTS and pending:
            key = next(iter(pending))
            n = pending.pop(key)[0].size
            held -= n
            self.unlogged += n

    def _write(self) -> None:
        """Log ``_pending`` release by release (one group commit each)."""
        for rid in sorted({r for r, _p in self._pending}):
            keys = sorted(k for k in self._pending if k[0] == rid)
            if rid not in self._loaded:  # what other processes and earlier runs logged
                self.store.paths.refresh(rid)
                self._loaded.add(rid)
            if self.store.paths.known_points(rid) >= self.max_points:
                n = sum(self._pending.pop(k)[0].size for k in keys)
                self.unlogged += n
                if rid not in self._warned_full:
                    self._warned_full.add(rid)
                    log.warning(
                        "answer log: release %s holds %d logged points, the cap "
                        "(--max-stored-points); answers go on, unlogged",
                        rid,
                        self.max_points,
                    )
                continue
            paths = [p for _r, p in keys]
            xs = [self._pending[k][0] for k in keys]
            gs = [self._pending[k][1] for k in keys]
            try:
                written, mismatched = self.store.record_paths(rid, paths, xs, gs)
            except IntegrityError:
                # a path whose log the store refused (a gap, a state logged twice: qveil
                # audit names it) never takes a point again: log the others path by path
                # and drop the refused path's points (counted), instead of retrying forever
                written, mismatched = self._write_paths(rid, paths, xs, gs)
            for k in keys:
                del self._pending[k]
            self.logged += written
            self.mismatched += mismatched
            if mismatched:
                log.error(
                    "answer log: %d logged value(s) of release %s differ from the values "
                    "answered: the store is not this release's log (run qveil audit)",
                    mismatched,
                    rid,
                )

    def _write_paths(
        self,
        rid: str,
        paths: list[int],
        xs: list[npt.NDArray[np.float64]],
        gs: list[npt.NDArray[np.float64]],
    ) -> tuple[int, int]:
        """``record_paths`` one path at a time; a refused path's points are counted as not
        logged (a store error other than a refusal still propagates: retried later)."""
        written = mismatched = 0
        for p, x, g in zip(paths, xs, gs, strict=True):
            try:
                w, m = self.store.record_paths(rid, [p], [x], [g])
            except IntegrityError as exc:
                self.unlogged += len(x)
                if (rid, p) not in self._refused:
                    self._refused.add((rid, p))
                    log.error("answer log: path %d of release %s is not logged: %s", p, rid, exc)
                continue
            written += w
            mismatched += m
        return written, mismatched
