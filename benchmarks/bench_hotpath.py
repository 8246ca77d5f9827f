"""The serving hot path against a bare gRPC server of the same method -> docs/benchmarks.md,
section "hotpath".

    .venv/bin/python benchmarks/bench_hotpath.py [--seconds 2] [--rounds 3]

Every server runs in its own subprocess (a real ``qveil serve`` on port 0, SQLite store, and a
bare grpc.aio server); the client loop runs in this process, so no server shares the client's
GIL. The bare server answers ``ValueService.GetValues`` with a pre-built reply of the right
size (n states x 2 actions; it parses the request and does nothing else). Workloads, each a
closed loop of grpc.aio calls with GetValues over all actions:

* known states, 1 per call, 8 in flight (a pool stored beforehand, answered from memory);
* known states, 1024 per call, 4 in flight;
* new states, 1 per call, 16 in flight (fresh uniform draws: each an exact conditional
  sample, group-committed durably before the answer).

Each workload runs for d = 1 (an MLP release) and d = 4 (the CartPole kernel fqi release,
additive noise over 4 coordinate paths), against qveil and the bare server in the same round;
rounds interleave every cell (drifting machine load hits all cells alike); the ratio is the
median over rounds of qveil's calls/s over the bare server's; each server's CPU time per
call answered (from /proc) shows where a gap is the server's own work; latency percentiles
pool all calls of the cell. ``--processes 2`` cells run ``qveil serve --processes 2`` (two processes
on one port, one shared store) for d = 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as `qveil serve` does; before numpy

import grpc  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import table, write_section  # noqa: E402
from bench_multid import kernel_bundle  # noqa: E402
from bench_server import (  # noqa: E402
    make_bundle,
    serve_value_service,
    spawn,
    stop_all,
    wait_released,
)

from qveil.v1 import value_service_pb2 as pb  # noqa: E402
from qveil.v1 import value_service_pb2_grpc as pb_grpc  # noqa: E402

COMMAND = ".venv/bin/python benchmarks/bench_hotpath.py"
M = 2  # actions of both releases
POOL = 4096
#: connections of the 1 -> N process cells (one connection lands on one process)
CONNS = 4
#: (name, states per call, calls in flight, kind)
WORKLOADS = (
    ("known 1/call", 1, 8, "known"),
    ("known 1024/call", 1024, 4, "known"),
    ("new 1/call", 1, 16, "new"),
)
BOX = np.array([[-0.3, 0.3], [-1.5, 1.5], [-0.2095, 0.2095], [-2.0, 2.0]])
TARGETS = {"known 1/call": 0.7, "known 1024/call": 0.5, "new 1/call": 0.3}


# ----------------------------------------------------------------------------- bare server
def bare_server(port_file: str) -> None:
    """A bare grpc.aio ValueService: GetValues parses the request and answers a pre-built
    reply of n x M values (n: the request's states); no auth, no store, no model."""

    async def main() -> None:
        replies: dict[int, pb.GetValuesResponse] = {}

        class Bare(pb_grpc.ValueServiceServicer):
            async def GetValues(self, request, context):  # noqa: N802
                if request.HasField("state_matrix"):
                    n = len(request.state_matrix.values) // max(1, request.state_matrix.dims)
                else:
                    n = len(request.states)
                reply = replies.get(n)
                if reply is None:
                    reply = pb.GetValuesResponse(
                        release_id="bare-" + "0" * 16,
                        actions=list(range(M)),
                        values=np.linspace(-1.0, 1.0, n * M).tolist(),
                        value_grid=2.0**-20,
                    )
                    replies[n] = reply
                return reply

            async def GetRelease(self, request, context):  # noqa: N802
                return pb.GetReleaseResponse()

        await serve_value_service(Bare(), port_file)

    asyncio.run(main())


# ----------------------------------------------------------------------------- client
def request(states: np.ndarray) -> pb.GetValuesRequest:
    if states.ndim == 1:
        return pb.GetValuesRequest(states=states.tolist())
    return pb.GetValuesRequest(
        state_matrix=pb.StateMatrix(values=states.reshape(-1).tolist(), dims=states.shape[1])
    )


async def closed_loop(
    target: str,
    next_request: Callable[[], pb.GetValuesRequest],
    seconds: float,
    inflight: int,
    conns: int = 1,
) -> dict[str, Any]:
    """``inflight`` callers in a closed loop over ``conns`` connections (each its own
    subchannel: with several server processes on one port, each connection lands on one)."""
    opts = [("grpc.use_local_subchannel_pool", 1)]
    chans = [grpc.aio.insecure_channel(target, options=opts) for _ in range(conns)]
    stubs = [pb_grpc.ValueServiceStub(ch) for ch in chans]
    lat: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def worker(i: int) -> None:
        nonlocal errors
        stub = stubs[i % conns]
        while time.perf_counter() < stop_at:
            req = next_request()
            t0 = time.perf_counter()
            try:
                await stub.GetValues(req, timeout=60)
                lat.append(time.perf_counter() - t0)
            except grpc.aio.AioRpcError:
                errors += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(inflight)))
    wall = time.perf_counter() - t0
    for ch in chans:
        await ch.close()
    return {"calls_s": len(lat) / wall, "lat": np.array(lat), "errors": errors}


