"""The CartPole kernel fit on Dask distributed: time and peak memory against N and workers.

For each N: the users are collected once into a Parquet file (row groups of 10 000 users) by
``qveil dataset collect --workers 2`` (a subprocess: the real CLI); then, ``--repeat`` times,
for each worker count in turn (the configurations interleaved, so that a change of the
machine's load hits them alike), one fresh driver process fits the file
(``qveil.trainer.kfqi.fit_kernel``: the sharded operator build, T iterations, the KRR) and
writes a release of it (``write_kernel_release``, epsilon 0.5: accountant, bundle, verify).
``workers = 1`` is the in-process engine (no cluster); ``workers = 2`` a LocalCluster of two
worker processes. Each process's peak resident set is measured from outside
(``_proctree.run_tree``: every process of the tree polled for ``VmHWM``; 'total' the largest
sum of the tree's resident sets at one instant); 'CPU s' is the user + system time of the
driver and every process it started. The load average is read before each run.

Results are appended to ``DATA/bench_distributed.jsonl`` (one line per collection or fit),
so a long plan can be run in parts (``--users 1000000 --workers 1``, then ``--workers 2``);
the docs section is written from every line of that file (``--report`` only writes it).

Writes the "distributed" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from math import nan
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _proctree import GIB, run_tree  # noqa: E402
from _report import load_average, table, write_section  # noqa: E402

COMMAND = (
    "python benchmarks/bench_distributed.py --data DIR [--users 10000,100000,1000000] "
    "[--workers 1,2] [--repeat R]"
)
CONFIG = HERE.parent / "configs" / "cartpole-private.toml"
EPSILON = 0.5
QVEIL = str(Path(sys.executable).with_name("qveil"))


def _child(path: str, workers: int, out: str) -> None:
    """One fit and one release in this process: prints the seconds of each as JSON."""
    from qveil.dataset_parquet import ParquetSource
    from qveil.kfqi_config import load_fqi_config
    from qveil.trainer.distributed import Engine
    from qveil.trainer.kfqi import fit_kernel, write_kernel_release

    cfg = load_fqi_config(CONFIG)
    t0 = time.perf_counter()
    fit = fit_kernel(cfg, ParquetSource(path), engine=Engine(workers=workers, progress=True))
    t_fit = time.perf_counter() - t0
    t0 = time.perf_counter()
    rel = write_kernel_release(fit, Path(out) / "bundle", epsilon=EPSILON)
    t_release = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "fit": t_fit,
                "release": t_release,
                "samples": fit.samples,
                "sigma": float(rel.card["sigma"]),
            }
        )
    )


def _memory(run: Any) -> dict[str, Any]:
    return {
        "driver_gib": run.root_peak / GIB,
        "worker_gib": [w / GIB for w in run.workers()],
        "others_gib": [[lab, v / GIB] for lab, v in run.others()],
        "total_gib": run.total_peak / GIB,
        "cpu_s": run.cpu,
        "driver_cpu_s": run.cpus.get(run.root, 0.0),
        "worker_cpu_s": run.worker_cpus(),
    }


def _collect(path: Path, users: int, log: Path) -> None:
    load = load_average()
    cmd = [
        QVEIL, "dataset", "collect", "--env", "CartPole-v1", "--users", str(users),
        "--seed", "0", "--reward-range", "0,1", "--workers", "2", "--out", str(path),
    ]  # fmt: skip
    run = run_tree(cmd)
    if run.returncode != 0:
        raise SystemExit(f"collect of {users} users failed")
    samples = int(run.stdout.split(" samples")[0].rsplit(" ", 1)[1])
    row = {"kind": "collect", "users": users, "samples": samples, "workers": 2,
           "seconds": run.seconds, "load": load, **_memory(run)}  # fmt: skip
    _append(log, row)


def _fit(path: Path, users: int, workers: int, rep: int, log: Path) -> None:
    load = load_average()
    with tempfile.TemporaryDirectory(prefix="qveil-bench-release-") as tmp:
        run = run_tree([sys.executable, __file__, "--child", str(path), str(workers), tmp])
    if run.returncode != 0:
        raise SystemExit(f"{path} workers={workers}: the fit failed")
    r = json.loads(run.stdout.strip().splitlines()[-1])
    row = {"kind": "fit", "users": users, "samples": r["samples"], "workers": workers,
           "rep": rep, "seconds": r["fit"], "release_s": r["release"], "load": load,
           **_memory(run)}  # fmt: skip
    _append(log, row)


def _append(log: Path, row: dict[str, Any]) -> None:
    print(json.dumps(row), flush=True)
    with log.open("a") as fh:
        fh.write(json.dumps(row) + "\n")


def _gib(v: float) -> str:
    return f"{v:.2f}"


def _collect_rows(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """The collection table: the last collect run of each N."""
    collects = {r["users"]: r for r in rows if r["kind"] == "collect"}
    return [
        [r["users"], r["samples"], r["workers"], round(r["seconds"]), _gib(r["driver_gib"]),
         " / ".join(_gib(w) for w in r["worker_gib"]), _gib(r["total_gib"]), r["load"]]
        for _, r in sorted(collects.items())
    ]  # fmt: skip


def _fit_rows(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """The fit table: every fit run, with its time and busiest CPU over the 1-worker run's."""
    fits = [r for r in rows if r["kind"] == "fit"]
    ftab: list[list[Any]] = []
    for users in sorted({r["users"] for r in fits}):
        mine = [r for r in fits if r["users"] == users]

        def base(r: dict[str, Any], key: str, mine: list[dict[str, Any]] = mine) -> float:
            """The same rep's 1-worker figure (else the median over reps)."""
            one = [x for x in mine if x["workers"] == 1 and not x.get("note")]
            same = [x[key] for x in one if x.get("rep", 0) == r.get("rep", 0)]
            return float(same[0] if same else statistics.median([x[key] for x in one] or [nan]))

        for r in sorted(mine, key=lambda r: (r.get("rep", 0), r["workers"])):
            busiest = max([r.get("driver_cpu_s", r["cpu_s"]), *r.get("worker_cpu_s", [])])
            ftab.append(
                [users, r["samples"], r["workers"], r.get("rep", 0),
                 f"{r['seconds']:.1f}" + (f" ({r['note']})" if r.get("note") else ""),
                 round(r["seconds"] / base(r, "seconds"), 2) if not r.get("note") else "",
                 round(busiest / base(r, "cpu_s"), 2) if not r.get("note") else "",
                 round(r["cpu_s"]),
                 " / ".join(str(round(c)) for c in
                            [r["driver_cpu_s"], *r["worker_cpu_s"]])
                 if "driver_cpu_s" in r else "-",
                 round(r["release_s"], 1) if r.get("release_s") is not None else "-",
                 _gib(r["driver_gib"]), " / ".join(_gib(w) for w in r["worker_gib"]) or "-",
                 _gib(r["total_gib"]), r["load"]]
            )  # fmt: skip
    return ftab


