"""New-point throughput with group commit -> docs/benchmarks.md, sections
"newpoints" (1), "newpoints-batch" (2) and "newpoints-cost" (3).

    .venv/bin/python benchmarks/bench_newpoints.py [--quick] [--baseline REV] [--max-n 1e6]
        [--sweeps 3] [--only groupcommit|batch|cost]

``--only NAME`` runs one part alone and rewrites only its section (each section names the
command and commit it comes from).

Measures, in one run (ratios against ceilings measured in the same run):

1. one new state per call, 16 callers in flight, both actions of a 2-action release per call
   (as GetValues does), SQLite WAL + synchronous=FULL: the store in process (16 threads,
   ``get_or_sample_actions``) and a real ``qveil serve --workers 16`` over loopback (16 grpc.aio
   calls in flight), against raw ``sqlite3`` committing one state (2 rows, chained hashes) per
   transaction into the same schema; p50 latency at one caller; with ``--baseline REV`` the
   same server cells for the code of REV (``git archive``), in the same run;
2. batches of 1024 new states per call into an action already holding 200k points, against
   raw ``sqlite3`` 1000-row commits (chained hashes, same schema) into a copy of that table;
3. new points 100 per call against the points already stored (1e3 ... 1e6), in ``--sweeps``
   sweeps: store and raw ``sqlite3`` on the same (append-log, migration 0005) schema with
   the same rows per commit side by side, raw ``sqlite3`` with the unique x index the table
   had before 0005, WAL pages per commit of both, and the resident memory the in-process
   copy of one action takes per million points.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import table, write_section  # noqa: E402
from bench_store import _INSERT, RID, PgDatabases, _release, prefill  # noqa: E402

from qveil.server.store import open_store  # noqa: E402
from qveil.server.store.integrity import ChainHasher  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _raw_con(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(path, isolation_level=None, timeout=30)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    return con


def raw_commits(  # type: ignore[no-untyped-def]
    path: Path, action: int, states_per_commit: int, commits: int, n_actions: int, seed: int = 0
):
    """Raw sqlite3: ``commits`` transactions of ``states_per_commit`` random states, one row per
    state and action with its chained hash (what the store writes). Returns states/s."""
    con = _raw_con(path)
    hasher = ChainHasher()
    acts = list(range(action, action + n_actions))
    seq = {
        a: con.execute(
            "SELECT coalesce(max(seq), 0) FROM noise_points WHERE release_id = ? AND action = ?",
            (RID, a),
        ).fetchone()[0]
        for a in acts
    }
    prev = {a: hasher.genesis(RID, a) for a in acts}
    rng = np.random.default_rng([seed, action, states_per_commit])
    qs = [rng.uniform(size=states_per_commit).tolist() for _ in range(commits)]
    z = iter(rng.standard_normal(states_per_commit * commits * n_actions).tolist())
    t0 = time.perf_counter()
    for q in qs:
        now = time.time()
        rows = []
        for a in acts:
            for x in q:
                seq[a] += 1
                g = next(z)
                prev[a] = hasher.link(prev[a], seq[a], x, g)
                rows.append((RID, a, seq[a], x, g, now, prev[a].hex()))
        con.execute("BEGIN IMMEDIATE")
        con.executemany(_INSERT, rows)
        con.execute("COMMIT")
    rate = states_per_commit * commits / (time.perf_counter() - t0)
    con.close()
    return rate


def raw_pg_commits(url: str, commits: int, seed: int) -> float:
    """Raw psycopg: one state (2 rows, chained hashes) per transaction. Returns states/s."""
    import psycopg

    con = psycopg.connect(url.replace("postgresql+psycopg", "postgresql"))
    hasher = ChainHasher()
    prev = {a: hasher.genesis(RID, a) for a in (2, 3)}  # the chain itself is not checked here
    rng = np.random.default_rng([seed, 9])
    sql = _INSERT.replace("?", "%s")
    seq = con.execute(
        "SELECT coalesce(max(seq), 0) FROM noise_points WHERE release_id = %s AND action = 2",
        (RID,),
    ).fetchone()[0]
    con.commit()
    t0 = time.perf_counter()
    for x in rng.uniform(size=commits).tolist():
        seq += 1
        with con.transaction():
            for a in (2, 3):
                g = float(rng.standard_normal())
                prev[a] = hasher.link(prev[a], seq, x, g)
                con.execute(sql, (RID, a, seq, x, g, time.time(), prev[a].hex()))
    rate = commits / (time.perf_counter() - t0)
    con.close()
    return rate


def wal_pages_per_commit(path: Path, batch: int, commits: int = 10) -> float:
    """Pages each raw ``batch``-row commit (random x, chained hashes) appends to the WAL,
    counted with autocheckpoint off: the I/O a commit costs, whatever the disk's speed."""
    con = _raw_con(path)
    con.execute("PRAGMA wal_autocheckpoint = 0")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    seq = con.execute("SELECT coalesce(max(seq), 0) FROM noise_points WHERE action = 0")
    seq = seq.fetchone()[0]
    rng = np.random.default_rng([7, batch])
    for _ in range(commits):
        rows = []
        for x in rng.uniform(size=batch).tolist():
            seq += 1
            rows.append((RID, 0, seq, x, 0.5, 0.0, "0" * 64))
        con.execute("BEGIN IMMEDIATE")
        con.executemany(_INSERT, rows)
        con.execute("COMMIT")
    frames = con.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
    con.close()
    return float(frames) / commits