def serve(qveil: str, bundle: Path, store: str, tmp: Path, name: str, processes: int) -> Any:
    pf = tmp / f"{name}.port"
    argv = [
        qveil,
        "serve",
        "--bundle",
        str(bundle),
        "--store",
        store,
        "--listen",
        "127.0.0.1:0",
        "--port-file",
        str(pf),
        "--max-in-flight",
        "1024",
        "--new-state-rate",  # throughput is measured here, not the quota
        "1e12",
    ]
    if processes > 1:
        argv += ["--processes", str(processes)]
    return spawn(argv, pf, timeout=300)


Runs = dict[tuple[str, int, str, int], list[dict[str, Any]]]


def cpu_seconds(pid: int | None) -> float | None:
    """CPU time (user + system) a process has used so far, from /proc (Linux); None when it
    cannot be read (another system, or no single process to read)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# long-function: the whole measurement top to bottom (servers up, pools stored, interleaved
# rounds of every cell, servers down), one piece so that its cleanup covers every step
def measure(args: argparse.Namespace) -> Runs:
    """Start the bare server and the qveil servers, store the known pools, and run every
    cell's closed loop in interleaved rounds: (workload, d, server, connections) -> rounds."""
    dims = [int(d) for d in args.dims.split(",")]
    qveil = str(Path(sys.executable).parent / "qveil")
    procs: list[subprocess.Popen[bytes]] = []
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory(prefix="qveil-bench-hot-") as tmpd:
        tmp = Path(tmpd)
        os.environ["QVEIL_HOME"] = str(tmp / "qveil-home")  # the servers' own registry
        bundles: dict[int, Path] = {}
        if 1 in dims:
            bundles[1] = make_bundle(tmp / "bundle1")
        if 4 in dims:
            print("training the d = 4 bundle ...", file=sys.stderr, flush=True)
            bundles[4] = kernel_bundle(tmp, qveil)
        pools = {1: rng.uniform(0.0, 1.0, POOL), 4: rng.uniform(BOX[:, 0], BOX[:, 1], (POOL, 4))}
        # server name -> (target, d, pid of its one process or None)
        servers: dict[str, tuple[str, int, int | None]] = {}
        try:
            p, port = spawn(
                [sys.executable, __file__, "--bare-server", str(tmp / "bare.port")],
                tmp / "bare.port",
            )
            procs.append(p)
            bare, bare_pid = f"127.0.0.1:{port}", p.pid
            wait_released(bare, tries=600)
            for d in dims:
                p, port = serve(
                    qveil, bundles[d], f"sqlite:///{tmp / f's{d}.sqlite'}", tmp, f"q{d}", 1
                )
                procs.append(p)
                servers[f"qveil d={d}"] = (f"127.0.0.1:{port}", d, p.pid)
            multi = None
            if args.processes > 1 and 1 in dims:
                p, port = serve(
                    qveil, bundles[1], f"sqlite:///{tmp / 's1.sqlite'}", tmp, "qN", args.processes
                )
                procs.append(p)
                multi = f"qveil x{args.processes}"
                servers[multi] = (f"127.0.0.1:{port}", 1, None)
            for target, d, _pid in servers.values():
                wait_released(target, tries=600)
                with grpc.insecure_channel(target) as ch:  # store the known pool
                    stub = pb_grpc.ValueServiceStub(ch)
                    for chunk in np.array_split(pools[d], 4):
                        stub.GetValues(request(chunk), timeout=300)
                for _ in range(4 * CONNS):  # every process loads the pool into memory
                    with grpc.insecure_channel(
                        target, options=[("grpc.use_local_subchannel_pool", 1)]
                    ) as ch:
                        pb_grpc.ValueServiceStub(ch).GetValues(request(pools[d][:8]), timeout=60)

            def source(d: int, batch: int, kind: str) -> Callable[[], pb.GetValuesRequest]:
                if kind == "known":
                    pre = [request(pools[d][rng.integers(0, POOL, batch)]) for _ in range(256)]
                    it = iter(range(1 << 62))
                    return lambda: pre[next(it) % len(pre)]
                if d == 1:
                    return lambda: request(rng.uniform(0.0, 1.0, batch))
                return lambda: request(rng.uniform(BOX[:, 0], BOX[:, 1], (batch, 4)))

            Cell = tuple[str, int, str, str, int | None, int, int, str, int]
            cells: list[Cell] = []
            for wname, batch, inflight, kind in WORKLOADS:
                for d in dims:
                    cells.append((wname, d, "bare", bare, bare_pid, batch, inflight, kind, 1))
                    target, _d, pid = servers[f"qveil d={d}"]
                    cells.append((wname, d, "qveil", target, pid, batch, inflight, kind, 1))
                if multi is not None:  # 1 -> N processes, both over CONNS connections
                    for sname in ("qveil d=1", multi):
                        target, _d, pid = servers[sname]
                        name = "qveil" if sname == "qveil d=1" else sname
                        cells.append((wname, 1, name, target, pid, batch, inflight, kind, CONNS))
            runs: Runs = {}
            for rnd in range(args.rounds):
                for wname, d, sname, target, pid, batch, inflight, kind, conns in cells:
                    cpu0 = cpu_seconds(pid)
                    out = asyncio.run(
                        closed_loop(target, source(d, batch, kind), args.seconds, inflight, conns)
                    )
                    cpu1 = cpu_seconds(pid)
                    calls = len(out["lat"])
                    out["cpu_call"] = (
                        (cpu1 - cpu0) / calls
                        if cpu0 is not None and cpu1 is not None and calls
                        else None
                    )
                    runs.setdefault((wname, d, sname, conns), []).append(out)
                print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        finally:
            stop_all(procs)

    return runs


