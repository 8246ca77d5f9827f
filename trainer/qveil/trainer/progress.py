"""Progress of a long job on stderr: a tqdm bar on a terminal; otherwise (a log file, a pipe,
a CI job) a plain line each time another tenth of the work is done or a few seconds have
passed, and at the end, so a job off a terminal is never silent for long."""

from __future__ import annotations

import sys
import time
from typing import Protocol

from tqdm import tqdm

__all__ = ["LOG_EVERY_FRACTION", "LOG_EVERY_SECONDS", "Progress", "progress"]

#: Off a terminal: a line when this fraction of the total is done since the last line...
LOG_EVERY_FRACTION = 0.1
#: ... or when this many seconds have passed since it (and always at the end).
LOG_EVERY_SECONDS = 5.0


class Progress(Protocol):
    """What :func:`progress` returns: a context manager counting the work done."""

    def update(self, n: int = 1) -> None: ...

    def __enter__(self) -> Progress: ...

    def __exit__(self, *exc: object) -> None: ...


class _LogLines:
    """Progress as log lines: ``DESC: UNIT DONE/TOTAL done (S s)``."""

    def __init__(self, total: int, desc: str, unit: str) -> None:
        self.total, self.desc, self.unit, self.done = total, desc, unit, 0
        self.t0 = self.last_time = time.perf_counter()
        self.last_done = 0

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.perf_counter()
        if (
            self.done >= self.total
            or self.done - self.last_done >= LOG_EVERY_FRACTION * self.total
            or now - self.last_time >= LOG_EVERY_SECONDS
        ):
            self.last_done, self.last_time = self.done, now
            print(
                f"{self.desc}: {self.unit} {self.done}/{self.total} done ({now - self.t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )

    def __enter__(self) -> _LogLines:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def progress(total: int, *, desc: str, unit: str, enabled: bool) -> Progress:
    """A context manager with ``update(n=1)``: a tqdm bar when stderr is a terminal, log
    lines otherwise (module docstring), nothing when not ``enabled``."""
    if enabled and not sys.stderr.isatty():
        return _LogLines(int(total), desc, unit)
    # tqdm ships no type information: its bar is read as untyped, and has this protocol
    bar: Progress = tqdm(total=total, disable=not enabled, unit=unit, file=sys.stderr, desc=desc)
    return bar
