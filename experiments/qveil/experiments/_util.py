"""Small helpers shared by the experiments: a progress-bar map over processes, CSV writing, the
best OU beta of a release map computed once per map."""

from __future__ import annotations

import csv
import multiprocessing as mp
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TypeVar

import numpy as np
from tqdm.auto import tqdm

from qveil.json_types import JSONObject

R = TypeVar("R")

__all__ = [
    "default_workers",
    "mean_se",
    "progress_map",
    "write_csv",
    "write_table_and_plot",
]


def default_workers() -> int:
    """Processes to use: QVEIL_EXPERIMENT_WORKERS, else the number of CPUs (at most 2 here)."""
    env = os.environ.get("QVEIL_EXPERIMENT_WORKERS")
    if env:
        return max(1, int(env))
    return max(1, min(os.cpu_count() or 1, 4))


def _star(args: tuple[Callable[..., R], tuple[object, ...]]) -> R:
    fn, a = args
    return fn(*a)


def progress_map(
    fn: Callable[..., R], jobs: Sequence[tuple[object, ...]], *, workers: int = 1, desc: str = ""
) -> list[R]:
    """``[fn(*job) for job in jobs]`` with a tqdm bar, in ``workers`` processes (spawned, so
    torch's threads are never forked). Results keep the order of ``jobs``."""
    if workers <= 1 or len(jobs) <= 1:
        return [fn(*j) for j in tqdm(jobs, desc=desc, leave=False)]
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx) as pool:
        it: Iterable[R] = pool.map(_star, [(fn, j) for j in jobs])
        return list(tqdm(it, total=len(jobs), desc=desc, leave=False))


def write_csv(path: Path, rows: Sequence[JSONObject], fields: Sequence[str] | None = None) -> Path:
    """Write dict rows to ``path`` (columns: ``fields`` or the union of keys in order)."""
    if fields is None:
        seen: dict[str, None] = {}
        for r in rows:
            for k in r:
                seen.setdefault(k, None)
        fields = list(seen)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        wr = csv.DictWriter(fh, fieldnames=list(fields), extrasaction="ignore")
        wr.writeheader()
        wr.writerows(rows)
    return path


def write_table_and_plot(
    out: Path,
    name: str,
    rows: Sequence[JSONObject],
    plot: Callable[..., object],
) -> dict[str, Path]:
    """Write ``rows`` as ``out/name.csv`` and ``plot(rows, out/name.png)``; returns both
    paths (an experiment's result)."""
    csv_path = write_csv(out / f"{name}.csv", rows)
    png = out / f"{name}.png"
    plot(rows, png)
    return {"csv": csv_path, "png": png}


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """The mean of ``values`` and its standard error (0 for a single value)."""
    a = np.asarray(values, dtype=np.float64)
    se = float(a.std(ddof=1) / np.sqrt(a.size)) if a.size > 1 else 0.0
    return float(a.mean()), se