def _cpu_us(rs: list[dict[str, Any]]) -> float | str:
    """The server's median CPU microseconds per call over the rounds ("-": not read)."""
    got = [r["cpu_call"] for r in rs if r.get("cpu_call") is not None]
    return float(np.median(got)) * 1e6 if got else "-"


def ratio_rows(runs: Runs) -> tuple[list[list[object]], dict[tuple[str, int], float]]:
    """One table row per (workload, d) of qveil against the bare server, and the ratios."""
    rows: list[list[object]] = []
    ratios: dict[tuple[str, int], float] = {}
    for (wname, d, sname, conns), rs in runs.items():
        if sname != "qveil" or conns != 1:
            continue
        bare_rs = runs[(wname, d, "bare", 1)]
        per_round = [
            q["calls_s"] / b["calls_s"] for q, b in zip(rs, bare_rs, strict=True) if b["calls_s"]
        ]
        ratio = float(np.median(per_round))
        ratios[(wname, d)] = ratio
        lat = np.concatenate([r["lat"] for r in rs]) * 1000
        blat = np.concatenate([r["lat"] for r in bare_rs]) * 1000
        rows.append(
            [
                wname,
                d,
                float(np.median([r["calls_s"] for r in rs])),
                float(np.median([r["calls_s"] for r in bare_rs])),
                ratio,
                _cpu_us(rs),
                _cpu_us(bare_rs),
                float(np.percentile(lat, 50)),
                float(np.percentile(lat, 99)),
                float(np.percentile(blat, 50)),
                float(np.percentile(blat, 99)),
                int(sum(r["errors"] for r in rs)),
            ]
        )
    return rows, ratios