# -- 1. one new state per call --------------------------------------------------------------


def store_threads(
    url: str, threads: int, per: int, *, together: bool = True, seed: int = 0
) -> dict[str, float]:
    """``threads`` threads, each asking ``per`` single new states of actions 0 and 1."""
    with open_store(url) as s:
        if not s.list_releases():
            _release(s)
        s.get_or_sample_actions(RID, [0, 1], [0.5])
        commits0 = s._writer_scalar(  # type: ignore[attr-defined]
            "SELECT count(DISTINCT created_at) FROM noise_points WHERE action = 0"
        )
        n0 = s.count_points(RID, 0)
        barrier = threading.Barrier(threads)
        lat: list[float] = []

        def work(i: int) -> None:
            rng = np.random.default_rng([i, per, threads, seed])
            barrier.wait()
            for _ in range(per):
                x = rng.uniform(size=1)
                t0 = time.perf_counter()
                if together:
                    s.get_or_sample_actions(RID, [0, 1], x)
                else:  # one transaction per action (the baseline without group commit)
                    s.get_or_sample(RID, 0, x)
                    s.get_or_sample(RID, 1, x)
                lat.append(time.perf_counter() - t0)

        ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        dt = time.perf_counter() - t0
        before = (commits0, n0)
        commits = s._writer_scalar(  # type: ignore[attr-defined]
            "SELECT count(DISTINCT created_at) FROM noise_points WHERE action = 0"
        )
        n = s.count_points(RID, 0)
        commits, n = commits - before[0], n - before[1]
    return {
        "states_s": threads * per / dt,
        "p50_ms": float(np.median(lat)) * 1e3,
        "per_commit": n / max(1, commits),
    }


def _baseline_tree(rev: str, dest: Path) -> Path:
    """The code of ``rev`` laid out as an importable ``qveil`` package (PYTHONPATH=result)."""
    src = dest / "src"
    src.mkdir(parents=True)
    arch = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(src)], input=arch.stdout, check=True)
    pkg = dest / "pkg" / "qveil"
    shutil.copytree(src / "core", pkg)
    for sub, there in (
        ("server", "server"),
        ("client", "client"),
        ("trainer", "trainer"),
        ("experiments", "experiments"),
        ("proto/qveil/v1", "v1"),
    ):
        shutil.copytree(src / sub, pkg / there)
    return dest / "pkg"


def _spawn_server(  # type: ignore[no-untyped-def]
    bundle: Path, store: str, tmp: Path, tag: str, pythonpath: str | None, workers: int = 16
):
    from bench_server import serve_args, spawn, wait_ready

    env_pp = os.environ.get("PYTHONPATH")
    if pythonpath:
        os.environ["PYTHONPATH"] = pythonpath
    try:
        port_file = tmp / f"{tag}.port"
        proc, port = spawn(
            serve_args(
                [sys.executable, "-m", "qveil.cli"], bundle, store, port_file,
                "--workers", str(workers),
            ),
            port_file,
        )  # fmt: skip
    finally:
        if pythonpath:
            if env_pp is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = env_pp
    wait_ready(f"127.0.0.1:{port}")
    return proc, f"127.0.0.1:{port}"


def server_cells(
    tmp: Path, seconds: float, rounds: int, baseline: str | None
) -> list[list[object]]:
    from bench_server import closed_loop, make_bundle, spawn

    template = make_bundle(tmp / "bundle")

    def bundle(tag: str) -> Path:
        """An unbound copy per server: a bundle binds to the first store that serves it
        (one release, one store), so one copy serves one store."""
        dest = tmp / f"bundle-{tag}"
        shutil.copytree(template, dest)
        return dest

    servers: dict[str, str] = {}
    procs = []
    try:
        p, t = _spawn_server(bundle("new"), f"sqlite:///{tmp / 'srv.sqlite'}", tmp, "new", None)
        procs.append(p)
        servers["qveil --workers 16"] = t
        p, t = _spawn_server(bundle("w4"), f"sqlite:///{tmp / 'srv4.sqlite'}", tmp, "w4", None, 4)
        procs.append(p)
        servers["qveil --workers 4"] = t
        if baseline:
            pp = str(_baseline_tree(baseline, tmp / "baseline"))
            p, t = _spawn_server(bundle("old"), f"sqlite:///{tmp / 'old.sqlite'}", tmp, "old", pp)
            procs.append(p)
            servers[f"qveil at {baseline} (before), --workers 16"] = t
        ep, eport = spawn(
            [sys.executable, str(ROOT / "benchmarks" / "bench_server.py"), "--echo-server",
             str(tmp / "e.port")],
            tmp / "e.port",
        )  # fmt: skip
        procs.append(ep)
        servers["echo (gRPC ceiling)"] = f"127.0.0.1:{eport}"
        pool = np.zeros(1)
        runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for _ in range(rounds):
            for name, target in servers.items():
                for conc in (16, 1):
                    r = asyncio.run(closed_loop([target], 1, "new", seconds, conc, pool))
                    runs.setdefault((name, conc), []).append(r)
        rows = []
        for (name, conc), rs in runs.items():
            lat = np.concatenate([r["lat"] for r in rs]) * 1000
            rows.append(
                [
                    name,
                    conc,
                    float(np.median([r["states_s"] for r in rs])),
                    float(np.percentile(lat, 50)),
                    float(np.percentile(lat, 99)),
                    int(sum(r["errors"] for r in rs)),
                ]
            )
        return rows
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def pg_cells(per: int, reps: int) -> list[list[object]]:
    """The same on PostgreSQL (fresh database; the raw loop writes actions 2 and 3)."""
    try:
        pg = PgDatabases()
        url = pg.new()
    except Exception as exc:  # noqa: BLE001
        print(f"PostgreSQL unavailable, skipped: {exc}", file=sys.stderr)
        return []
    try:
        with open_store(url) as s:
            s.create_release(
                release_id=RID,
                fingerprint="f" * 64,
                sigma=1.0,
                beta=50.0,
                interval=(0.0, 1.0),
                n_actions=4,
            )
        sixteen, one, raw = [], [], []
        for rep in range(reps):
            sixteen.append(store_threads(url, 16, per, seed=100 + rep))
            one.append(store_threads(url, 1, 2 * per, seed=200 + rep))
            raw.append(raw_pg_commits(url, 4 * per, rep))
        mraw = statistics.median(raw)
        rows: list[list[object]] = []
        for key, rs in (("PostgreSQL: 16 callers", sixteen), ("PostgreSQL: 1 caller", one)):
            sps = statistics.median(r["states_s"] for r in rs)
            rows.append(
                [
                    key,
                    sps,
                    statistics.median(r["p50_ms"] for r in rs),
                    statistics.median(r["per_commit"] for r in rs),
                    sps / mraw,
                ]
            )
        rows.append(["PostgreSQL: raw psycopg, one state per commit", mraw, "", 1.0, 1.0])
        return rows
    finally:
        pg.drop_all()


# -- 2. batches into a big table -------------------------------------------------------------


def bench_batch(tmp: Path, quick: bool, repeats: int) -> list[object]:
    n = 200_000
    calls = 4 if quick else 10
    a_path, b_path = tmp / "batch_store.sqlite", tmp / "batch_raw.sqlite"
    with open_store(f"sqlite:///{a_path}") as s:
        _release(s)
    prefill(a_path, n)
    shutil.copy(a_path, b_path)
    st, raw = [], []
    with open_store(f"sqlite:///{a_path}", rng=7) as s:
        s.get_or_sample(RID, 0, [0.5])  # first touch: load the 200k points
        for rep in range(repeats):
            rng = np.random.default_rng([rep, 1024])
            qs = [rng.uniform(size=1024) for _ in range(calls)]
            t0 = time.perf_counter()
            for q in qs:
                s.get_or_sample(RID, 0, q)
            st.append(1024 * calls / (time.perf_counter() - t0))
            raw.append(raw_commits(b_path, 0, 1000, calls, 1, seed=rep))
    ms, mr = statistics.median(st), statistics.median(raw)
    return [n, ms, mr, ms / mr]


