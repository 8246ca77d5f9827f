"""Dynamic batching: small calls that must go to the store are answered together.

A call of new states costs little Python of its own, but run in its own executor thread it
competes with every other call's thread for the interpreter lock: the thread committing the
store's transaction releases that lock for each SQLite call and fsync and waits to get it
back behind the others, so the commits, and every caller waiting on them, slow down as more
calls are in flight. A :class:`Batcher` instead queues the calls on the event loop and hands
them to at most ``workers`` executor threads (one by default), each taking everything queued
so far (up to ``max_items``) and answering it with one ``run_many`` call: one store
transaction, one witness write and one database refresh per batch instead of per call. Calls
that arrive while a batch runs form the next one (the same rule as the store's group commit,
one layer up). On the reference machine one worker gathered about twice as many calls per
commit as two, and answered more calls per second (docs/benchmarks.md, "hotpath").

``run_many`` gets the queued items in arrival order and returns one outcome per item, a
result or the exception that item alone raised; an exception out of ``run_many`` itself is
every item's outcome. A caller that has gone away (its future cancelled) is skipped when the
outcome arrives; its work, already done, stays done (the store keeps what it drew).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Generic, TypeVar

__all__ = ["Batcher"]

I = TypeVar("I")  # noqa: E741 - an item, as R is a result
R = TypeVar("R")


def _settle(futures: Sequence[asyncio.Future[R]], outcomes: Sequence[R | BaseException]) -> None:
    """Give each future its outcome unless its caller has gone away (on the event loop: one
    wake-up of the loop per batch, not one per call)."""
    for fut, outcome in zip(futures, outcomes, strict=True):
        if fut.done():
            continue
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)


class Batcher(Generic[I, R]):
    """Items queued on the event loop, answered in batches by executor threads."""

    def __init__(
        self,
        executor: Executor,
        run_many: Callable[[Sequence[I]], Sequence[R | BaseException]],
        *,
        workers: int = 1,
        max_items: int = 64,
    ) -> None:
        if workers < 1 or max_items < 1:
            raise ValueError("a batcher needs at least one worker and one item per batch")
        self._executor = executor
        self._run_many = run_many
        self._workers = workers
        self._max_items = max_items
        self._lock = threading.Lock()
        self._queue: list[tuple[I, asyncio.Future[R]]] = []
        self._running = 0
        #: batches run and items answered (for tests and metrics)
        self.batches = 0
        self.items = 0

    async def submit(self, item: I) -> R:
        """Queue ``item`` and wait for its outcome."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()
        with self._lock:
            self._queue.append((item, fut))
            start = self._running < self._workers
            if start:
                self._running += 1
        if start:
            try:
                self._executor.submit(self._drain, loop)
            except BaseException:  # the executor is shut down: nothing will answer
                with self._lock:
                    self._running -= 1
                    self._queue = [(i, f) for i, f in self._queue if f is not fut]
                raise
        return await fut

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        """A worker: run batches until the queue is empty."""
        while True:
            with self._lock:
                batch = self._queue[: self._max_items]
                del self._queue[: self._max_items]
                if not batch:
                    self._running -= 1
                    return
            items = [item for item, _ in batch]
            try:
                outcomes: Sequence[R | BaseException] = self._run_many(items)
                if len(outcomes) != len(items):
                    raise RuntimeError(
                        f"a batch of {len(items)} calls got {len(outcomes)} outcomes"
                    )
            except BaseException as exc:  # noqa: BLE001 - every caller of the batch gets it
                outcomes = [exc] * len(items)
            with self._lock:
                self.batches += 1
                self.items += len(items)
            try:
                loop.call_soon_threadsafe(_settle, [fut for _, fut in batch], outcomes)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass
