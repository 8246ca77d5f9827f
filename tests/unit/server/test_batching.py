"""The data plane's dynamic batching (qveil.server.protocol.batching.Batcher) on a real event
loop and a real thread pool: every caller gets its own item's outcome, batches form while a
batch runs, no more batches run at once than the workers allowed, a failure of one item or
of the whole batch reaches exactly its callers, and a caller that went away hurts nobody."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from qveil.server.protocol.batching import Batcher


class Recorder:
    """A ``run_many`` that doubles its items, slowly, recording its batches and the most
    batches it saw running at once; item -1 fails alone, item -2 fails its whole batch."""

    def __init__(self, delay: float = 0.02) -> None:
        self.delay = delay
        self.batches: list[list[int]] = []
        self.running = 0
        self.most = 0
        self.lock = threading.Lock()

    def __call__(self, items: Sequence[int]) -> list[int | BaseException]:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.batches.append(list(items))
        try:
            time.sleep(self.delay)
            if -2 in items:
                raise RuntimeError("the whole batch failed")
            return [ValueError(f"item {i}") if i == -1 else 2 * i for i in items]
        finally:
            with self.lock:
                self.running -= 1


async def _gather(batcher: Batcher[int, int], items: Sequence[int]) -> list[object]:
    async def one(i: int) -> object:
        try:
            return await batcher.submit(i)
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            return exc

    return list(await asyncio.gather(*(one(i) for i in items)))


@pytest.mark.parametrize("workers", [1, 2])
def test_every_caller_gets_its_own_outcome_in_batches(workers: int) -> None:
    rec = Recorder()
    with ThreadPoolExecutor(8) as pool:
        b: Batcher[int, int] = Batcher(pool, rec, workers=workers, max_items=16)
        items = list(range(100))
        out = asyncio.run(_gather(b, items))
    assert out == [2 * i for i in items]
    assert sorted(i for batch in rec.batches for i in batch) == items  # each item once
    assert rec.most <= workers
    assert max(len(batch) for batch in rec.batches) <= 16
    assert len(rec.batches) < len(items) / 4  # calls arriving during a batch join the next
    assert b.batches == len(rec.batches) and b.items == len(items)


def test_a_failing_item_or_batch_reaches_only_its_callers() -> None:
    rec = Recorder()
    with ThreadPoolExecutor(4) as pool:
        b: Batcher[int, int] = Batcher(pool, rec, workers=1, max_items=4)
        out = asyncio.run(_gather(b, [1, -1, 3, 4, 5, -2, 7, 8, 9]))
    assert isinstance(out[1], ValueError) and str(out[1]) == "item -1"
    failed = next(batch for batch in rec.batches if -2 in batch)
    for i, got in zip([1, -1, 3, 4, 5, -2, 7, 8, 9], out, strict=True):
        if i in failed:
            assert isinstance(got, RuntimeError) and "whole batch" in str(got)
        elif i != -1:
            assert got == 2 * i


def test_a_caller_that_went_away_hurts_nobody() -> None:
    """Cancelled callers (a client that hung up) are skipped when their batch ends; the
    others of the batch and later callers are answered, and the worker stays usable."""
    rec = Recorder(delay=0.05)

    async def scenario() -> tuple[list[object], list[object]]:
        with ThreadPoolExecutor(4) as pool:
            b: Batcher[int, int] = Batcher(pool, rec, workers=1)
            first = asyncio.create_task(b.submit(0))  # occupies the worker
            await asyncio.sleep(0.01)
            tasks = [asyncio.create_task(b.submit(i)) for i in range(1, 7)]
            await asyncio.sleep(0.01)
            for t in tasks[::2]:
                t.cancel()
            got = await asyncio.gather(first, *tasks, return_exceptions=True)
            later = await _gather(b, [10, 11])
            return list(got), later

    got, later = asyncio.run(scenario())
    assert got[0] == 0
    for i, g in enumerate(got[1:], start=1):
        assert isinstance(g, asyncio.CancelledError) if i % 2 else g == 2 * i
    assert later == [20, 22]


def test_a_batcher_needs_a_worker_and_an_item() -> None:
    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(ValueError, match="at least one worker"):
            Batcher(pool, Recorder(), workers=0)
        with pytest.raises(ValueError, match="at least one worker"):
            Batcher(pool, Recorder(), max_items=0)


def test_a_call_after_the_executor_shut_down_is_refused_and_leaves_nothing_queued() -> None:
    pool = ThreadPoolExecutor(1)
    b: Batcher[int, int] = Batcher(pool, Recorder())
    pool.shutdown()

    async def late() -> None:
        with pytest.raises(RuntimeError, match="shutdown"):
            await b.submit(1)

    asyncio.run(late())
    assert b._queue == [] and b._running == 0