# -- 3. cost against stored points -----------------------------------------------------------

#: the unique index noise_points had before migration 0005 (for the raw "before" column)
_OLD_X_INDEX = (
    "CREATE UNIQUE INDEX uq_before_0005 ON noise_points (release_id, action, coordinate, x)"
)


def old_schema_copy(src: Path, dest: Path) -> None:
    """``src``'s rows with the unique (release, action, coordinate, x) index the store had
    before migration 0005 (the append log), for the raw comparison. The index is grown as a
    store grew it, by rows arriving in random state order (a CREATE INDEX over sorted rows
    would pack its leaves full, and every later insert would split one)."""
    shutil.copy(src, dest)
    con = sqlite3.connect(dest, isolation_level=None)
    ddl = con.execute("SELECT sql FROM sqlite_master WHERE name = 'noise_points'").fetchone()[0]
    con.execute("BEGIN")
    con.execute("ALTER TABLE noise_points RENAME TO np_src")
    con.execute(ddl)
    con.execute(_OLD_X_INDEX)
    con.execute("INSERT INTO noise_points SELECT * FROM np_src ORDER BY hash")  # random order
    con.execute("DROP TABLE np_src")
    con.execute("COMMIT")
    con.close()


def memory_us_per_state(path: Path, calls: int, rounds: int, seed: int) -> float:
    """The in-process part of a new point alone: the same rows in a memory store (no
    database), 100 new states per call; microseconds per new state, median of ``rounds``."""
    from qveil.server.store.memory import MemoryStore

    with open_store(f"sqlite:///{path}") as s:
        rec = s.get_release(RID)
        rows = [r for _a, r in s._db_iter_rows(RID, 0)]
    with MemoryStore(rng=seed) as m:
        m._db_import(rec, {0: rows})
        m.get_or_sample(RID, 0, [0.5])  # first touch
        del rows
        rng = np.random.default_rng([6, seed])
        out = []
        for _ in range(rounds):
            qs = [rng.uniform(size=100) for _ in range(calls)]
            t0 = time.perf_counter()
            for q in qs:
                m.get_or_sample(RID, 0, q)
            out.append((time.perf_counter() - t0) / (100 * calls) * 1e6)
    return statistics.median(out)


def _unlink_db(*paths: Path) -> None:
    for p in paths:
        for suffix in ("", "-wal", "-shm"):
            Path(str(p) + suffix).unlink(missing_ok=True)


