"""Server memory per logged point -> docs/benchmarks.md, section "memory",
and the figure docs/memory_per_point.png.

    .venv/bin/python benchmarks/bench_memory.py [--points 2000000]

One real `qveil serve` over a fresh SQLite store (rate limit and cap lifted for the run) is
fed batches of new states (4096 states x 2 actions = 8192 points per call) until its answer
log holds ``--points`` points (the rows in the store, counted before each reading, so the log
has caught up); its resident set size (VmRSS of the server process, from /proc) is read at
doubling levels. Answers need no stored point (they are a pure function of the release and
the state), but the answer log keeps an in-process copy of every logged point of the release
(a map x -> g and a sorted index per path: a state logged once is not written again), so
memory grows with the logged points; the requirement is that it grows no faster than they
do: the marginal bytes per point must not rise with the log's size. Ceiling of the same run:
the raw payload, 16 bytes per point (two doubles).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import grpc  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import save_figure, subplots, table, write_section  # noqa: E402
from bench_server import M, bench_home, make_bundle, serve_args, spawn, wait_ready  # noqa: E402

from qveil.v1 import value_service_pb2 as pb  # noqa: E402
from qveil.v1 import value_service_pb2_grpc as pb_grpc  # noqa: E402

QVEIL = str(Path(sys.executable).parent / "qveil")
FIG = Path(__file__).resolve().parent.parent / "docs" / "memory_per_point.png"
BATCH = 4096


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS")


def logged_rows(db: Path, want: int, timeout: float = 600.0) -> int:
    """Wait until the answer log has caught up: the store at ``db`` holds ``want`` rows, or
    its count has not moved for 2 s (two random states may snap to one grid point, logged
    once), and return its row count."""
    t0 = last_change = time.monotonic()
    last = -1
    while True:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        try:
            n = int(con.execute("SELECT count(*) FROM noise_points").fetchone()[0])
        finally:
            con.close()
        now = time.monotonic()
        if n != last:
            last, last_change = n, now
        if n >= want or now - last_change > 2.0 or now - t0 > timeout:
            return n
        time.sleep(0.2)


def fill(tmp: Path, levels: list[int], cap: int) -> list[tuple[int, float, float]]:
    """Serve a fresh bundle on a fresh SQLite store, feed it new states until its log holds
    each level of points in turn, and read its resident set size at each: (points, RSS MB,
    seconds since the first level started), the empty server (after one warm-up state)
    first."""
    bench_home(tmp)
    bundle = make_bundle(tmp / "bundle")
    port_file = tmp / "port"
    db = tmp / "store.sqlite"
    proc, port = spawn(
        serve_args(
            [QVEIL], bundle, f"sqlite:///{db}", port_file,
            "--state-rate", "1e12", "--max-stored-points", str(cap),
        ),
        port_file,
    )  # fmt: skip
    rng = np.random.default_rng(0)
    try:
        target = f"127.0.0.1:{port}"
        wait_ready(target)
        with grpc.insecure_channel(
            target, options=[("grpc.max_receive_message_length", 1 << 26)]
        ) as ch:
            stub = pb_grpc.ValueServiceStub(ch)
            stored = logged_rows(db, M)  # the warm-up state
            rows_raw = [(stored, rss_mb(proc.pid), 0.0)]
            t0 = time.perf_counter()
            for level in levels:
                while stored < level:
                    n = min(BATCH, max(1, (level - stored) // M))
                    stub.GetValues(pb.GetValuesRequest(states=rng.random(n).tolist()), timeout=600)
                    stored += n * M
                stored = logged_rows(db, stored)
                time.sleep(0.5)
                rss = rss_mb(proc.pid)
                rows_raw.append((stored, rss, time.perf_counter() - t0))
                took = time.perf_counter() - t0
                print(
                    f"{stored:>10,d} points  RSS {rss:8.1f} MB  ({took:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return rows_raw


def table_rows(rows_raw: list[tuple[int, float, float]]) -> list[tuple[object, ...]]:
    """Per level after the empty server: its RSS, growth, bytes per point in total and in
    this step, the step against the first step, MB per million points, the payload ratio."""
    base = rows_raw[0][1]
    rows: list[tuple[object, ...]] = []
    prev_pts, prev_rss = rows_raw[0][0], rows_raw[0][1]
    first_marginal = None
    for pts, rss, _sec in rows_raw[1:]:
        total_bpp = (rss - base) * 2**20 / (pts - rows_raw[0][0])
        marginal = (rss - prev_rss) * 2**20 / (pts - prev_pts)
        first_marginal = first_marginal or marginal
        rows.append(
            (
                f"{pts:,d}",
                rss,
                rss - base,
                total_bpp,
                marginal,
                f"{marginal / first_marginal:.2f}",
                (rss - base) / ((pts - rows_raw[0][0]) / 1e6),
                f"{16 / total_bpp:.3f}",
            )
        )
        prev_pts, prev_rss = pts, rss
    return rows


def section_body(rows: list[tuple[object, ...]], base: float) -> str:
    last = rows[-1]
    body = table(
        [
            "logged points",
            "RSS MB",
            "RSS - empty MB",
            "bytes/point (total)",
            "bytes/point (this step)",
            "step vs first step",
            "MB per million points",
            "payload ceiling (16 B) / total",
        ],
        rows,
    )
    marginal_last = float(str(last[4]))
    at_cap = (
        float(str(last[2])) + (10e6 - int(str(last[0]).replace(",", ""))) * marginal_last / 2**20
    ) / 1024
    return body + (
        f"\n\nEmpty server: {base:.1f} MB. At {last[0]} logged points the server holds "
        f"{float(str(last[6])):.0f} MB per million logged points, and each further point costs "
        f"about {marginal_last:.0f} bytes (the last step). The bytes per point of each step "
        "against the first ('step vs first step'; at or below 1: memory grows no faster than "
        "the points; the first steps also pay one-time costs such as SQLite's page cache). "
        "Answers do not read these points; the answer log keeps them so that a state logged "
        "once is not written again: per path a dict x -> g (a dict entry, two Python float "
        "objects) and a sorted float64 index (16 bytes), far above the 16-byte payload. Size "
        "`--max-stored-points` (the log's cap per release) from this: extrapolated at the "
        f"last step's rate, the default 10 million points need about {at_cap:.1f} GB for one "
        "release.\n\n"
        "![memory per point](memory_per_point.png)"
    )


def plot(rows_raw: list[tuple[int, float, float]]) -> None:
    fig, ax = subplots(figsize=(5, 3.2))
    pts = np.array([r[0] for r in rows_raw]) / 1e6
    ax.plot(pts, [r[1] for r in rows_raw], "o-", label="server RSS")
    ax.set_xlabel("logged points (millions)")
    ax.set_ylabel("resident memory (MB)")
    ax.set_title("qveil serve: memory vs logged points", fontsize=9)
    ax.legend(loc="upper left")
    save_figure(fig, FIG, dpi=100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=2_000_000, help="points logged at the end")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    levels = []
    lv = 125_000
    while lv < args.points:
        levels.append(lv)
        lv *= 2
    levels.append(args.points)
    with tempfile.TemporaryDirectory() as d:
        rows_raw = fill(Path(d), levels, 10 * args.points)
    body = section_body(table_rows(rows_raw), rows_raw[0][1])
    if args.no_write:
        print(body)
        return 0
    plot(rows_raw)
    write_section(
        "memory",
        "Server memory per stored point",
        f".venv/bin/python benchmarks/bench_memory.py --points {args.points}",
        body,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
