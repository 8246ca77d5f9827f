"""Raw ceilings for the new-point benchmarks: sqlite3 and psycopg loops that commit what the
store commits (one row per state and action with its chained hash) into the store's own
schema, the WAL pages one such commit appends, and a copy of a table carrying the unique x
index the table had before migration 0005."""

from __future__ import annotations

import shutil
import sqlite3
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_store import _INSERT, RID, raw_connection  # noqa: E402

from qveil.server.store.integrity import ChainHasher  # noqa: E402


def raw_commits(
    path: Path, action: int, states_per_commit: int, commits: int, n_actions: int, seed: int = 0
) -> float:
    """Raw sqlite3: ``commits`` transactions of ``states_per_commit`` random states, one row per
    state and action with its chained hash (what the store writes). Returns states/s."""
    con = raw_connection(path)
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
    con = raw_connection(path)
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


def unlink_db(*paths: Path) -> None:
    """Remove SQLite files and their -wal and -shm companions, where they exist."""
    for p in paths:
        for suffix in ("", "-wal", "-shm"):
            Path(str(p) + suffix).unlink(missing_ok=True)
