"""The CartPole kernel fit on Dask distributed: time and peak memory against N and workers.

For each N: the users are collected once into a Parquet file (row groups of 10 000 users,
``qveil.trainer.distributed.collect_parquet`` on 2 local workers), then for each worker count
the fit (``qveil.trainer.kfqi.fit_kernel`` on the streamed file: the sharded operator build,
T iterations, the KRR; no noise) runs in a fresh driver process. ``workers = 1`` is the
in-process engine (no cluster); ``workers = 2`` a LocalCluster of two worker processes.
Peak memory: the driver process's peak resident set (``os.wait4``, the kernel's record) and
each worker's own peak (``getrusage`` inside the worker, before the cluster stops).

Writes the "distributed" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _report import table, write_section  # noqa: E402

COMMAND = "python benchmarks/bench_distributed.py [--users 10000,100000] [--workers 1,2]"
CONFIG = HERE.parent / "configs" / "cartpole-private.toml"


def _worker_peak() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024  # KiB -> GiB


def _child(path: str, workers: int) -> None:
    """One fit in this process: prints seconds and the workers' peak RSS as JSON."""
    from qveil.dataset_parquet import ParquetSource
    from qveil.kfqi_config import load_fqi_config
    from qveil.trainer import distributed
    from qveil.trainer.distributed import Engine
    from qveil.trainer.kfqi import fit_kernel

    peaks: list[float] = []
    opened = distributed.open_client

    def spying(engine: Engine):  # type: ignore[no-untyped-def]
        """open_client that records the workers' peak RSS before the cluster stops."""
        from contextlib import contextmanager

        @contextmanager
        def cm():  # type: ignore[no-untyped-def]
            with opened(engine) as client:
                yield client
                if client is not None:
                    peaks.extend(client.run(_worker_peak).values())

        return cm()

    distributed.open_client = spying  # type: ignore[assignment]
    t0 = time.perf_counter()
    fit = fit_kernel(load_fqi_config(CONFIG), ParquetSource(path), engine=Engine(workers=workers))
    print(json.dumps({"fit": time.perf_counter() - t0, "samples": fit.samples, "peaks": peaks}))


def _run(path: Path, workers: int) -> tuple[dict[str, object], float]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", str(path), str(workers)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{path} workers={workers}: the fit failed")
    return json.loads(out.strip().splitlines()[-1]), usage.ru_maxrss / 1024 / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--users", default="10000,100000")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--data", help="directory for the Parquet files (default: a temporary one)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]))
        return
    from qveil.trainer.distributed import Engine, collect_parquet

    data = Path(args.data or tempfile.mkdtemp(prefix="qveil-bench-"))
    rows: list[list[object]] = []
    for users in (int(v) for v in args.users.split(",")):
        path = data / f"cartpole-{users}.parquet"
        t_collect = float("nan")
        if not path.exists():
            t0 = time.perf_counter()
            collect_parquet(
                "CartPole-v1", users, 1, str(path), reward_range=(0.0, 1.0),
                engine=Engine(workers=2),
            )  # fmt: skip
            t_collect = time.perf_counter() - t0
        base = None
        for workers in (int(v) for v in args.workers.split(",")):
            r, driver = _run(path, workers)
            fit = float(r["fit"])  # type: ignore[arg-type]
            base = base or fit
            peaks = r["peaks"] or []
            worker_peak = max(peaks) if peaks else driver  # type: ignore[type-var,arg-type]
            print(f"N={users} workers={workers}: fit {fit:.1f} s, driver {driver:.2f} GiB, "
                  f"worker {worker_peak:.2f} GiB", flush=True)  # fmt: skip
            rows.append(
                [users, r["samples"], round(t_collect, 1) if workers == 1 else "", workers,
                 round(fit, 1), round(fit / base, 2), round(driver, 2), round(worker_peak, 2)]
            )  # fmt: skip
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    body = (
        f"Load average at the end of the run: {load} (2 cores shared with other work).\n\n"
        "CartPole-v1, one random-policy episode per user, configs/cartpole-private.toml; the "
        "data a Parquet file of row groups of 10 000 users (collected on 2 local workers: "
        "'collect s'). Each fit one driver process streaming the file: 'workers 1' runs the "
        "shards in the driver, 'workers 2' on a LocalCluster of two worker processes (each "
        "task reads its own row group). 'x 1 worker' is the fit time over the 1-worker "
        "fit's. 'driver GiB' is the driver's peak resident set, 'worker GiB' the largest "
        "worker's (for 1 worker: the driver, which is the worker).\n\n"
        + table(
            [
                "users",
                "samples",
                "collect s",
                "workers",
                "fit s",
                "x 1 worker",
                "driver GiB",
                "worker GiB",
            ],
            rows,
        )  # fmt: skip
    )
    write_section("distributed", "Kernel FQI on Dask: time and memory against N", COMMAND, body)


if __name__ == "__main__":
    main()