# long-function: one sweep of the scaling benchmark: the store, the raw baselines and the memory
#   probe share each size's data
def bench_scaling(
    tmp: Path, sizes: list[int], quick: bool, sweeps: int
) -> tuple[list[list[object]], list[dict[int, dict[str, float]]]]:
    """100 new states per call into an action already holding n points, for each n, in
    ``sweeps`` full sweeps over the sizes (each sweep starts from the same prefilled files).
    Per n and sweep: 3 rounds of ``calls`` calls, each round followed by the raw loops (the
    disk's fsync rate drifts on a shared machine). Returns the table (medians over sweeps;
    load time and memory from the first sweep) and the per-sweep medians."""
    calls = 10 if quick else 30
    pristine: dict[int, Path] = {}
    old: dict[int, Path] = {}
    wal: dict[int, tuple[float, float]] = {}
    for n in sizes:
        print(f"prefill {n:.0e}", file=sys.stderr, flush=True)
        path = tmp / f"pristine{n}.sqlite"
        with open_store(f"sqlite:///{path}") as s:
            _release(s)
        prefill(path, n)
        pristine[n] = path
        old[n] = tmp / f"pristine{n}-old.sqlite"
        old_schema_copy(path, old[n])
        # pages per commit at exactly n stored rows (the timed runs add 9,000 rows)
        w = tmp / "wal.sqlite"
        shutil.copy(path, w)
        w_new = wal_pages_per_commit(w, 100)
        _unlink_db(w)
        shutil.copy(old[n], w)
        w_old = wal_pages_per_commit(w, 100)
        _unlink_db(w)
        wal[n] = (w_new, w_old)
    runs: list[dict[int, dict[str, float]]] = []
    for sweep in range(sweeps):
        got: dict[int, dict[str, float]] = {}
        for n in sizes:
            print(f"sweep {sweep + 1}/{sweeps}: {n:.0e} stored points", file=sys.stderr, flush=True)
            path, raw_path, old_path = (tmp / f"run{n}{t}.sqlite" for t in ("", "-raw", "-old"))
            shutil.copy(pristine[n], path)
            shutil.copy(pristine[n], raw_path)
            shutil.copy(old[n], old_path)
            before = _rss()
            st, raw, rold = [], [], []
            with open_store(f"sqlite:///{path}", rng=4 + sweep) as s:
                t0 = time.perf_counter()
                s.get_or_sample(RID, 0, [0.5])  # first touch: loads the action into memory
                load = time.perf_counter() - t0
                mem = _rss() - before
                rng = np.random.default_rng([5, sweep])
                for k in range(3):
                    qs = [rng.uniform(size=100) for _ in range(calls)]
                    t0 = time.perf_counter()
                    for q in qs:
                        s.get_or_sample(RID, 0, q)
                    st.append(100 * calls / (time.perf_counter() - t0))
                    raw.append(raw_commits(raw_path, 0, 100, calls, 1, seed=10 * sweep + k))
                    rold.append(raw_commits(old_path, 0, 100, calls, 1, seed=10 * sweep + k))
            _unlink_db(path, raw_path, old_path)
            got[n] = {
                "load": load,
                "mem": mem,
                "store": statistics.median(st),
                "raw": statistics.median(raw),
                "old": statistics.median(rold),
                "memory_us": memory_us_per_state(pristine[n], calls, 3, sweep),
            }
        runs.append(got)
    rows: list[list[object]] = []
    for n in sizes:
        med = {
            k: statistics.median(r[n][k] for r in runs)
            for k in ("store", "raw", "old", "memory_us")
        }
        rows.append(
            [
                f"{n:.0e}",
                runs[0][n]["load"],
                med["store"],
                med["raw"],
                med["store"] / med["raw"],
                wal[n][0],
                med["old"],
                wal[n][1],
                1e6 / med["store"],
                med["memory_us"],
                runs[0][n]["mem"] / n * 1e6 / 2**20,
            ]
        )
    _unlink_db(*pristine.values(), *old.values())
    return rows, runs


