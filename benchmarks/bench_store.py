"""Write throughput of the answer log's store -> docs/benchmarks.md, section "store".

    .venv/bin/python benchmarks/bench_store.py [--quick] [--max-n 1000000] [--no-pg]

The store is the durable log of answered noise values: the server's answer-log thread
(:mod:`qveil.server.serving.answer_log`) hands it what was answered, off the answer path, through
``SamplePathStore.record_paths(release, paths, xs, gs)``: the states the log does not hold yet
of every path, in one durable transaction (chained hashes, insert, check, commit). Measures,
in one run (so ratios are comparable):

1. points logged per second on SQLite and PostgreSQL for 1, 100 and 1000 new states per
   call, both actions of a 2-action release per call (as the server logs them), against a raw
   ``sqlite3`` / ``psycopg`` insert loop with the same durability (WAL + synchronous=FULL +
   BEGIN IMMEDIATE; the same table, the append log of migration 0005; the same rows per
   commit) as the ceiling;
2. states already logged handed again (what a known state costs the log: a look-up in the
   in-process copy, no write);
3. the cost against the points already logged in a path (1e3 ... 1e6): the one-off load of
   the path into memory (first ``refresh``) and the write rate at that size.

The values are the release's keyed noise (:class:`qveil.keyed.KeyedPaths`, a seeded key) at
snapped states, as the server logs them.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import load_average, log_axes, save_figure, subplots, table, write_section  # noqa: E402

from qveil.keyed import KeyedPaths, seeded_key, snap  # noqa: E402
from qveil.server.store import open_store  # noqa: E402
from qveil.server.store.integrity import ChainHasher  # noqa: E402

PG_ADMIN = os.environ.get("QVEIL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
RID = "bench"
BETA, SIGMA, ACTIONS = 50.0, 1.0, 4
PATHS = KeyedPaths(key=seeded_key(0), betas=[BETA], sigma=SIGMA, n_actions=ACTIONS)
PNG = Path(__file__).resolve().parent.parent / "docs" / "img" / "bench_store.png"


def _release(store: Any) -> None:
    store.releases.create_release(
        release_id=RID,
        fingerprint="f" * 64,
        sigma=SIGMA,
        beta=BETA,
        interval=(0.0, 1.0),
        n_actions=ACTIONS,
    )


def distinct_states(rng: np.random.Generator, n: int) -> tuple[Any, Any]:
    """(grid indices, snapped states) of ``n`` distinct uniform unit states, in random order
    (uniform draws snapped to the 2^-32 grid collide now and then: about n^2 / 2^33)."""
    idx, xs = snap(rng.uniform(size=n + n // 100 + 10))
    _, first = np.unique(idx, return_index=True)
    keep = rng.permutation(first)[:n]
    return idx[keep], xs[keep]


def answered(rng: np.random.Generator, n: int, paths: list[int]) -> tuple[Any, list[Any]]:
    """``n`` fresh snapped unit states and each path's keyed value at them."""
    idx, xs = snap(rng.uniform(size=n))
    return xs, [PATHS.path_values(p, idx) for p in paths]


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


# -- 1. new points: record_paths vs the raw driver ------------------------------------------------


