"""Server throughput and latency over loopback -> docs/benchmarks.md, section "server".

    .venv/bin/python benchmarks/bench_server.py [--seconds 1] [--rounds 3] [--concurrency 8]

Closed loop: ``concurrency`` grpc.aio calls in flight from this process for ``seconds`` per
cell, ``rounds`` interleaved rounds over all cells (median throughput). Cells: GetValues
with batches of 1, 64 and 1024 states (all actions), of *repeated*
states (a pool asked beforehand) and of *new* states (fresh uniform draws), against one
`qveil serve` process and two (same SQLite store, calls alternated between them). An
answer is a pure function of the release and the state (the model's mean plus the
release's keyed noise), so both kinds take the same path; a new state also adds points to
the answer log, written off the answer path. Ceilings in the same run: a bare grpc.aio echo
server (same messages, no work), the same echo server plus the numpy MLP forward (the "bare
gRPC + MLP" ceiling), and the answer function alone (``qveil.answer.released_values`` in
process, one thread). Ratios are against those ceilings (targets: repeated batches
>= 0.5 x gRPC + MLP; single queries >= 0.5 x echo). After each cell the run waits until the
qveil servers are idle (their answer logs have written what the cell handed them), so one
cell's log backlog does not slow the next.

The machine has 2 cores shared by the client, the server(s) and SQLite, so the two-process
rows are bounded by the CPU, not by the server design; compare within one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as `qveil serve` does; before numpy

import grpc  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import table, write_section  # noqa: E402

from qveil.v1 import value_service_pb2 as pb  # noqa: E402
from qveil.v1 import value_service_pb2_grpc as pb_grpc  # noqa: E402

LO, HI, M = 0.0, 1.0, 2
POOL = 4096


#: the population the benchmarks' releases are charged to (their own registry, no one's data)
BENCH_POPULATION = "bench-users"


def bench_home(tmp: Path) -> Path:
    """Point ``QVEIL_HOME`` (this process and every server it starts) at a registry of the
    benchmark's own under ``tmp``: the releases it writes are charged and receipted there,
    and the servers trust that registry; nothing outside ``tmp`` is touched."""
    home = tmp / "qveil-home"
    home.mkdir(parents=True, exist_ok=True)
    os.environ["QVEIL_HOME"] = str(home)
    os.environ.pop("QVEIL_REGISTRY", None)
    return home


def ensure_population() -> list[str]:
    """Declare :data:`BENCH_POPULATION` (epsilon 1e9, delta 0.5: a budget that binds nothing;
    the benchmarks' releases hold no one's data) in the registry of ``QVEIL_HOME`` unless it
    is declared; returns the ``qveil train`` flags that name it."""
    from qveil.server.governance import population
    from qveil.server.governance.release_records import open_release_records

    if not os.environ.get("QVEIL_HOME"):
        raise RuntimeError("QVEIL_HOME is not set: call bench_home(tmp) first")
    with open_release_records(None, actor="benchmarks") as rec:
        if rec.registry.ledger.cap(BENCH_POPULATION) is None:
            population.create(rec.registry, BENCH_POPULATION, epsilon=1e9, delta=0.5)
    return ["--population", BENCH_POPULATION]


def charge(bundle: Path) -> str:
    """Charge ``bundle`` (written through the Python API) to :data:`BENCH_POPULATION` in the
    registry of ``QVEIL_HOME`` and write the registry's signed receipt into it, as ``qveil
    train`` does: what ``qveil serve`` requires before it answers. Returns the receipt line."""
    from qveil.server.governance.release_records import open_release_records

    ensure_population()
    with open_release_records(None, actor="benchmarks") as rec:
        rec.record_release(bundle, population=BENCH_POPULATION)
        return rec.issue_receipt(bundle)


def make_bundle(path: Path, *, seed: int = 0) -> Path:
    """A LineWalk-shaped release: MLP 1-64-64-2 (the trainer's usual size), output mode, its
    noise key seeded by ``seed`` (the card says ``seeded``), charged and receipted in the
    registry of ``QVEIL_HOME`` (:func:`bench_home`), so that ``qveil serve`` serves it."""
    from qveil.bundle import build_card, lipschitz_bound, write_bundle
    from qveil.keyed import seeded_key
    from qveil.privacy import E3_SETTINGS, PrivacyParams, account

    rng = np.random.default_rng(seed)
    w = {
        "W0": rng.normal(size=(64, 1)),
        "b0": rng.normal(size=64) * 0.1,
        "W1": rng.normal(size=(64, 64)) / 8,
        "b1": rng.normal(size=64) * 0.1,
        "W2": rng.normal(size=(M, 64)) / 8,
        "b2": rng.normal(size=M) * 0.1,
    }
    lip = max(lipschitz_bound(w), 1.0)
    params = PrivacyParams(
        mode="output", sigma=1.0, **{**E3_SETTINGS, "lipschitz": lip, "actions": M}
    )
    card = build_card(
        env_id="qveil/LineWalk-v0",
        interval=(LO, HI),
        actions=M,
        hyperparameters={"benchmark": True, "seed": seed},
        privacy_result=account(params),
        lipschitz=lip,
        seeded=True,
    )
    out = write_bundle(
        path,
        card=card,
        weights=w,
        config_toml="",
        learning_curve_png=b"",
        training_log_rows=[{"episode": 0, "return": 0.0}],
        noise_key=seeded_key(seed),
    )
    charge(out)
    return out


# ----------------------------------------------------------------------------- echo server
def echo_server(port_file: str, bundle: str | None) -> None:
    """A bare grpc.aio ValueService: answers GetValues with zeros (or the MLP forward when
    ``bundle`` is given), no auth, no store, no validation beyond the forward's own."""

    async def main() -> None:
        weights = None
        if bundle:
            from qveil.bundle import load_bundle

            weights = load_bundle(bundle, verify=False)

        class Echo(pb_grpc.ValueServiceServicer):
            async def GetValues(self, request, context):  # noqa: N802
                n = len(request.states)
                if weights is None:
                    vals = np.zeros(n * M)
                else:
                    xs = np.fromiter(request.states, dtype=np.float64, count=n)
                    vals = weights.q_values_unit(xs).ravel()
                return pb.GetValuesResponse(
                    release_id="echo", actions=list(range(M)), values=vals.tolist()
                )

        await serve_value_service(Echo(), port_file)

    asyncio.run(main())


async def serve_value_service(servicer: Any, port_file: str) -> None:
    """Serve ``servicer`` as the ValueService on a free local port, written to ``port_file``,
    until the process is stopped (the bare servers the benchmarks measure qveil against)."""
    server = grpc.aio.server()
    pb_grpc.add_ValueServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    Path(port_file).write_text(str(port))
    await server.wait_for_termination()


def spawn(
    args: list[str], port_file: Path, timeout: float = 60, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, int]:
    """Start ``args`` (this environment, plus ``env``) and wait for its port file."""
    port_file.unlink(missing_ok=True)
    env = {
        **os.environ,
        "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1"),
        **(env or {}),
    }
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    t0 = time.monotonic()
    while not port_file.exists() or not port_file.read_text().strip():
        if proc.poll() is not None:
            raise RuntimeError(f"{args} exited: {proc.stderr.read().decode()}")
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"{args} did not start")
        time.sleep(0.05)
    return proc, int(port_file.read_text())