def _next_rep(log: Path, users: int) -> int:
    """One more than the highest rep of the fits of ``users`` already in ``log`` (0 if none)."""
    if not log.exists():
        return 0
    reps = [
        int(r.get("rep", 0))
        for r in (json.loads(line) for line in log.read_text().splitlines() if line.strip())
        if r.get("kind") == "fit" and r.get("users") == users
    ]
    return max(reps, default=-1) + 1


def _report(log: Path) -> None:
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    ctab = _collect_rows(rows)
    ftab = _fit_rows(rows)
    body = (
        "CartPole-v1, one random-policy episode per user (seed 0), "
        "configs/cartpole-private.toml. **Collection** (`qveil dataset collect --workers 2`, "
        "Parquet, row groups of 10 000 users):\n\n"
        + table(
            [
                "users",
                "samples",
                "workers",
                "collect s",
                "driver GiB",
                "worker GiB (each)",
                "total GiB",
                "load before (1, 5, 15 min)",
            ],
            ctab,
        )  # fmt: skip
        + "\n\n**Fit and release**: one driver process streams the file and fits "
        "('workers 1': the shards in the driver; 'workers 2': a LocalCluster of two worker "
        "processes, each task reading its own row group), then writes a release at epsilon "
        f"{EPSILON:g} ('release s'). 'x 1 worker' is the fit time over the 1-worker fit of "
        "the same 'rep' (runs of one rep are back to back: the configurations interleaved). "
        "'busiest CPU x' is the CPU seconds of the busiest process over the 1-worker run's: "
        "the time ratio the run would have with a core per process (the cluster's start, a "
        "few seconds, aside). "
        "'CPU s': user + system seconds of the driver and every process it started; "
        "'CPU s driver / workers': each process's own. "
        "'driver GiB' and 'worker GiB' are each process's peak resident set (VmHWM), "
        "'total GiB' the largest sum over the tree at one instant. The load average is the "
        "machine's before the run (2 cores, shared with other work: a fit at nice 19 gets "
        "only what the others leave, so compare the CPU seconds as well as the wall time). "
        "A run with a note in 'fit s' was stopped before the end (the shards it had done "
        "by then); its memory and CPU are the processes' at that moment, read from /proc "
        "by the same poll.\n\n"
        + table(
            [
                "users",
                "samples",
                "workers",
                "rep",
                "fit s",
                "x 1 worker",
                "busiest CPU x",
                "CPU s",
                "CPU s driver / workers",
                "release s",
                "driver GiB",
                "worker GiB (each)",
                "total GiB",
                "load before (1, 5, 15 min)",
            ],
            ftab,
        )  # fmt: skip
    )
    write_section("distributed", "Kernel FQI on Dask: time and memory against N", COMMAND, body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--users", default="10000,100000")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of the worker counts")
    ap.add_argument("--data", required=False, help="directory for the files and the results")
    ap.add_argument("--report", action="store_true", help="only write the docs section")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]), args.child[2])
        return
    data = Path(args.data or tempfile.mkdtemp(prefix="qveil-bench-"))
    data.mkdir(parents=True, exist_ok=True)
    log = data / "bench_distributed.jsonl"
    if not args.report:
        for users in (int(float(v)) for v in args.users.split(",")):
            path = data / f"cartpole-{users}.parquet"
            if not path.exists():
                _collect(path, users, log)
            first = _next_rep(log, users)  # runs appended to the log keep their own reps
            for rep in range(first, first + args.repeat):
                for workers in (int(v) for v in args.workers.split(",")):
                    _fit(path, users, workers, rep, log)
    _report(log)


if __name__ == "__main__":
    main()
