"""Shared by the concurrency tests: run one function in many threads and fail with whatever
any of them raised."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_threads(
    n: int, work: Callable[[int], None], *, together: bool = True, timeout: float | None = None
) -> None:
    """Run ``work(i)`` for i in 0 .. n - 1, one thread each (released at once behind a
    barrier when ``together``), join them all (at most ``timeout`` s each), and fail with
    every exception a thread raised."""
    barrier = threading.Barrier(n) if together else None
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            if barrier is not None:
                barrier.wait()
            work(i)
        except BaseException as exc:  # noqa: BLE001 - reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread did not finish in time"
    assert not errors, errors