def stop_all(procs: Sequence[subprocess.Popen]) -> None:
    """SIGTERM every server, then wait for each (30 s, then SIGKILL)."""
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


def cpu_seconds(pids: Sequence[int]) -> float | None:
    """CPU time (user + system) the processes ``pids`` have used so far, from /proc (Linux);
    None when it cannot be read (another system)."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def settle(pids: Sequence[int], *, quiet: float = 0.05, step: float = 0.2) -> None:
    """Wait (at most 120 s) until the processes ``pids`` use less than ``quiet`` of a core
    over ``step`` seconds: a server's answer log has written what the last cell handed it
    (its CPU then counts for that cell, and its backlog does not slow the next one)."""
    t0 = time.monotonic()
    last = cpu_seconds(pids)
    while last is not None and time.monotonic() - t0 < 120:
        time.sleep(step)
        now = cpu_seconds(pids)
        if now is None or now - last < quiet * step:
            return
        last = now


def serve_args(
    exe: Sequence[str], bundle: Path, store: str, port_file: Path, *extra: str
) -> list[str]:
    """``qveil serve`` of ``bundle`` on ``store``, on a free loopback port written to
    ``port_file``, up to 1024 calls in flight, then ``extra`` flags (``exe``: how to run
    qveil)."""
    return [
        *exe,
        *("serve", "--bundle", str(bundle), "--store", store, "--listen", "127.0.0.1:0"),
        *("--port-file", str(port_file), "--max-in-flight", "1024", *extra),
    ]


def wait_ready(target: str) -> None:
    """Wait until GetValues answers one state (the release is loaded and served)."""
    last: grpc.RpcError | None = None
    with grpc.insecure_channel(target) as ch:
        stub = pb_grpc.ValueServiceStub(ch)
        for _ in range(300):
            try:
                stub.GetValues(pb.GetValuesRequest(states=[0.5]), timeout=5)
                return
            except grpc.RpcError as e:
                last = e
                time.sleep(0.1)
    detail = f"{last.code().name}: {last.details()}" if last is not None else ""  # type: ignore[attr-defined]
    raise RuntimeError(f"{target} never answered ({detail})")


def wait_released(target: str, tries: int = 300) -> None:
    """Wait until GetRelease answers: the release is loaded (and, unlike :func:`wait_ready`,
    no state is asked, so nothing goes to the answer log)."""
    with grpc.insecure_channel(target) as ch:
        stub = pb_grpc.ValueServiceStub(ch)
        for _ in range(tries):
            try:
                stub.GetRelease(pb.GetReleaseRequest(), timeout=5)
                return
            except grpc.RpcError:
                time.sleep(0.1)
    raise RuntimeError(f"{target} never answered")


# ----------------------------------------------------------------------------- load
async def closed_loop(
    targets: list[str], batch: int, kind: str, seconds: float, concurrency: int, pool: np.ndarray
) -> dict[str, Any]:
    chans = [grpc.aio.insecure_channel(t) for t in targets]
    stubs = [pb_grpc.ValueServiceStub(c) for c in chans]
    rng = np.random.default_rng(batch * 7 + len(targets))
    lat: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def worker(i: int) -> None:
        nonlocal errors
        k = i
        while time.perf_counter() < stop_at:
            states = (
                rng.choice(pool, size=batch)
                if kind == "repeated"
                else rng.uniform(LO, HI, size=batch)
            )
            req = pb.GetValuesRequest(states=states.tolist())
            t0 = time.perf_counter()
            try:
                await stubs[k % len(stubs)].GetValues(req, timeout=60)
                lat.append(time.perf_counter() - t0)
            except grpc.aio.AioRpcError:
                errors += 1
            k += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    wall = time.perf_counter() - t0
    for c in chans:
        await c.close()
    return {
        "calls_s": len(lat) / wall,
        "states_s": len(lat) * batch / wall,
        "lat": np.array(lat),
        "errors": errors,
    }


def answer_ceiling(
    bundle: Path, pool_unit: np.ndarray, seconds: float
) -> dict[tuple[str, int], float]:
    """States/s of the answer function alone (``qveil.answer.released_values``: the mean at
    the snapped states plus the keyed noise, on the value grid; all actions), in this
    process, one thread: what a server answers, without gRPC, parsing or the log."""
    from qveil.answer import released_values
    from qveil.bundle import load_bundle

    b = load_bundle(bundle, verify=False)
    out = {}
    rng = np.random.default_rng(5)
    released_values(b, pool_unit[:8])  # warm
    for kind in ("repeated", "new"):
        for batch in (1, 64, 1024):
            n = 0
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds / 2:
                xs = (
                    rng.choice(pool_unit, size=batch)
                    if kind == "repeated"
                    else rng.uniform(0, 1, size=batch)
                )
                released_values(b, xs)
                n += batch
            out[(kind, batch)] = n / (time.perf_counter() - t0)
    return out


# long-function: a benchmark run top to bottom: every measurement feeds the one table and section it
#   writes
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=1.0, help="per cell and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--no-write", action="store_true", help="print, do not write the doc")
    ap.add_argument("--echo-server", help=argparse.SUPPRESS)
    ap.add_argument("--echo-bundle", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.echo_server:
        echo_server(args.echo_server, args.echo_bundle)
        return 0

    qveil = str(Path(sys.executable).parent / "qveil")
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="qveil-bench-") as tmpd:
        tmp = Path(tmpd)
        bench_home(tmp)
        bundle = make_bundle(tmp / "bundle")
        store = f"sqlite:///{tmp / 'store.sqlite'}"
        pool = np.random.default_rng(1).uniform(LO, HI, size=POOL)
        rows: list[list[object]] = []
        results: dict[tuple[str, int, str], dict[str, float]] = {}
        try:
            servers = []
            for i in range(2):
                port_file = tmp / f"s{i}.port"
                p, port = spawn(
                    # throughput is measured here, not the quota
                    serve_args([qveil], bundle, store, port_file, "--state-rate", "1e12"),
                    port_file,
                )
                procs.append(p)
                servers.append(f"127.0.0.1:{port}")
                wait_ready(servers[-1])
            echo_p, echo_port = spawn(
                [sys.executable, __file__, "--echo-server", str(tmp / "e.port")], tmp / "e.port"
            )
            mlp_p, mlp_port = spawn(
                [
                    sys.executable,
                    __file__,
                    "--echo-server",
                    str(tmp / "m.port"),
                    "--echo-bundle",
                    str(bundle),
                ],
                tmp / "m.port",
            )
            procs += [echo_p, mlp_p]
            # ask the pool once (its points are then in the answer log)
            with grpc.insecure_channel(servers[0]) as ch:
                stub = pb_grpc.ValueServiceStub(ch)
                for chunk in np.array_split(pool, 4):
                    stub.GetValues(pb.GetValuesRequest(states=chunk.tolist()), timeout=120)
                for t in servers[1:]:
                    with grpc.insecure_channel(t) as ch2:
                        pb_grpc.ValueServiceStub(ch2).GetValues(
                            pb.GetValuesRequest(states=pool.tolist()), timeout=120
                        )

            def run(targets: list[str], batch: int, kind: str) -> dict[str, Any]:
                return asyncio.run(
                    closed_loop(targets, batch, kind, args.seconds, args.concurrency, pool)
                )

            # rounds interleave every cell, so drifting machine load hits all cells alike;
            # throughput is the median over rounds, latency percentiles pool all calls
            cells: list[tuple[tuple[str, int, str], list[str], str]] = []
            for batch in (1, 64, 1024):
                cells.append((("echo", batch, "-"), [f"127.0.0.1:{echo_port}"], "repeated"))
                cells.append((("echo+mlp", batch, "-"), [f"127.0.0.1:{mlp_port}"], "repeated"))
                for kind in ("repeated", "new"):
                    cells.append((("qveil x1", batch, kind), servers[:1], kind))
                    cells.append((("qveil x2", batch, kind), servers, kind))
            runs: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
            qpids = [p.pid for p in procs[:2]]  # the qveil servers
            for rnd in range(args.rounds):
                for key, targets, kind in cells:
                    runs.setdefault(key, []).append(run(targets, key[1], kind))
                    # the answer logs have written what this cell handed them (their backlog
                    # would otherwise slow the next cell)
                    settle(qpids)
                print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr, flush=True)
            for key, rs in runs.items():
                lat = np.concatenate([r["lat"] for r in rs]) * 1000
                results[key] = {
                    "calls_s": float(np.median([r["calls_s"] for r in rs])),
                    "states_s": float(np.median([r["states_s"] for r in rs])),
                    "p50_ms": float(np.percentile(lat, 50)) if lat.size else float("nan"),
                    "p99_ms": float(np.percentile(lat, 99)) if lat.size else float("nan"),
                    "errors": float(sum(r["errors"] for r in rs)),
                }
        finally:
            stop_all(procs)
        raw = answer_ceiling(bundle, (pool - LO) / (HI - LO), args.seconds)

    for (what, batch, kind), r in results.items():
        echo = results[("echo", batch, "-")]["states_s"]
        mlp = results[("echo+mlp", batch, "-")]["states_s"]
        rows.append(
            [
                what,
                kind,
                batch,
                r["calls_s"],
                r["states_s"],
                r["p50_ms"],
                r["p99_ms"],
                r["states_s"] / echo,
                r["states_s"] / mlp,
                int(r["errors"]),
            ]
        )
    store_rows = [[kind, batch, v] for (kind, batch), v in raw.items()]
    r1 = results[("qveil x1", 1, "repeated")]["states_s"] / results[("echo", 1, "-")]["states_s"]
    rb = {
        b: results[("qveil x1", b, "repeated")]["states_s"]
        / results[("echo+mlp", b, "-")]["states_s"]
        for b in (64, 1024)
    }
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    body = "\n\n".join(
        [
            f"Load average at the end of the run: {load} (on {os.cpu_count()} cores; other "
            "work on the machine shows up directly in these numbers).",
            f"Closed loop, {args.concurrency} calls in flight from one grpc.aio client process, "
            f"{args.seconds:g} s per row and round, {args.rounds} interleaved rounds (median "
            "throughput; latency percentiles over all calls; after each cell the run waits "
            "until the qveil servers are idle, their answer logs written); "
            f"GetValues over all {M} actions of an MLP 1-64-64-{M}; "
            "SQLite store (WAL, synchronous=FULL); 'states/s' counts states (each answered for "
            f"every action). Ratios are states/s over the echo and echo+MLP ceilings of the same "
            "batch size.",
            table(
                [
                    "server",
                    "points",
                    "batch",
                    "calls/s",
                    "states/s",
                    "p50 ms",
                    "p99 ms",
                    "/ echo",
                    "/ echo+MLP",
                    "errors",
                ],
                rows,
            ),
            "Answer-function ceiling (`qveil.answer.released_values` in process, one "
            "thread, all actions: the mean and the keyed noise, no gRPC, no log):",
            table(["points", "batch", "states/s"], store_rows),
            f"Targets: single repeated queries / echo = {r1:.2f} (target >= 0.5); "
            f"repeated batches / (gRPC + MLP) = {rb[64]:.2f} at 64, {rb[1024]:.2f} at 1024 "
            "(target >= 0.5).",
        ]
    )
    if args.no_write:
        print(body)
        return 0
    write_section(
        "server",
        "Server: throughput and latency over loopback",
        "python benchmarks/bench_server.py",
        body,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
