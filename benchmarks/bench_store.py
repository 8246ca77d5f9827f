"""Benchmark of the sample-path store -> docs/benchmarks.md, section "store".

    python benchmarks/bench_store.py [--quick] [--max-n 1000000] [--no-pg]

Measures, in one run (so ratios are comparable):
1. cached reads per second in process (known states; no database access);
2. new points per second on SQLite and PostgreSQL for batches of 1, 100 and 1000 states per
   call (one durable commit per call), against a raw ``sqlite3`` / ``psycopg`` insert loop
   with the same durability (WAL + synchronous=FULL + BEGIN IMMEDIATE; same table, the append
   log of migration 0005, same rows per commit) as the ceiling (target: >= half of it), and a
   raw new-point loop that looks neighbours up in SQL (on its own copy of the table with an
   index on x, which the store itself does not have: it looks them up in memory);
3. group commit: 16 threads each asking for single new states, with and without coalescing;
4. insert cost against the number of points already stored per action (1e3 ... 1e6), and the
   one-off cost of loading an action into memory on first touch.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import log_axes, save_figure, subplots, table, write_section  # noqa: E402

from qveil.noise import OUSamplePath  # noqa: E402
from qveil.server.store import open_store  # noqa: E402
from qveil.server.store.integrity import ChainHasher  # noqa: E402

PG_ADMIN = os.environ.get("QVEIL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
RID = "bench"


def _release(store) -> None:  # type: ignore[no-untyped-def]
    store.create_release(
        release_id=RID, fingerprint="f" * 64, sigma=1.0, beta=50.0, interval=(0.0, 1.0), n_actions=4
    )


class PgDatabases:
    """Fresh PostgreSQL databases, dropped at exit."""

    def __init__(self) -> None:
        import psycopg

        self._psycopg = psycopg
        self.names: list[str] = []

    def new(self) -> str:
        name = f"qveil_bench_{uuid.uuid4().hex[:10]}"
        with self._psycopg.connect(PG_ADMIN, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        self.names.append(name)
        return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"

    def drop_all(self) -> None:
        with self._psycopg.connect(PG_ADMIN, autocommit=True) as c:
            for n in self.names:
                c.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    (n,),
                )
                c.execute(f'DROP DATABASE IF EXISTS "{n}"')


def median_rate(fn: Callable[[], float], repeats: int) -> float:
    return statistics.median(fn() for _ in range(repeats))


# -- 1. cached reads ---------------------------------------------------------------------------


def bench_cached(tmp: Path, quick: bool) -> list[list[object]]:
    rows = []
    with open_store(f"sqlite:///{tmp / 'cached.sqlite'}", rng=1) as s:
        _release(s)
        known = np.random.default_rng(1).uniform(size=10_000)
        for k in range(0, known.size, 1000):
            s.get_or_sample(RID, 0, known[k : k + 1000])
        for batch, calls in ((1, 20_000), (100, 2_000), (1000, 300)):
            calls = calls // (5 if quick else 1)
            qs = [
                known[np.random.default_rng(i).integers(0, known.size, batch)]
                for i in range(min(calls, 200))
            ]

            def run(batch: int = batch, calls: int = calls, qs: list = qs) -> float:
                t0 = time.perf_counter()
                for i in range(calls):
                    s.get_or_sample(RID, 0, qs[i % len(qs)])
                return batch * calls / (time.perf_counter() - t0)

            rows.append(["cached read", batch, median_rate(run, 3)])
    return rows


# -- 2. new points: store vs raw driver ---------------------------------------------------------


def _calls(batch: int, quick: bool) -> int:
    n = {1: 150, 100: 30, 1000: 8}[batch]
    return max(3, n // (4 if quick else 1))


def store_new_rate(url: str, batch: int, calls: int, action: int, seed: int = 0) -> float:
    with open_store(url, rng=2) as s:
        if not s.list_releases():
            _release(s)
        rng = np.random.default_rng([seed, batch, action])
        qs = [rng.uniform(size=batch) for _ in range(calls)]
        s.get_or_sample(RID, action, [0.5])  # warm: connections, statement cache
        t0 = time.perf_counter()
        for q in qs:
            s.get_or_sample(RID, action, q)
        return batch * calls / (time.perf_counter() - t0)


_INSERT = (
    "INSERT INTO noise_points (release_id, action, seq, x, g, created_at, hash) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def raw_connection(path: Path) -> sqlite3.Connection:
    """A raw sqlite3 connection with the store's durability: WAL, synchronous=FULL, explicit
    transactions."""
    con = sqlite3.connect(path, isolation_level=None, timeout=30)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    return con


def timed_threads(n: int, work: Callable[[int], None]) -> float:
    """Seconds for ``n`` threads running ``work(i)`` (each should start behind a barrier)."""
    ts = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def raw_sqlite_rate(path: Path, batch: int, calls: int, action: int) -> float:
    """The ceiling: a raw sqlite3 insert loop, same durability, same table and index."""
    con = raw_connection(path)
    rng = np.random.default_rng(200 + batch + action)
    qs = [rng.uniform(size=batch).tolist() for _ in range(calls)]
    rate = _commit_each(con, qs, lambda x, seq: (RID, action, seq, x, 0.0, 0.0, "0" * 64))
    con.close()
    return rate


def _commit_each(
    con: sqlite3.Connection, qs: list[list[float]], row: Callable[[float, int], tuple[object, ...]]
) -> float:
    """Insert ``row(x, seq)`` for every state of each batch of ``qs``, one transaction per
    batch (seq counting from 1); states per second."""
    seq = 0
    t0 = time.perf_counter()
    for q in qs:
        con.execute("BEGIN IMMEDIATE")
        for x in q:
            seq += 1
            con.execute(_INSERT, row(x, seq))
        con.execute("COMMIT")
    return sum(map(len, qs)) / (time.perf_counter() - t0)


_LEFT = (
    "SELECT x, g FROM noise_points WHERE release_id = ? AND action = ? AND coordinate = 0 "
    "AND x < ? ORDER BY x DESC LIMIT 1"
)
_RIGHT = (
    "SELECT x, g FROM noise_points WHERE release_id = ? AND action = ? AND coordinate = 0 "
    "AND x > ? ORDER BY x LIMIT 1"
)


def raw_sqlite_newpoint_rate(path: Path, batch: int, calls: int, action: int) -> float:
    """A minimal raw new-point loop: per point two neighbour SELECTs, the exact conditional
    draw (qveil.noise.conditional_moments), one INSERT; same durability; no hash chain. The
    neighbour SELECTs need an index on x: ``path`` gets one (the store's table has none
    since migration 0005), so give it a file of its own."""
    from qveil.noise import conditional_moments

    con = raw_connection(path)
    con.execute(
        "CREATE UNIQUE INDEX IF NOT EXISTS raw_x "
        "ON noise_points (release_id, action, coordinate, x)"
    )
    rng = np.random.default_rng(400 + batch + action)
    qs = [rng.uniform(size=batch).tolist() for _ in range(calls)]
    z = iter(rng.standard_normal(batch * calls).tolist())

    def row(x: float, seq: int) -> tuple[object, ...]:
        left = con.execute(_LEFT, (RID, action, x)).fetchone()
        right = con.execute(_RIGHT, (RID, action, x)).fetchone()
        m, sd = conditional_moments(
            beta=50.0,
            sigma=1.0,
            d_left=None if left is None else x - left[0],
            g_left=None if left is None else left[1],
            d_right=None if right is None else right[0] - x,
            g_right=None if right is None else right[1],
        )
        return (RID, action, seq, x, m + sd * next(z), 0.0, "0" * 64)

    rate = _commit_each(con, qs, row)
    con.close()
    return rate


def raw_pg_rate(url: str, batch: int, calls: int, action: int) -> float:
    import psycopg

    con = psycopg.connect(url.replace("postgresql+psycopg", "postgresql"))
    rng = np.random.default_rng(300 + batch + action)
    qs = [rng.uniform(size=batch).tolist() for _ in range(calls)]
    h = "0" * 64
    seq = 0
    sql = _INSERT.replace("?", "%s")
    t0 = time.perf_counter()
    for q in qs:
        with con.transaction():
            for x in q:
                seq += 1
                con.execute(sql, (RID, action, seq, x, 0.0, 0.0, h))
    rate = batch * calls / (time.perf_counter() - t0)
    con.close()
    return rate


def bench_new(tmp: Path, quick: bool, pg: PgDatabases | None, repeats: int) -> list[list[object]]:
    """Store and raw loop alternate ``repeats`` times per batch size (the disk's fsync rate
    drifts a lot on a shared machine); medians of each, ratio of the medians."""
    import psycopg

    rows = []
    spath = tmp / "new.sqlite"
    surl = f"sqlite:///{spath}"
    with open_store(surl) as s:
        _release(s)
    npath = tmp / "newpoint.sqlite"  # the raw new-point loop's own file (it adds an x index)
    with open_store(f"sqlite:///{npath}") as s:
        _release(s)
    purl = None
    if pg is not None:
        purl = pg.new()
        with open_store(purl) as s:
            _release(s)

    def clear_raw_sqlite(path: Path = spath) -> None:
        with sqlite3.connect(path) as c:
            c.execute("DELETE FROM noise_points WHERE action = 3")

    def clear_raw_pg() -> None:
        assert purl is not None
        with psycopg.connect(purl.replace("postgresql+psycopg", "postgresql")) as c:
            c.execute("DELETE FROM noise_points WHERE action = 3")

    # the store writes actions 0-2, the raw loops action 3 (emptied before each run)
    for i, batch in enumerate(tqdm((1, 100, 1000), desc="new points")):
        calls = _calls(batch, quick)
        backends = [("SQLite", surl, raw_sqlite_rate, spath, clear_raw_sqlite)]
        if purl is not None:
            backends.append(("PostgreSQL", purl, raw_pg_rate, purl, clear_raw_pg))
        for name, url, raw_fn, raw_target, clear in backends:
            st, raw, rawnp = [], [], []
            for rep in range(repeats):
                st.append(store_new_rate(url, batch, calls, i, seed=rep))
                clear()
                raw.append(raw_fn(raw_target, batch, calls, 3))  # type: ignore[operator]
                if name == "SQLite":
                    clear_raw_sqlite(npath)
                    rawnp.append(raw_sqlite_newpoint_rate(npath, batch, calls, 3))
            ms, mr = statistics.median(st), statistics.median(raw)
            mnp = statistics.median(rawnp) if rawnp else float("nan")
            rows.append([name, batch, ms, mr, ms / mr, mnp, ms / mnp])
    return rows


# -- 3. group commit -------------------------------------------------------------------------


def bench_coalesce(tmp: Path, quick: bool) -> list[list[object]]:
    rows = []
    for coalesce in (False, True):
        with open_store(f"sqlite:///{tmp / f'co{int(coalesce)}.sqlite'}", rng=3) as s:
            _release(s)
            s.coalesce = coalesce
            per = 25 if quick else 60
            barrier = threading.Barrier(16)

            def work(i: int, s=s, per: int = per, barrier=barrier) -> None:  # type: ignore[no-untyped-def]
                rng = np.random.default_rng(i)
                barrier.wait()
                for _ in range(per):
                    s.get_or_sample(RID, 0, rng.uniform(size=1))

            dt = timed_threads(16, work)
            commits = s._writer_scalar(  # type: ignore[attr-defined]
                "SELECT count(DISTINCT created_at) FROM noise_points"
            )
            rows.append(["on" if coalesce else "off", 16 * per / dt, 16 * per / commits])
    return rows


# -- 4. scaling with stored points --------------------------------------------------------------


def prefill(path: Path, n: int) -> None:
    """Write n valid points (an exact OU path, a valid chain) for action 0 with raw sqlite3."""
    xs = np.sort(np.random.default_rng(n).uniform(size=n))
    gs = OUSamplePath(beta=50.0, sigma=1.0, rng=n).sample(xs)
    hasher = ChainHasher()
    prev = hasher.genesis(RID, 0)
    rows = []
    now = time.time()
    for k, (x, g) in enumerate(zip(xs.tolist(), gs.tolist(), strict=True), start=1):
        prev = hasher.link(prev, k, x, g)
        rows.append((RID, 0, k, x, g, now, prev.hex()))
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("BEGIN IMMEDIATE")
    con.executemany(_INSERT, rows)
    con.execute("COMMIT")
    con.close()


def bench_scaling(tmp: Path, sizes: list[int], quick: bool) -> list[list[object]]:
    rows = []
    for n in tqdm(sizes, desc="stored points"):
        path = tmp / f"scale{n}.sqlite"
        with open_store(f"sqlite:///{path}") as s:
            _release(s)
        prefill(path, n)
        with open_store(f"sqlite:///{path}", rng=4) as s:
            t0 = time.perf_counter()
            s.get_or_sample(RID, 0, [0.5])  # first touch: loads the action into memory
            load = time.perf_counter() - t0
            rng = np.random.default_rng(5)
            k1 = 100 if quick else 300
            t0 = time.perf_counter()
            for _ in range(k1):
                s.get_or_sample(RID, 0, rng.uniform(size=1))
            r1 = k1 / (time.perf_counter() - t0)
            k100 = 10 if quick else 30
            t0 = time.perf_counter()
            for _ in range(k100):
                s.get_or_sample(RID, 0, rng.uniform(size=100))
            r100 = 100 * k100 / (time.perf_counter() - t0)
            assert s.verify(RID, 0).ok if n <= 100_000 else True
        rows.append([f"{n:.0e}", load, r1, r100])
        path.unlink()
        for suffix in ("-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
    return rows


def plot(new: list[list[object]], scale: list[list[object]], path: Path) -> None:
    """PNG: store vs raw loops per batch size, and new-point rate against stored points."""
    fig, (ax1, ax2) = subplots(1, 2, figsize=(11, 4))
    batches = [1, 100, 1000]
    for name, style in (("SQLite", "o-"), ("PostgreSQL", "s-")):
        rs = [r for r in new if r[0] == name]
        if rs:
            ax1.plot(batches, [r[2] for r in rs], style, label=f"store, {name}")
            ax1.plot(
                batches,
                [r[3] for r in rs],
                style.replace("-", "--"),
                label=f"raw insert loop, {name}",
                alpha=0.6,
            )
    rs = [r for r in new if r[0] == "SQLite"]
    if rs:
        ax1.plot(batches, [r[5] for r in rs], "^:", label="raw new-point loop, SQLite")
    log_axes(
        ax1,
        xlabel="states per call (one commit each)",
        ylabel="new states / s",
        title="New points",
        fontsize=7,
    )
    plot_against_stored(
        ax2,
        scale,
        [(2, "o-", "1 state per call"), (3, "s-", "100 states per call")],
        title="Insert cost vs stored points (SQLite)",
        fontsize=7,
    )
    save_figure(fig, path)


def plot_against_stored(
    ax: Any,
    scale: Sequence[Sequence[object]],
    series: Sequence[tuple[int, str, str]],
    *,
    title: str,
    fontsize: int = 8,
) -> None:
    """New states/s against the points already stored (the first column of the ``scale``
    rows), a line per (column, style, label) of ``series``, on log-log axes."""
    ns = [float(str(r[0])) for r in scale]
    for col, style, label in series:
        ax.plot(ns, [r[col] for r in scale], style, label=label)
    log_axes(
        ax,
        xlabel="points already stored in the action",
        ylabel="new states / s",
        title=title,
        fontsize=fontsize,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls (smoke run)")
    ap.add_argument("--max-n", type=float, default=1e6, help="largest stored-point count")
    ap.add_argument("--no-pg", action="store_true", help="skip PostgreSQL")
    ap.add_argument("--no-write", action="store_true", help="print, do not write the doc")
    args = ap.parse_args()
    pg = None
    if not args.no_pg:
        try:
            pg = PgDatabases()
            pg.drop_all()
            pg.new()
        except Exception as exc:  # noqa: BLE001
            print(f"PostgreSQL unavailable, skipped: {exc}")
            pg = None
    sizes = [n for n in (1000, 10_000, 100_000, 1_000_000) if n <= args.max_n]
    with tempfile.TemporaryDirectory(dir=os.environ.get("QVEIL_BENCH_DIR")) as d:
        tmp = Path(d)
        try:
            cached = bench_cached(tmp, args.quick)
            new = bench_new(tmp, args.quick, pg, 3 if args.quick else 5)
            co = bench_coalesce(tmp, args.quick)
            scale = bench_scaling(tmp, sizes, args.quick)
        finally:
            if pg is not None:
                pg.drop_all()
    cmd = (
        "python benchmarks/bench_store.py"
        + (" --quick" if args.quick else "")
        + (f" --max-n {args.max_n:.0e}" if args.max_n != 1e6 else "")
        + (" --no-pg" if args.no_pg else "")
    )
    body = "\n\n".join(
        [
            "Cached reads (known states, answered from the in-process copy; no database):\n\n"
            + table(["what", "states per call", "states/s"], cached),
            "New points (one durable commit per call: new rows since the last call read, "
            "neighbours looked up, exact draw, chained hash, insert, check, commit) against a raw "
            "driver insert loop with the same durability, same table and index, same rows per "
            "commit (the ceiling). Store and raw loop alternate; medians of the runs:\n\n"
            + table(
                [
                    "backend",
                    "states per call",
                    "store new states/s",
                    "raw insert loop rows/s",
                    "store / raw",
                    "raw new-point loop states/s",
                    "store / raw new-point",
                ],
                new,
            )
            + "\n\nThe raw insert loop only inserts; the raw new-point loop (SQLite only) also "
            "reads both neighbours and draws, but keeps no chain and no in-memory copy.",
            "Group commit: 16 threads, each asking for one new state per call (SQLite). With "
            "coalescing, the writer holding the lock also stores the states other threads queued "
            "meanwhile, in the same commit:\n\n"
            + table(["coalescing", "new states/s", "states per commit"], co),
            "Cost against points already stored in the action (SQLite; the action's first touch "
            "loads it into memory once):\n\n"
            + table(
                [
                    "stored points",
                    "first-touch load (s)",
                    "new states/s, 1 per call",
                    "new states/s, 100 per call",
                ],
                scale,
            ),
        ]
    )
    if args.no_write:
        print(body)
    else:
        png = Path(__file__).resolve().parent.parent / "docs" / "img" / "bench_store.png"
        plot(new, scale, png)
        body += "\n\n![store benchmark](img/bench_store.png)"
        write_section("store", "Sample-path store", cmd, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
