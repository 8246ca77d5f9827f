"""The serving hot path against a bare gRPC server of the same method -> docs/benchmarks.md,
section "hotpath", and docs/img/bench_hotpath.png.

    .venv/bin/python benchmarks/bench_hotpath.py [--seconds 2] [--rounds 5] [--processes 2]

Every server runs in its own subprocess (a real ``qveil serve`` on port 0, SQLite store, and a
bare grpc.aio server); the client loop runs in this process, so no server shares the client's
GIL. The bare server answers ``ValueService.GetValues`` with a pre-built reply of the right
size (n states x 2 actions; it parses the request and does nothing else). An answer is a pure
function of the release and the state (the model's mean at the snapped state plus the
release's keyed noise, :mod:`qveil.answer`), so a state asked before and a new one take the
same path; what differs is the answer log, whose thread writes a new state's points to the
store off the answer path. Workloads, each a closed loop of grpc.aio calls with GetValues
over all actions:

* new states, 1 per call, 16 in flight (fresh uniform draws, never asked before);
* known states, 1 per call, 8 in flight (a pool asked beforehand);
* known states, 1024 per call, 4 in flight;
* new states, 1024 per call, 4 in flight.

Each workload runs for d = 1 (an MLP release) and d = 4 (the CartPole kernel fqi release,
additive noise over 4 coordinate paths), against qveil and the bare server in the same round;
rounds interleave every cell (drifting machine load hits all cells alike); the ratio is the
median over rounds of qveil's calls/s over the bare server's; each server's CPU time per
call answered (from /proc) shows where a gap is the server's own work; latency percentiles
pool all calls of the cell. ``--processes N`` (default 2; 1: off) adds, for d = 1, the same
workloads over ``CONNS`` client connections against one process, ``qveil serve --processes
N`` (N processes on one port, one shared store) and N separate ``qveil serve`` processes on N
ports, each with its own SQLite store (the client's connections spread over them).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as `qveil serve` does; before numpy

import grpc  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import save_figure, subplots, table, write_section  # noqa: E402
from bench_multid import kernel_bundle  # noqa: E402
from bench_server import (  # noqa: E402
    bench_home,
    cpu_seconds,
    make_bundle,
    serve_value_service,
    settle,
    spawn,
    stop_all,
    wait_released,
)

from qveil.v1 import value_service_pb2 as pb  # noqa: E402
from qveil.v1 import value_service_pb2_grpc as pb_grpc  # noqa: E402

COMMAND = ".venv/bin/python benchmarks/bench_hotpath.py"
PNG = Path(__file__).resolve().parent.parent / "docs" / "img" / "bench_hotpath.png"
M = 2  # actions of both releases
POOL = 4096
#: connections of the 1 -> N process cells (one connection lands on one process)
CONNS = 4
#: (name, states per call, calls in flight, kind)
WORKLOADS = (
    ("new 1/call", 1, 16, "new"),
    ("known 1/call", 1, 8, "known"),
    ("known 1024/call", 1024, 4, "known"),
    ("new 1024/call", 1024, 4, "new"),
)
BOX = np.array([[-0.3, 0.3], [-1.5, 1.5], [-0.2095, 0.2095], [-2.0, 2.0]])
#: the issue's targets (d = 1, one process): qveil calls/s over the bare server's, at least
TARGETS = {"new 1/call": 0.7, "known 1/call": 0.8, "known 1024/call": 0.6}


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
    targets: Sequence[str],
    next_request: Callable[[], pb.GetValuesRequest],
    seconds: float,
    inflight: int,
    conns: int = 1,
) -> dict[str, Any]:
    """``inflight`` callers in a closed loop over ``conns`` connections, connection i to
    ``targets[i % len(targets)]`` (each its own subchannel: with several server processes on
    one port, each connection lands on one); caller i uses connection i % conns."""
    opts = [("grpc.use_local_subchannel_pool", 1)]
    chans = [
        grpc.aio.insecure_channel(targets[i % len(targets)], options=opts) for i in range(conns)
    ]
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
        "--state-rate",  # throughput is measured here, not the quota
        "1e12",
    ]
    if processes > 1:
        argv += ["--processes", str(processes)]
    return spawn(argv, pf, timeout=300)


#: (workload, d, server, connections) -> one result per round
Runs = dict[tuple[str, int, str, int], list[dict[str, Any]]]


def tree_pids(root: int) -> list[int]:
    """``root`` and every live descendant of it (Linux /proc; [root] elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return [root]
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def main_thread_seconds(pid: int) -> float | None:
    """CPU time (user + system) of the main thread of ``pid`` (the event loop of a server
    process), from /proc/PID/task/PID (Linux); None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """One measured server: its targets (one, or one per separate process) and its pids."""

    def __init__(self, targets: list[str], d: int, roots: list[int]) -> None:
        self.targets, self.d, self.roots = targets, d, roots
        self.pids: list[int] = []

    def settle(self) -> None:
        """Read the process tree once every process is up (for the CPU columns)."""
        self.pids = [p for r in self.roots for p in tree_pids(r)]


# long-function: the whole measurement top to bottom (servers up, pools asked, interleaved
# rounds of every cell, servers down), one piece so that its cleanup covers every step
def measure(args: argparse.Namespace) -> Runs:
    """Start the bare server and the qveil servers, ask the known pools, and run every
    cell's closed loop in interleaved rounds: (workload, d, server, connections) -> rounds."""
    dims = [int(d) for d in args.dims.split(",")]
    workloads = [w for w in WORKLOADS if w[0] in args.workloads.split(",")]
    qveil = str(Path(sys.executable).parent / "qveil")
    procs: list[subprocess.Popen[bytes]] = []
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory(prefix="qveil-bench-hot-") as tmpd:
        tmp = Path(tmpd)
        bench_home(tmp)  # the benchmark's own registry, for this process and the servers
        bundles: dict[int, Path] = {}
        if 1 in dims:
            bundles[1] = make_bundle(tmp / "bundle1")
        if 4 in dims:
            print("training the d = 4 bundle ...", file=sys.stderr, flush=True)
            bundles[4] = kernel_bundle(tmp, qveil)
        pools = {1: rng.uniform(0.0, 1.0, POOL), 4: rng.uniform(BOX[:, 0], BOX[:, 1], (POOL, 4))}
        servers: dict[str, Server] = {}
        n = args.processes
        try:
            p, port = spawn(
                [sys.executable, __file__, "--bare-server", str(tmp / "bare.port")],
                tmp / "bare.port",
            )
            procs.append(p)
            servers["bare"] = Server([f"127.0.0.1:{port}"], 0, [p.pid])
            wait_released(servers["bare"].targets[0], tries=600)
            for d in dims:
                p, port = serve(
                    qveil, bundles[d], f"sqlite:///{tmp / f's{d}.sqlite'}", tmp, f"q{d}", 1
                )
                procs.append(p)
                servers[f"qveil d={d}"] = Server([f"127.0.0.1:{port}"], d, [p.pid])
            if n > 1 and 1 in dims:
                p, port = serve(qveil, bundles[1], f"sqlite:///{tmp / 'sN.sqlite'}", tmp, "qN", n)
                procs.append(p)
                servers[f"--processes {n}"] = Server([f"127.0.0.1:{port}"], 1, [p.pid])
                seps, roots = [], []
                for i in range(n):
                    store = f"sqlite:///{tmp / f'sep{i}.sqlite'}"
                    p, port = serve(qveil, bundles[1], store, tmp, f"sep{i}", 1)
                    procs.append(p)
                    seps.append(f"127.0.0.1:{port}")
                    roots.append(p.pid)
                servers[f"{n} separate"] = Server(seps, 1, roots)
            for name, srv in servers.items():
                if name == "bare":
                    continue
                for target in srv.targets:
                    wait_released(target, tries=600)
                    with grpc.insecure_channel(target) as ch:  # ask the known pool once
                        stub = pb_grpc.ValueServiceStub(ch)
                        for chunk in np.array_split(pools[srv.d], 4):
                            stub.GetValues(request(chunk), timeout=300)
                    for _ in range(4 * CONNS):  # every process has answered a call
                        with grpc.insecure_channel(
                            target, options=[("grpc.use_local_subchannel_pool", 1)]
                        ) as ch:
                            pb_grpc.ValueServiceStub(ch).GetValues(
                                request(pools[srv.d][:8]), timeout=60
                            )
            time.sleep(1.0)  # the answer logs have written the pools
            for srv in servers.values():
                srv.settle()

            def source(d: int, batch: int, kind: str) -> Callable[[], pb.GetValuesRequest]:
                if kind == "known":
                    pre = [request(pools[d][rng.integers(0, POOL, batch)]) for _ in range(256)]
                    it = iter(range(1 << 62))
                    return lambda: pre[next(it) % len(pre)]
                if d == 1:
                    return lambda: request(rng.uniform(0.0, 1.0, batch))
                return lambda: request(rng.uniform(BOX[:, 0], BOX[:, 1], (batch, 4)))

            # (workload, d, server name, states per call, in flight, kind, connections)
            cells: list[tuple[str, int, str, int, int, str, int]] = []
            for wname, batch, inflight, kind in workloads:
                for d in dims:
                    cells.append((wname, d, "bare", batch, inflight, kind, 1))
                    cells.append((wname, d, f"qveil d={d}", batch, inflight, kind, 1))
                if n > 1 and 1 in dims:  # 1 -> N processes, all over CONNS connections
                    for sname in ("qveil d=1", f"--processes {n}", f"{n} separate"):
                        cells.append((wname, 1, sname, batch, inflight, kind, CONNS))
            for _w, d, sname, batch, inflight, kind, conns in cells:  # warm-up, not kept
                srv = servers[sname]
                asyncio.run(closed_loop(srv.targets, source(d, batch, kind), 0.3, inflight, conns))
                settle(srv.pids)
            runs: Runs = {}
            for rnd in range(args.rounds):
                for wname, d, sname, batch, inflight, kind, conns in cells:
                    srv = servers[sname]
                    main = srv.roots[0] if len(srv.pids) == 1 else None
                    cpu0 = cpu_seconds(srv.pids)
                    loop0 = None if main is None else main_thread_seconds(main)
                    out = asyncio.run(
                        closed_loop(
                            srv.targets, source(d, batch, kind), args.seconds, inflight, conns
                        )
                    )
                    settle(srv.pids)  # the log's writes of this cell count for it
                    cpu1 = cpu_seconds(srv.pids)
                    loop1 = None if main is None else main_thread_seconds(main)
                    calls = len(out["lat"])
                    out["cpu_call"] = (
                        (cpu1 - cpu0) / calls
                        if cpu0 is not None and cpu1 is not None and calls
                        else None
                    )
                    out["loop_call"] = (
                        (loop1 - loop0) / calls
                        if loop0 is not None and loop1 is not None and calls
                        else None
                    )
                    runs.setdefault((wname, d, sname, conns), []).append(out)
                print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        finally:
            stop_all(procs)

    return runs


def _cpu_us(rs: list[dict[str, Any]], what: str = "cpu_call") -> float | str:
    """The server's median CPU microseconds per call over the rounds ("-": not read);
    ``what``: "cpu_call" (every thread), "loop_call" (the event loop's thread)."""
    got = [r[what] for r in rs if r.get(what) is not None]
    return float(np.median(got)) * 1e6 if got else "-"


def _pct(rs: list[dict[str, Any]], q: float) -> float:
    lat = np.concatenate([r["lat"] for r in rs]) * 1000
    return float(np.percentile(lat, q)) if lat.size else float("nan")


def ratio_rows(runs: Runs) -> tuple[list[list[object]], dict[tuple[str, int], float]]:
    """One table row per (workload, d) of qveil against the bare server, and the ratios."""
    rows: list[list[object]] = []
    ratios: dict[tuple[str, int], float] = {}
    for (wname, d, sname, conns), rs in runs.items():
        if sname != f"qveil d={d}" or conns != 1:
            continue
        bare_rs = runs[(wname, d, "bare", 1)]
        per_round = [
            q["calls_s"] / b["calls_s"] for q, b in zip(rs, bare_rs, strict=True) if b["calls_s"]
        ]
        ratio = float(np.median(per_round))
        ratios[(wname, d)] = ratio
        batch = next(b for w, b, _i, _k in WORKLOADS if w == wname)
        calls = float(np.median([r["calls_s"] for r in rs]))
        rows.append(
            [
                wname,
                d,
                calls,
                calls * batch,
                float(np.median([r["calls_s"] for r in bare_rs])),
                ratio,
                f"{min(per_round):.2f} - {max(per_round):.2f}",
                _cpu_us(rs),
                _cpu_us(rs, "loop_call"),
                _cpu_us(bare_rs),
                _pct(rs, 50),
                _pct(rs, 99),
                _pct(bare_rs, 50),
                _pct(bare_rs, 99),
                int(sum(r["errors"] for r in rs)),
            ]
        )
    return rows, ratios


def scaling_rows(runs: Runs, processes: int) -> list[list[object]]:
    """One row per workload: one process against ``processes`` on one port (one store) and
    against ``processes`` separate servers (a store each), on the same connections."""
    rows: list[list[object]] = []
    for wname, _b, _i, _k in WORKLOADS:
        one = runs.get((wname, 1, "qveil d=1", CONNS))
        shared = runs.get((wname, 1, f"--processes {processes}", CONNS))
        sep = runs.get((wname, 1, f"{processes} separate", CONNS))
        if not one or not shared or not sep:
            continue

        def scale(many: list[dict[str, Any]], one: list[dict[str, Any]] = one) -> float:
            return float(
                np.median([m["calls_s"] / o["calls_s"] for m, o in zip(many, one, strict=True)])
            )

        rows.append(
            [
                wname,
                float(np.median([r["calls_s"] for r in one])),
                float(np.median([r["calls_s"] for r in shared])),
                scale(shared),
                float(np.median([r["calls_s"] for r in sep])),
                scale(sep),
                _cpu_us(one),
                _cpu_us(shared),
                _cpu_us(sep),
                _pct(one, 99),
                _pct(shared, 99),
                _pct(sep, 99),
                int(sum(r["errors"] for r in shared + sep)),
            ]
        )
    return rows


def verdict(ratios: dict[tuple[str, int], float]) -> str:
    parts = []
    for w, t in TARGETS.items():
        if (w, 1) in ratios:
            r = ratios[(w, 1)]
            parts.append(f"{w} = {r:.2f} (target >= {t}: {'met' if r >= t else 'MISSED'})")
    return "; ".join(parts)


def report(
    args: argparse.Namespace,
    rows: list[list[object]],
    ratios: dict[tuple[str, int], float],
    scale_rows: list[list[object]],
    load_before: str,
    load_after: str,
) -> str:
    """The section's text: the load, the method, the tables and the verdict on the targets."""
    n = args.processes
    body = "\n\n".join(
        [
            f"Load average (1, 5, 15 min) before the run: {load_before}; after: {load_after} "
            f"(on {os.cpu_count()} cores shared with other work: absolute numbers move between "
            "runs; every ratio below is within one run, qveil and the bare server measured in "
            "the same rounds).",
            f"Closed loops of grpc.aio GetValues calls (all {M} actions) from this process "
            f"against servers in their own processes; {args.seconds:g} s per cell and round, "
            f"{args.rounds} interleaved rounds; 'ratio' is the median over rounds of qveil "
            "calls/s over the bare server's calls/s in the same round ('range': the rounds' "
            "lowest and highest); 'CPU us/call' is the server process's CPU time (user + "
            "system, from /proc, from the cell's start until the server is idle again, so "
            "the answer log's writes of the cell count for it) per call answered, median over "
            "rounds ('loop': its main "
            "thread alone, the event loop, where calls of at most 64 states are answered; the "
            "rest is the executor threads that answer larger calls, the answer log's thread "
            "and gRPC's own); every cell ran 0.3 s once before the rounds; latency percentiles "
            "pool all calls of the cell. The bare server answers a pre-built reply of the "
            "right size. 'new': fresh uniform states never asked before; 'known': a pool of "
            f"{POOL} states asked before the rounds. d = 1: an MLP 1-64-64-2 release; "
            "d = 4: the CartPole kernel fqi release; SQLite store (WAL, synchronous=FULL).",
            table(
                [
                    "workload",
                    "d",
                    "calls/s",
                    "states/s",
                    "bare calls/s",
                    "ratio",
                    "range",
                    "CPU us/call",
                    "loop CPU us/call",
                    "bare CPU us/call",
                    "p50 ms",
                    "p99 ms",
                    "bare p50 ms",
                    "bare p99 ms",
                    "errors",
                ],
                rows,
            ),
            f"Targets (d = 1, one process): {verdict(ratios)}.",
        ]
    )
    if scale_rows:
        body += "\n\n" + "\n\n".join(
            [
                f"Scaling, d = 1, the same workloads over {CONNS} client connections: one "
                f"process; `qveil serve --processes {n}` ({n} processes on one port, the "
                "kernel assigning each connection to one, one shared SQLite store); and "
                f"{n} separate `qveil serve` processes on {n} ports, each with its own SQLite "
                "store, the client's connections spread over them. '/ x1' columns: calls/s over "
                "the one process's in the same round (median over rounds); CPU per call "
                "counts every process of the server. The client and the servers share the "
                f"{os.cpu_count()} cores:",
                table(
                    [
                        "workload",
                        "x1 calls/s",
                        f"--processes {n} calls/s",
                        f"--processes {n} / x1",
                        f"{n} separate calls/s",
                        f"{n} separate / x1",
                        "x1 CPU us/call",
                        f"--processes {n} CPU us/call",
                        f"{n} separate CPU us/call",
                        "x1 p99 ms",
                        f"--processes {n} p99 ms",
                        f"{n} separate p99 ms",
                        "errors",
                    ],
                    scale_rows,
                ),
            ]
        )
    body += "\n\n![hot path against the bare server](img/bench_hotpath.png)"
    return body


def plot(rows: list[list[object]], scale_rows: list[list[object]], processes: int) -> None:
    """Left: qveil's calls/s over the bare server's per workload and d, the targets marked;
    right: the scaling of d = 1 over one process."""
    fig, axes = subplots(1, 2 if scale_rows else 1, figsize=(11 if scale_rows else 6, 4))
    axes = np.atleast_1d(axes)
    ax = axes[0]
    names = [w for w, _b, _i, _k in WORKLOADS if any(r[0] == w for r in rows)]
    dims = sorted({int(str(r[1])) for r in rows})
    xs = np.arange(len(names))
    width = 0.8 / max(1, len(dims))
    for i, d in enumerate(dims):
        vals = [next((float(str(r[5])) for r in rows if r[0] == w and r[1] == d), np.nan)
                for w in names]  # fmt: skip
        ax.bar(xs + (i - (len(dims) - 1) / 2) * width, vals, width, label=f"qveil, d = {d}")
    for j, w in enumerate(names):
        if w in TARGETS:
            ax.hlines(TARGETS[w], j - 0.45, j + 0.45, colors="k", linestyles="--",
                      label="target (d = 1)" if j == 0 else None)  # fmt: skip
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(xs, names, fontsize=8)
    ax.set_ylabel("calls/s over the bare gRPC server's")
    ax.set_xlabel("workload (states per call)")
    ax.set_title("qveil serve against a bare grpc.aio server\n(same rounds, median)")
    ax.set_ylim(0, 1.25)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3)
    if scale_rows:
        ax = axes[1]
        names = [str(r[0]) for r in scale_rows]
        xs = np.arange(len(names))
        ax.bar(xs - 0.2, [float(str(r[3])) for r in scale_rows], 0.4,
               label=f"--processes {processes} (one store)")  # fmt: skip
        ax.bar(xs + 0.2, [float(str(r[5])) for r in scale_rows], 0.4,
               label=f"{processes} separate servers (a store each)")  # fmt: skip
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(xs, names, fontsize=8)
        ax.set_ylabel("calls/s over one process's")
        ax.set_xlabel("workload (states per call), d = 1")
        ax.set_title(f"{processes} processes against one\n(client on the same 2 cores)")
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=1)
    save_figure(fig, PNG)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="per cell and round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dims", default="1,4", help="release dimensions to run (1, 4)")
    ap.add_argument(
        "--workloads",
        default=",".join(w for w, _b, _i, _k in WORKLOADS),
        help="comma-separated workload names to run (default: all)",
    )
    ap.add_argument(
        "--processes",
        type=int,
        default=2,
        help="also run N processes (--processes N, and N separate servers) for d = 1; 1: off",
    )
    ap.add_argument("--no-write", action="store_true", help="print, do not write the doc")
    ap.add_argument("--bare-server", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bare_server:
        bare_server(args.bare_server)
        return 0
    load_before = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    runs = measure(args)
    load_after = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    rows, ratios = ratio_rows(runs)
    scale = scaling_rows(runs, args.processes) if args.processes > 1 else []
    body = report(args, rows, ratios, scale, load_before, load_after)
    if args.no_write:
        print(body)
    else:
        plot(rows, scale, args.processes)
        write_section("hotpath", "Serving hot path against a bare gRPC server", COMMAND, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