def scaling_rows(runs: Runs, processes: int) -> list[list[object]]:
    """One row per workload: one process against ``processes`` on the same connections."""
    scale_rows: list[list[object]] = []
    for wname, _b, _i, _k in WORKLOADS:
        one = runs.get((wname, 1, "qveil", CONNS))
        many = runs.get((wname, 1, f"qveil x{processes}", CONNS))
        if not one or not many:
            continue
        per_round = [m["calls_s"] / o["calls_s"] for m, o in zip(many, one, strict=True)]
        mlat = np.concatenate([r["lat"] for r in many]) * 1000
        olat = np.concatenate([r["lat"] for r in one]) * 1000
        scale_rows.append(
            [
                wname,
                float(np.median([r["calls_s"] for r in one])),
                float(np.median([r["calls_s"] for r in many])),
                float(np.median(per_round)),
                float(np.percentile(olat, 99)),
                float(np.percentile(mlat, 99)),
                int(sum(r["errors"] for r in many)),
            ]
        )
    return scale_rows


def report(
    args: argparse.Namespace,
    rows: list[list[object]],
    ratios: dict[tuple[str, int], float],
    scale_rows: list[list[object]],
) -> str:
    """The section's text: the load, the method, the tables and the verdict on the targets."""
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    verdict = "; ".join(
        f"{w} = {ratios[(w, 1)]:.2f} (target >= {t})"
        for w, t in TARGETS.items()
        if (w, 1) in ratios
    )
    body = "\n\n".join(
        [
            f"Load average at the end of the run: {load} (on {os.cpu_count()} cores, shared "
            "with other work: absolute numbers move between runs, ratios within a run much "
            "less).",
            f"Closed loops of grpc.aio GetValues calls (all {M} actions) from this process "
            f"against servers in their own processes; {args.seconds:g} s per cell and round, "
            f"{args.rounds} interleaved rounds; 'ratio' is the median over rounds of qveil "
            "calls/s over the bare server's calls/s in the same round; 'CPU us/call' is the "
            "server process's CPU time (user + system, from /proc) per call answered, median "
            "over rounds; latency percentiles pool all calls of the cell. The bare server "
            "answers a pre-built reply of the right size. d = 1: an MLP 1-64-64-2 release; "
            "d = 4: the CartPole kernel fqi release; SQLite store (WAL, synchronous=FULL).",
            table(
                [
                    "workload",
                    "d",
                    "calls/s",
                    "bare calls/s",
                    "ratio",
                    "CPU us/call",
                    "bare CPU us/call",
                    "p50 ms",
                    "p99 ms",
                    "bare p50 ms",
                    "bare p99 ms",
                    "errors",
                ],
                rows,
            ),
            f"Targets (d = 1, one process): {verdict}.",
        ]
    )
    if scale_rows:
        body += "\n\n" + "\n\n".join(
            [
                f"One process against `qveil serve --processes {args.processes}` (the same "
                f"store), d = 1, the same workloads over {CONNS} client connections (the "
                "kernel assigns each connection to one process); same rounds:",
                table(
                    [
                        "workload",
                        "x1 calls/s",
                        f"x{args.processes} calls/s",
                        f"x{args.processes} / x1",
                        "x1 p99 ms",
                        f"x{args.processes} p99 ms",
                        "errors",
                    ],
                    scale_rows,
                ),
            ]
        )
    return body


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="per cell and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dims", default="1,4", help="release dimensions to run (1, 4)")
    ap.add_argument(
        "--processes", type=int, default=1, help="also run qveil serve --processes N (d = 1)"
    )
    ap.add_argument("--no-write", action="store_true", help="print, do not write the doc")
    ap.add_argument("--bare-server", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bare_server:
        bare_server(args.bare_server)
        return 0
    runs = measure(args)
    rows, ratios = ratio_rows(runs)
    body = report(args, rows, ratios, scaling_rows(runs, args.processes))
    if args.no_write:
        print(body)
    else:
        write_section("hotpath", "Serving hot path against a bare gRPC server", COMMAND, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