def plot(scale: list[list[object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ns = [float(str(r[0])) for r in scale]
    ax.plot(ns, [r[2] for r in scale], "o-", label="store, 100 states per call")
    ax.plot(ns, [r[3] for r in scale], "s--", label="raw sqlite3, same schema (append log)")
    ax.plot(ns, [r[6] for r in scale], "^:", label="raw sqlite3, old unique x index")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="points already stored in the action",
        ylabel="new states / s",
        title="New-point cost against stored points (SQLite)",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def targets_line(conc: list[list[Any]], srv: list[list[Any]], raw1: float) -> str:
    """The targets of the group-commit section, each as measured in this run."""
    cell = {(r[0], r[1]): r for r in srv}
    new16, new1 = cell[("qveil --workers 16", 16)], cell[("qveil --workers 16", 1)]
    echo16 = cell[("echo (gRPC ceiling)", 16)]
    old1 = next((r for (name, c), r in cell.items() if "before" in name and c == 1), None)
    p50 = f"{new1[3] / old1[3]:.2f}x the baseline's" if old1 else "(no --baseline given)"
    return (
        f"Targets, this run: 16 callers, one new state per call: in process "
        f"**{conc[0][4]:.2f}x** raw one-state-per-commit (target >= 1.0); over gRPC "
        f"{new16[2] / raw1:.2f}x raw and {new16[2] / echo16[2]:.2f}x the bare echo server. "
        f"p50 at one caller over gRPC: {new1[3]:.3g} ms, {p50} (target <= 1.2x). Batches of "
        "1024 and the cost per new point against stored points are the next sections."
    )


def cost_targets_line(scale: list[list[Any]], runs: list[dict[int, dict[str, float]]]) -> str:
    """The flat-cost target, per sweep of this run."""
    lo, hi = int(float(scale[0][0])), int(float(scale[-1][0]))

    def falls(key: str) -> str:
        return ", ".join(f"{r[lo][key] / r[hi][key]:.2f}x" for r in runs)

    return (
        f"Targets, this run: from {scale[0][0]} to {scale[-1][0]} stored points "
        f"the store's rate falls **{falls('store')}** in the {len(runs)} sweeps (target <= 1.5x; "
        f"medians above: {scale[0][2] / scale[-1][2]:.2f}x); raw sqlite3 on the same schema "
        f"{falls('raw')}; raw sqlite3 with the old unique x index {falls('old')}. The "
        f"in-memory part of a new point goes from {scale[0][9]:.0f} to {scale[-1][9]:.0f} us "
        f"(the store's whole cost from {scale[0][8]:.0f} to {scale[-1][8]:.0f} us). Resident "
        f"memory of the in-process copy: ~{scale[-1][10]:.0f} MiB per 1e6 points."
    )


WHY = (
    "Reading the tables. Group commit: in process the 16 callers share a commit (~8 states "
    "x 2 actions each), so they beat one-state-per-commit by the states per commit. Over "
    "gRPC the servers are bounded here by the CPU that gRPC and protobuf take per call on 2 "
    "shared cores (compare the echo row) as much as by commits, and group commit does not "
    "make one-state calls faster than the old server in every run: the old per-action "
    "leaders overlapped one action's Python work with the other action's fsync, while one "
    "leader per store does draw, insert and fsync in series, and a leader that starts right "
    "after a commit takes only the callers already queued, so batches alternate small and "
    "large (~8 of 16 callers per commit). On a disk with fast fsync (4.5k raw commits/s) "
    "one-state calls cannot reach 1.0x raw through gRPC on this machine at all, since the "
    "bare echo server answers fewer calls than that."
)

WHY_BATCH = (
    "Reading the table. Since migration 0005 the ceiling, raw sqlite3 on the same schema, no "
    "longer pays the unique x index, so its 1000-row commits got several times faster "
    "(0.83x in the run at 4b3d44b, 0.34x at 6136d5d), and the store's batch path was bound "
    "by its Python work per new state (~25 us at 200k points: a sequential draw through a "
    "restored OUSamplePath, a Python bisection per state over the SortedDict copy, the "
    "SortedDict insert after the commit, a method call per chain link; "
    "`benchmarks/profile_batch.py`). Now the copy's sorted part is numpy "
    "(`server/store/pathindex.py`: a batch's neighbours in two searchsorted calls), the "
    "states alone in their gap between stored points (nearly all of a batch into 200k "
    "points) are drawn in one vectorised step from the exact bridge law and those sharing a "
    "gap in a loop (`qveil.noise.sample_batch`, the same sequential law), and the chain is "
    "hashed in one loop; what is left per state is mostly what raw sqlite3 pays too (the "
    "chain hash, building the row, executemany)."
)

WHY_COST = (
    "Reading the table. Until migration 0005 the store kept a unique (release, action, "
    "coordinate, x) index: a B-tree keyed by a random x, so a 100-row commit dirtied about "
    "min(100, leaf pages) of its leaves (the 'old unique x index' WAL column, on a copy whose "
    "index grew as a store's did, by rows in random state order; each page is written to the "
    "WAL and again at the checkpoint), and the store's rate fell 1.4x to 1.9x from 1e3 to 1e6 "
    "between runs (the section's run at commit 4b3d44b). Since 0005 the table is an append "
    "log: its only key is the primary key (release, action, coordinate, seq), appended at "
    "the right edge of the path's key range, ~8 pages per 100-row commit at any size. One "
    "value per state is decided where it always was, in the in-process copy under the "
    "path's write lock after catching up on every newer row; a writer that missed a row "
    "collides with it on the primary key and retries; a state stored twice (a bug or "
    "tampering) is refused when the path is loaded and reported by verify and `qveil audit` "
    "(docs/operations.md, 'One value per state'). What still grows with the store is the "
    "in-process copy ('of which in memory'): a dict x -> g of Python floats (the hits) and "
    "a sorted float64 index (`server/store/pathindex.py`, before the batch-path work a "
    "SortedDict); its look-ups are O(log n) but touch more cold memory at 1e6 points, and "
    "its small delta is merged into the main arrays in one O(n) pass every ~4 sqrt(n) "
    "points. The memory figure per 1e6 points also holds "
    "what the allocator kept from loading the rows (meaningful at 1e5 and above)."
)


# long-function: a benchmark run top to bottom: every measurement feeds the sections it writes
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls (smoke run)")
    ap.add_argument("--baseline", help="git revision to measure the server cells of, too")
    ap.add_argument("--max-n", type=float, default=1e6, help="largest stored-point count")
    ap.add_argument("--seconds", type=float, default=2.0, help="per server cell and round")
    ap.add_argument("--sweeps", type=int, default=3, help="sweeps of the cost-vs-size part")
    ap.add_argument(
        "--only",
        choices=("all", "groupcommit", "batch", "cost"),
        default="all",
        help="one part alone, rewriting only its section of the doc: 'groupcommit' (one new "
        "state per call), 'batch' (batches of 1024), 'cost' (cost against stored points)",
    )
    ap.add_argument("--no-write", action="store_true", help="print, do not write the doc")
    ap.add_argument("--no-pg", action="store_true", help="skip PostgreSQL")
    args = ap.parse_args()
    reps = 3
    per = 30 if args.quick else 80
    sizes = [n for n in (1000, 10_000, 100_000, 1_000_000) if n <= args.max_n]
    sections: list[tuple[str, str, str, str]] = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("QVEIL_BENCH_DIR")) as d:
        tmp = Path(d)
        only = "" if args.only == "all" else f" --only {args.only}"
        if args.only in ("all", "groupcommit"):
            cmd = (
                "python benchmarks/bench_newpoints.py"
                + only
                + (" --quick" if args.quick else "")
                + (f" --baseline {args.baseline}" if args.baseline else "")
            )
            body = _group_commit(args, tmp, reps, per)
            sections.append(("newpoints", "New points: group commit", cmd, body))
        if args.only in ("all", "batch"):
            cmd = "python benchmarks/bench_newpoints.py" + only + (" --quick" if args.quick else "")
            body = _batches(args, tmp, reps)
            sections.append(("newpoints-batch", "New points: batches of 1024", cmd, body))
        if args.only not in ("all", "cost"):
            for name, title, c, b in sections:
                if args.no_write:
                    print(b)
                else:
                    write_section(name, title, c, b)
            return 0
        print("cost against stored points", file=sys.stderr, flush=True)
        scale, runs = bench_scaling(tmp, sizes, args.quick, args.sweeps)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    cmd = (
        "python benchmarks/bench_newpoints.py"
        + ("" if args.only == "all" else " --only cost")
        + (" --quick" if args.quick else "")
        + (f" --max-n {args.max_n:.0e}" if args.max_n != 1e6 else "")
        + (f" --sweeps {args.sweeps}" if args.sweeps != 3 else "")
    )
    body = "\n\n".join(
        [
            f"Load average at the end: {load} (2 cores shared with other helpers' work; "
            "only ratios within this run mean anything).",
            "**Cost against stored points**: 100 new states per call (one action) into an "
            "action already holding n points, the store and raw sqlite3 (100 rows per commit "
            "with chained hashes, WAL + synchronous=FULL) on the same schema, a copy of the "
            "same table, side by side; and raw sqlite3 on a copy with the unique (release, "
            "action, coordinate, x) index the table had before migration 0005. Medians over "
            f"{len(runs)} sweeps 1e3 -> 1e6, each from the same prefilled files (each timed "
            "column adds 9,000 rows as it runs). 'WAL pages per commit' counts the pages one "
            "100-row commit appends to the WAL (autocheckpoint off while counting; every one "
            "is written again by the next checkpoint) at exactly n rows: the commit's I/O, "
            "independent of the disk's mood. 'of which in memory' is the same workload on "
            "the same rows in a memory store (no database): the in-process part of a new "
            "point (lock, neighbours, exact draw, chain hash, the sorted in-memory copy). "
            "'MiB per 1e6 points' is the growth of this process's resident memory when the "
            "action's first touch loads it into the in-process copy (first sweep):\n\n"
            + table(
                [
                    "stored points",
                    "first-touch load (s)",
                    "store states/s",
                    "raw states/s, same schema",
                    "store / raw",
                    "WAL pages per commit",
                    "raw states/s, old unique x index",
                    "old index WAL pages per commit",
                    "store us per new state",
                    "of which in memory (us)",
                    "MiB per 1e6 points",
                ],
                scale,
            )
            + "\n\n![new-point cost](img/bench_newpoints.png)",
            cost_targets_line(scale, runs),
            WHY_COST,
        ]
    )
    sections.append(("newpoints-cost", "New points: cost against stored points", cmd, body))
    for name, title, c, b in sections:
        if args.no_write:
            print(b)
        else:
            write_section(name, title, c, b)
    if not args.no_write:
        plot(scale, ROOT / "docs" / "img" / "bench_newpoints.png")
    return 0


def _group_commit(args: argparse.Namespace, tmp: Path, reps: int, per: int) -> str:
    """Sections 1 and 2: one new state per call (in process, PostgreSQL, over gRPC) and
    batches of 1024; returns the section's body."""
    conc: dict[str, list[dict[str, float]]] = {}
    raw1 = []
    for rep in range(reps):
        print(f"concurrency round {rep + 1}/{reps}", file=sys.stderr, flush=True)
        for key, threads, together in (
            ("16 callers, one transaction per query", 16, True),
            ("1 caller, one transaction per query", 1, True),
            ("1 caller, one transaction per action (before)", 1, False),
        ):
            url = f"sqlite:///{tmp / f'c{rep}-{threads}-{int(together)}.sqlite'}"
            n_per = per if threads > 1 else 4 * per
            conc.setdefault(key, []).append(store_threads(url, threads, n_per, together=together))
        rp = tmp / f"raw{rep}.sqlite"
        with open_store(f"sqlite:///{rp}") as s:
            _release(s)
        raw1.append(raw_commits(rp, 0, 1, 4 * per, 2, seed=rep))
    mraw1 = statistics.median(raw1)
    pg_rows = pg_cells(per, reps) if not args.no_pg else []
    conc_rows = []
    for key, rs in conc.items():
        sps = statistics.median(r["states_s"] for r in rs)
        conc_rows.append(
            [
                key,
                sps,
                statistics.median(r["p50_ms"] for r in rs),
                statistics.median(r["per_commit"] for r in rs),
                sps / mraw1,
            ]
        )
    conc_rows.append(["raw sqlite3, one state (2 rows) per commit", mraw1, "", 1.0, 1.0])
    conc_rows += pg_rows
    print("server cells", file=sys.stderr, flush=True)
    srv = server_cells(tmp, args.seconds / (2 if args.quick else 1), reps, args.baseline)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    g16 = conc_rows[0][4]
    return "\n\n".join(
        [
            f"Load average at the end: {load} (2 cores shared with other helpers' work; the "
            "disk's fsync rate drifts by 2-5x over minutes here, so only ratios within this "
            "run mean anything).",
            "**One new state per call, both actions of a 2-action release per call** "
            "(SQLite WAL + synchronous=FULL). In process: threads calling "
            "`get_or_sample_actions` (group commit: every caller's and every action's new "
            "points that arrive while a commit is in flight go into the next transaction), "
            f"medians of {reps} rounds; ceiling: raw sqlite3, one state (2 rows, chained "
            "hashes) per transaction, same schema:\n\n"
            + table(
                ["store, in process", "states/s", "p50 ms", "states per commit", "/ raw"],
                conc_rows,
            )
            + f"\n\nTarget: 16 callers >= 1.0x raw one-state-per-commit: "
            f"**{g16:.2f}x**.",
            "Over gRPC: `qveil serve` with 16 store threads (so 16 calls can wait in one group "
            "commit) or 4 (the default), grpc.aio closed loop with 16 or 1 call in flight, one new "
            "state per call, all actions; the bare echo server (no work at all) bounds what "
            "any server can answer one call at a time on these 2 cores:\n\n"
            + table(["server", "in flight", "states/s", "p50 ms", "p99 ms", "errors"], srv),
            targets_line(conc_rows, srv, mraw1),
            WHY,
        ]
    )


def _batches(args: argparse.Namespace, tmp: Path, reps: int) -> str:
    """Section 2: batches of 1024 new states into an action holding 200k points."""
    print("batches of 1024", file=sys.stderr, flush=True)
    batch = bench_batch(tmp, args.quick, reps)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    return "\n\n".join(
        [
            f"Load average at the end: {load} (2 cores shared with other helpers' work; the "
            "disk's fsync rate drifts over minutes here, so only ratios within this run mean "
            "anything).",
            "**Batches of 1024 new states** per call into an action already holding "
            f"{batch[0]:,} points (SQLite WAL + synchronous=FULL), against raw sqlite3 "
            "committing 1000 rows (chained hashes) per transaction into a copy of the same "
            f"table; medians of {reps} rounds, each round's store and raw loops back to back "
            "(target >= 0.5x):\n\n"
            + table(
                ["stored points", "store states/s", "raw rows/s", "store / raw"],
                [batch],
            ),
            f"Target, this run: batches of 1024: **{batch[3]:.2f}x** raw 1000-row "
            "commits (target >= 0.5).",
            WHY_BATCH,
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