def _calls(batch: int, quick: bool) -> int:
    n = {1: 150, 100: 30, 1000: 8}[batch]
    return max(3, n // (4 if quick else 1))


def store_log_rate(url: str, batch: int, calls: int, paths: list[int], seed: int) -> float:
    """Points/s of ``record_paths`` logging ``calls`` calls of ``batch`` new states on
    ``paths`` (one durable commit per call)."""
    with open_store(url) as s:
        rng = np.random.default_rng([seed, batch, *paths])
        work = [answered(rng, batch, paths) for _ in range(calls)]
        xs, gs = answered(rng, 1, paths)
        s.record_paths(RID, paths, [xs] * len(paths), gs)  # warm: connection, statements
        t0 = time.perf_counter()
        for xs, gs in work:
            s.record_paths(RID, paths, [xs] * len(paths), gs)
        return batch * len(paths) * calls / (time.perf_counter() - t0)


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


def raw_sqlite_rate(path: Path, batch: int, calls: int, action: int, rows_per_state: int) -> float:
    """The ceiling: a raw sqlite3 insert loop (``rows_per_state`` rows per state, one
    transaction per call), same durability, same table; rows per second."""
    con = raw_connection(path)
    rng = np.random.default_rng(200 + batch + action)
    qs = [rng.uniform(size=batch).tolist() for _ in range(calls)]
    seq = 0
    t0 = time.perf_counter()
    for q in qs:
        con.execute("BEGIN IMMEDIATE")
        for x in q:
            for _ in range(rows_per_state):
                seq += 1
                con.execute(_INSERT, (RID, action, seq, x, 0.0, 0.0, "0" * 64))
        con.execute("COMMIT")
    rate = batch * rows_per_state * calls / (time.perf_counter() - t0)
    con.close()
    return rate


def raw_pg_rate(url: str, batch: int, calls: int, action: int, rows_per_state: int) -> float:
    import psycopg

    con = psycopg.connect(url.replace("postgresql+psycopg", "postgresql"))
    rng = np.random.default_rng(300 + batch + action)
    qs = [rng.uniform(size=batch).tolist() for _ in range(calls)]
    seq = 0
    sql = _INSERT.replace("?", "%s")
    t0 = time.perf_counter()
    for q in qs:
        with con.transaction():
            for x in q:
                for _ in range(rows_per_state):
                    seq += 1
                    con.execute(sql, (RID, action, seq, x, 0.0, 0.0, "0" * 64))
    rate = batch * rows_per_state * calls / (time.perf_counter() - t0)
    con.close()
    return rate


def bench_new(tmp: Path, quick: bool, pg: PgDatabases | None, repeats: int) -> list[list[object]]:
    """Store and raw loop alternate ``repeats`` times per batch size (the disk's fsync rate
    drifts a lot on a shared machine); medians of each, ratio of the medians."""
    rows = []
    spath = tmp / "new.sqlite"
    surl = f"sqlite:///{spath}"
    with open_store(surl) as s:
        _release(s)
    purl = None
    if pg is not None:
        purl = pg.new()
        with open_store(purl) as s:
            _release(s)

    def clear_raw_sqlite() -> None:
        with sqlite3.connect(spath) as c:
            c.execute("DELETE FROM noise_points WHERE action = 3")

    def clear_raw_pg() -> None:
        import psycopg

        assert purl is not None
        with psycopg.connect(purl.replace("postgresql+psycopg", "postgresql")) as c:
            c.execute("DELETE FROM noise_points WHERE action = 3")

    # the store logs paths 0 and 1 (new states each call), the raw loops action 3 (emptied
    # before each run), 2 rows per state as the store's 2 paths
    backends: list[tuple[str, str, Callable[..., float], Any, Callable[[], None]]] = [
        ("SQLite", surl, raw_sqlite_rate, spath, clear_raw_sqlite)
    ]
    if purl is not None:
        backends.append(("PostgreSQL", purl, raw_pg_rate, purl, clear_raw_pg))
    for batch in tqdm((1, 100, 1000), desc="new points"):
        calls = _calls(batch, quick)
        for name, url, raw_fn, raw_target, clear in backends:
            st, raw = [], []
            for rep in range(repeats):
                st.append(store_log_rate(url, batch, calls, [0, 1], seed=rep))
                clear()
                raw.append(raw_fn(raw_target, batch, calls, 3, 2))
            ms, mr = statistics.median(st), statistics.median(raw)
            rows.append([name, batch, 2 * batch, ms, mr, ms / mr])
    return rows


# -- 2. known states: record_paths of points already logged -------------------------------------


def bench_known(tmp: Path, quick: bool) -> list[list[object]]:
    """Points/s of ``record_paths`` handed states the log already holds (no write)."""
    rows = []
    with open_store(f"sqlite:///{tmp / 'known.sqlite'}") as s:
        _release(s)
        rng = np.random.default_rng(1)
        xs, gs = answered(rng, 10_000, [0, 1])
        s.record_paths(RID, [0, 1], [xs, xs], gs)
        for batch, calls in ((1, 20_000), (100, 2_000), (1000, 300)):
            calls //= 5 if quick else 1
            picks = [rng.integers(0, xs.size, batch) for _ in range(min(calls, 200))]
            qs = [(xs[k], [g[k] for g in gs]) for k in picks]

            def run(batch: int = batch, calls: int = calls, qs: list[Any] = qs) -> float:
                t0 = time.perf_counter()
                for i in range(calls):
                    x, g = qs[i % len(qs)]
                    s.record_paths(RID, [0, 1], [x, x], g)
                return 2 * batch * calls / (time.perf_counter() - t0)

            rows.append([batch, statistics.median(run() for _ in range(3))])
    return rows


# -- 3. against the points already logged ------------------------------------------------------


def prefill(path: Path, n: int) -> None:
    """Write n logged points (the keyed values of path 0 at n snapped states, a valid chain)
    with raw sqlite3."""
    idx, xs = distinct_states(np.random.default_rng(n), n)
    gs = PATHS.path_values(0, idx)
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
    for n in tqdm(sizes, desc="logged points"):
        path = tmp / f"scale{n}.sqlite"
        with open_store(f"sqlite:///{path}") as s:
            _release(s)
        prefill(path, n)
        with open_store(f"sqlite:///{path}") as s:
            t0 = time.perf_counter()
            s.paths.refresh(RID)  # first touch: loads the logged points into memory
            load = time.perf_counter() - t0
            rng = np.random.default_rng(5)
            rates = []
            for batch, calls in ((1, 100 if quick else 300), (100, 10 if quick else 30)):
                work = [answered(rng, batch, [0]) for _ in range(calls)]
                t0 = time.perf_counter()
                for xs, gs in work:
                    s.record_paths(RID, [0], [xs], gs)
                rates.append(batch * calls / (time.perf_counter() - t0))
            assert s.verify(RID, 0).ok if n <= 100_000 else True
        rows.append([f"{n:.0e}", load, *rates])
        path.unlink()
        for suffix in ("-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
    return rows


def plot(new: list[list[object]], scale: list[list[object]], path: Path) -> None:
    """PNG: the log against the raw loops per batch size, and the write rate against the
    points already logged."""
    fig, (ax1, ax2) = subplots(1, 2, figsize=(11, 4.2))
    batches = [1, 100, 1000]
    for name, style in (("SQLite", "o-"), ("PostgreSQL", "s-")):
        rs = [r for r in new if r[0] == name]
        if rs:
            ax1.plot(batches, [r[3] for r in rs], style, label=f"record_paths, {name}")
            ax1.plot(batches, [r[4] for r in rs], style.replace("-", "--"), alpha=0.6,
                     label=f"raw insert loop, {name}")  # fmt: skip
    log_axes(
        ax1,
        xlabel="new states per call (2 paths each; one commit per call)",
        ylabel="points (rows) logged / s",
        title="Answer log: write throughput",
        fontsize=7,
    )
    ns = [float(str(r[0])) for r in scale]
    ax2.plot(ns, [r[2] for r in scale], "o-", label="1 new state per call")
    ax2.plot(ns, [r[3] for r in scale], "s-", label="100 new states per call")
    log_axes(
        ax2,
        xlabel="points already logged in the path",
        ylabel="points logged / s",
        title="Write rate against logged points (SQLite)",
        fontsize=7,
    )
    save_figure(fig, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls (smoke run)")
    ap.add_argument("--max-n", type=float, default=1e6, help="largest logged-point count")
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
    load_before = load_average()
    with tempfile.TemporaryDirectory(dir=os.environ.get("QVEIL_BENCH_DIR")) as d:
        tmp = Path(d)
        try:
            new = bench_new(tmp, args.quick, pg, 3 if args.quick else 5)
            known = bench_known(tmp, args.quick)
            scale = bench_scaling(tmp, sizes, args.quick)
        finally:
            if pg is not None:
                pg.drop_all()
    cmd = (
        ".venv/bin/python benchmarks/bench_store.py"
        + (" --quick" if args.quick else "")
        + (f" --max-n {args.max_n:.0e}" if args.max_n != 1e6 else "")
        + (" --no-pg" if args.no_pg else "")
    )
    body = "\n\n".join(
        [
            f"Load average (1, 5, 15 min) before the run: {load_before}; after: "
            f"{load_average()} (2 cores shared with other work; compare ratios within the run).",
            "The server answers without the store (an answer is a pure function of the release "
            "and the state); its answer-log thread logs what was answered afterwards with "
            "`record_paths`, one durable transaction per call here (read the rows other writers "
            "added, keep the states the log does not hold, chained hashes, insert, check, "
            "commit), both actions of a 2-action release per call. Ceiling: a raw driver "
            "insert loop with the same durability, the same table and the same rows per "
            "commit (no chain, no in-process copy). The log and the raw loop alternate; "
            "medians of the runs:\n\n"
            + table(
                [
                    "backend",
                    "new states per call",
                    "rows per commit",
                    "record_paths rows/s",
                    "raw insert loop rows/s",
                    "record_paths / raw",
                ],
                new,
            ),
            "States the log holds already, handed again (what a known state costs the log "
            "thread: one look-up per state and path in the in-process copy, nothing "
            "written; SQLite):\n\n" + table(["states per call", "points checked / s"], known),
            "Against the points already logged in the path (SQLite; the path's first "
            "`refresh` loads it into memory once):\n\n"
            + table(
                [
                    "logged points",
                    "first load (s)",
                    "points/s, 1 new state per call",
                    "points/s, 100 per call",
                ],
                scale,
            ),
        ]
    )
    if args.no_write:
        print(body)
    else:
        plot(new, scale, PNG)
        body += "\n\n![answer log write throughput](img/bench_store.png)"
        write_section("store", "Answer log: write throughput of the store", cmd, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
