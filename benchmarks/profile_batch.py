"""cProfile of the store's batch path: one call of 1024 new states into an action
already holding 200k points, SQLite WAL + synchronous=FULL, as bench_newpoints.py's batch part.

    .venv/bin/python benchmarks/profile_batch.py [--calls 12] [--top 15]

Prints the profiled call's top functions by own time and the unprofiled rate of the others.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_store import RID, _release, prefill  # noqa: E402

from qveil.server.store import open_store  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=12, help="calls of 1024 new states (>= 3)")
    ap.add_argument("--top", type=int, default=15, help="profile lines to print")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "store.sqlite"
        with open_store(f"sqlite:///{path}") as s:
            _release(s)
        prefill(path, 200_000)
        shutil.copy(path, Path(d) / "copy.sqlite")  # the same file work as the benchmark
        with open_store(f"sqlite:///{path}", rng=7) as s:
            s.get_or_sample(RID, 0, [0.5])  # first touch: load the 200k points
            rng = np.random.default_rng(1)
            qs = [rng.uniform(size=1024) for _ in range(max(3, args.calls))]
            s.get_or_sample(RID, 0, qs[0])  # warm
            prof = cProfile.Profile()
            t0 = time.perf_counter()
            prof.enable()
            s.get_or_sample(RID, 0, qs[1])
            prof.disable()
            print(f"profiled call: {(time.perf_counter() - t0) * 1e3:.1f} ms")
            t0 = time.perf_counter()
            for q in qs[2:]:
                s.get_or_sample(RID, 0, q)
            dt = (time.perf_counter() - t0) / (len(qs) - 2)
            print(f"unprofiled: {1024 / dt:.0f} states/s, {dt * 1e3:.1f} ms per call")
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
