"""Alembic: the migrations produce exactly the models' schema (compare_metadata is empty),
on SQLite and PostgreSQL, at head "0007"; every upgrade keeps the logged rows bit for bit;
a database at an older revision is refused with create=False."""

from __future__ import annotations

import importlib
import multiprocessing
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from store_helpers import RID, keyed_paths, log_values, make_release

from qveil.errors import FailedPrecondition
from qveil.server.store import open_store
from qveil.server.store.migrate import LOCK_SUFFIX, head_revision
from qveil.server.store.models import metadata

# other parts declare their tables on the store's MetaData (same Alembic history)
for _mod in ("qveil.server.governance.admin_tables",):
    try:
        importlib.import_module(_mod)
    except ImportError:
        pass


def _diff(url: str) -> list[object]:
    eng = sa.create_engine(url)
    try:
        with eng.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            return list(compare_metadata(ctx, metadata))
    finally:
        eng.dispose()


def test_migrations_match_models(sql_url: str) -> None:
    url = sql_url
    assert head_revision() == "0007"
    with open_store(url) as s:
        assert s.schema_revision == head_revision()  # type: ignore[attr-defined]
    assert _diff(url) == []
    with open_store(url, create=False) as s:  # already at head: opens without migrating
        assert s.releases.list_releases() == []


def test_old_revision_refused_without_create(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    url = f"sqlite:///{path}"
    open_store(url).close()
    eng = sa.create_engine(url)
    with eng.begin() as c:
        c.exec_driver_sql("UPDATE alembic_version SET version_num = '0001'")
    eng.dispose()
    if head_revision() != "0001":
        with pytest.raises(FailedPrecondition, match="revision"):
            open_store(url, create=False)


def _upgrade_to(url: str, rev: str) -> None:
    from alembic import command

    from qveil.server.store.migrate import alembic_config

    eng = sa.create_engine(url)
    try:
        cfg = alembic_config()
        with eng.connect() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, rev)
            conn.commit()
    finally:
        eng.dispose()


def test_0004_upgrades_a_one_dimensional_store_bit_for_bit(sql_url: str, tmp_path: Path) -> None:
    """Migration 0004 (the coordinate key) on a store at 0003 holding a 1-D
    release: every row keeps its seq, x, g and chain hash (coordinate 0), the release gets
    dims 1, the chains verify, logged states are not logged again and new ones are;
    compare_metadata is empty afterwards."""
    src_url = f"sqlite:///{tmp_path / 'src.sqlite'}"
    url = sql_url
    with open_store(src_url) as src:  # the rows a 0003 store would hold (same chain)
        kp = keyed_paths(
            src.releases.create_release(
                release_id="r1",
                fingerprint="f" * 64,
                sigma=1.5,
                beta=3.0,
                interval=(-1, 2),
                n_actions=2,
            )
        )
        for a in range(2):
            log_values(src, kp, "r1", [a], [np.linspace(0, 1, 17) ** (a + 1)])
        want = {a: [(p.seq, p.x, p.g, p.hash) for p in src.iter_points("r1", a)] for a in range(2)}
        rec = src.releases.get_release("r1")
    _upgrade_to(url, "0003")
    eng = sa.create_engine(url)
    with eng.begin() as c:
        c.execute(
            sa.text(
                "INSERT INTO releases (release_id, fingerprint, sigma, beta, interval_lo, "
                "interval_hi, n_actions, status, created_at) VALUES ('r1', :f, 1.5, 3.0, -1, 2, "
                "2, 'staged', :t)"
            ),
            {"f": "f" * 64, "t": rec.created_at},
        )
        for a, rows in want.items():
            for seq, x, g, h in rows:
                c.execute(
                    sa.text(
                        "INSERT INTO noise_points (release_id, action, seq, x, g, created_at, "
                        "hash) VALUES ('r1', :a, :s, :x, :g, 0.0, :h)"
                    ),
                    {"a": a, "s": seq, "x": x, "g": g, "h": h},
                )
    eng.dispose()
    with open_store(url) as st:  # migrates 0003 -> head
        assert st.schema_revision == head_revision()  # type: ignore[attr-defined]
        r = st.releases.get_release("r1")
        assert (r.dims, r.betas, r.n_paths, r.beta) == (1, (), 2, 3.0)
        for a in range(2):
            assert [(p.seq, p.x, p.g, p.hash) for p in st.iter_points("r1", a)] == want[a]
            xs = [x for _s, x, _g, _h in want[a]]
            gs = [g for _s, _x, g, _h in want[a]]
            assert st.record_paths("r1", [a], [xs], [gs]) == (0, 0)
        assert st.verify("r1").ok
        assert log_values(st, kp, "r1", [0], [[0.123]])[2:] == (1, 0)
        assert st.count_points("r1") == 35 and st.verify("r1").ok
    assert _diff(url) == []
    eng = sa.create_engine(url)
    with eng.connect() as c:
        assert set(c.exec_driver_sql("SELECT DISTINCT coordinate FROM noise_points").scalars()) == {
            0
        }
    eng.dispose()


def _dump(url: str) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """Every release row and every noise row (primary-key order), as stored."""
    from qveil.server.store.models import noise_points, releases

    eng = sa.create_engine(url)
    try:
        with eng.connect() as c:
            rels = [
                (*r[:-1], _utc(r.created_at))
                for r in c.execute(sa.select(releases).order_by("release_id"))
            ]
            pts = c.execute(
                sa.select(noise_points).order_by("release_id", "action", "coordinate", "seq")
            )
            return rels, [tuple(r) for r in pts]
    finally:
        eng.dispose()


def _utc(t: datetime) -> float:
    """A release's created_at as unix seconds (SQLite returns it naive, in UTC)."""
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def _unique_constraints(url: str) -> list[list[str]]:
    eng = sa.create_engine(url)
    try:
        return [u["column_names"] for u in sa.inspect(eng).get_unique_constraints("noise_points")]
    finally:
        eng.dispose()


def test_0005_append_log_keeps_every_row_bit_for_bit(sql_url: str, tmp_path: Path) -> None:
    """Migration 0005 (noise_points becomes an append log) on a store at 0004 holding
    a 1-D release and a d = 3 release: the unique (release, action, coordinate, x) is gone,
    every row keeps its seq, x, g, created_at and chain hash, the stored states are answered
    as stored, new ones are drawn, compare_metadata is empty. The downgrade restores the
    constraint with the same rows, and is refused, changing nothing, when a state is stored
    twice."""
    from qveil.server.store.models import noise_points, releases

    src_url = f"sqlite:///{tmp_path / 'src.sqlite'}"
    url = sql_url
    xs = np.random.default_rng(1).uniform(size=15)
    with open_store(src_url) as src:
        k1 = keyed_paths(
            make_release(src, "r1", sigma=1.5, beta=3.0, interval=(-1, 2), n_actions=2)
        )
        k3 = keyed_paths(
            make_release(
                src, "r3", sigma=0.5, beta=2.0, interval=(0, 1), n_actions=2, betas=[2.0, 5.0, 9.0]
            )
        )
        for a in range(2):
            log_values(src, k1, "r1", [a], [xs ** (a + 1)])
        log_values(src, k3, "r3", list(range(6)), [xs[: 5 + p] for p in range(6)])
    rels, pts = _dump(src_url)
    assert len(pts) == 30 + sum(5 + p for p in range(6))
    _upgrade_to(url, "0004")
    assert _unique_constraints(url) == [["release_id", "action", "coordinate", "x"]]
    eng = sa.create_engine(url)
    with eng.begin() as c:
        c.execute(sa.insert(releases), [dict(r._mapping) for r in _rows(src_url, releases)])
        c.execute(sa.insert(noise_points), [dict(r._mapping) for r in _rows(src_url, noise_points)])
    eng.dispose()
    assert _dump(url) == (rels, pts)
    with open_store(url) as st:  # migrates 0004 -> head
        assert st.schema_revision == head_revision() == "0007"  # type: ignore[attr-defined]
        assert _dump(url) == (rels, pts)
        assert st.verify("r1").ok and st.verify("r3").ok
        for rid, n in (("r1", 2), ("r3", 6)):  # logged states are not logged again
            for p in range(n):
                rows = [(q.x, q.g) for q in st.iter_points(rid, p)]
                got = st.record_paths(rid, [p], [[x for x, _g in rows]], [[g for _x, g in rows]])
                assert got == (0, 0)
        assert log_values(st, k1, "r1", [0], [[0.123]])[2:] == (1, 0)
        assert log_values(st, k3, "r3", [4], [[0.321]])[2:] == (1, 0)
        assert st.verify("r1").ok and st.verify("r3").ok
        assert st.count_points() == len(pts) + 2
        rels2, pts2 = _dump(url)
    assert _unique_constraints(url) == []
    assert _diff(url) == []
    # downgrade: the constraint comes back over the same rows
    _downgrade_to(url, "0004")
    assert _unique_constraints(url) == [["release_id", "action", "coordinate", "x"]]
    assert _dump(url) == (rels2, pts2)
    _upgrade_to(url, "head")
    assert _dump(url) == (rels2, pts2) and _unique_constraints(url) == []
    # a state stored twice (behind the store's back): the downgrade fails and changes nothing
    eng = sa.create_engine(url)
    with eng.begin() as c:
        c.exec_driver_sql(
            "INSERT INTO noise_points (release_id, action, coordinate, seq, x, g, created_at, "
            f"hash) VALUES ('r1', 1, 0, 16, {pts2[16][4]!r}, 0.0, 0.0, '{'0' * 64}')"
        )
    eng.dispose()
    before = _dump(url)
    with pytest.raises(sa.exc.IntegrityError):
        _downgrade_to(url, "0004")
    assert _dump(url) == before and _unique_constraints(url) == []
    with open_store(url, create=True) as st:  # back to head (the later steps were undone)
        assert st.schema_revision == "0007"  # type: ignore[attr-defined]


def _rows(url: str, table: sa.Table) -> list[sa.Row[object]]:
    eng = sa.create_engine(url)
    try:
        with eng.connect() as c:
            return list(c.execute(sa.select(table)))
    finally:
        eng.dispose()


def _downgrade_to(url: str, rev: str) -> None:
    """``alembic downgrade`` as from the command line: env.py makes its own engine (on SQLite
    with transactional DDL, so a failed rebuild rolls back whole)."""
    from alembic import command

    from qveil.server.store.migrate import alembic_config

    cfg = alembic_config()
    cfg.set_main_option("sqlalchemy.url", url)
    command.downgrade(cfg, rev)


def test_a_failed_0005_rebuild_leaves_the_store_at_0004(tmp_path: Path) -> None:
    """The SQLite rebuild runs in the opener's one migration transaction: a row the new table
    refuses (here a noise row of a release that does not exist, written with foreign keys
    off) makes the upgrade fail and leaves the 0004 table, its constraint and its rows as
    they were."""
    import sqlite3

    from qveil.errors import IntegrityError

    path = tmp_path / "s.sqlite"
    url = f"sqlite:///{path}"
    _upgrade_to(url, "0004")
    con = sqlite3.connect(path)
    con.execute("INSERT INTO noise_points VALUES ('ghost', 0, 0, 1, 0.5, 0.1, 0.0, 'ab')")
    con.commit()
    con.close()
    before = _dump(url)
    with pytest.raises(IntegrityError, match="FOREIGN KEY"):
        open_store(url)
    assert _dump(url) == before
    assert _unique_constraints(url) == [["release_id", "action", "coordinate", "x"]]
    con = sqlite3.connect(path)
    assert con.execute("SELECT version_num FROM alembic_version").fetchall() == [("0004",)]
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    con.close()
    assert "noise_points_old" not in tables


_GONE = ("release_bindings", "registry_releases", "registry_heads", "registry_exports")


def _tables(url: str) -> set[str]:
    eng = sa.create_engine(url)
    try:
        return set(sa.inspect(eng).get_table_names())
    finally:
        eng.dispose()


def _meta_keys(url: str) -> set[str]:
    eng = sa.create_engine(url)
    try:
        with eng.connect() as c:
            return set(c.exec_driver_sql("SELECT key FROM store_meta").scalars())
    finally:
        eng.dispose()


def test_0007_drops_bindings_and_lineage_and_keeps_the_log(sql_url: str, tmp_path: Path) -> None:
    """Migration 0007 (keyed releases) on a store at 0006 holding a release, its binding,
    registry lineage, a witnessed head, an export token and the incarnation keys: those
    tables and keys are gone, every release and noise row is kept bit for bit, the chains
    verify, logged states are not logged again, compare_metadata is empty. The downgrade
    recreates the tables empty over the same rows."""
    from qveil.server.store.models import noise_points, releases

    src_url = f"sqlite:///{tmp_path / 'src.sqlite'}"
    url = sql_url
    with open_store(src_url) as src:
        kp = keyed_paths(make_release(src, n_actions=2))
        log_values(src, kp, RID, [0, 1], [np.linspace(0, 1, 13)] * 2)
    rels, pts = _dump(src_url)
    _upgrade_to(url, "0006")
    eng = sa.create_engine(url)
    with eng.begin() as c:
        c.execute(sa.insert(releases), [dict(r._mapping) for r in _rows(src_url, releases)])
        c.execute(sa.insert(noise_points), [dict(r._mapping) for r in _rows(src_url, noise_points)])
        t = "2026-01-01T00:00:00+00:00"
        c.execute(
            sa.text("INSERT INTO release_bindings VALUES (:r, 'f', :t, 'origin')"),
            {"r": RID, "t": t},
        )
        c.execute(
            sa.text(
                "INSERT INTO registry_releases VALUES (:r, 'f', 'sid', 'inc', 'active', 'u', :t)"
            ),
            {"r": RID, "t": t},
        )
        c.execute(
            sa.text("INSERT INTO registry_heads VALUES (:r, 0, 13, :h)"), {"r": RID, "h": "0" * 64}
        )
        c.execute(
            sa.text("INSERT INTO registry_exports VALUES ('tok', :r, 'sid', :t, NULL, NULL)"),
            {"r": RID, "t": t},
        )
        c.execute(
            sa.text(
                "INSERT INTO store_meta VALUES ('incarnation', 'i1'), ('physical_identity', 'p1')"
            )
        )
    eng.dispose()
    assert set(_GONE) <= _tables(url)
    with open_store(url) as st:  # migrates 0006 -> 0007
        assert st.schema_revision == "0007"  # type: ignore[attr-defined]
        assert _dump(url) == (rels, pts)
        assert st.verify(RID).ok
        for p in range(2):
            rows = [(q.x, q.g) for q in st.iter_points(RID, p)]
            got = st.record_paths(RID, [p], [[x for x, _g in rows]], [[g for _x, g in rows]])
            assert got == (0, 0)
    assert not set(_GONE) & _tables(url)
    assert not {"incarnation", "physical_identity"} & _meta_keys(url)
    assert "store_id" in _meta_keys(url)
    assert _diff(url) == []
    _downgrade_to(url, "0006")
    assert set(_GONE) <= _tables(url) and _dump(url) == (rels, pts)
    eng = sa.create_engine(url)
    with eng.connect() as c:
        assert all(c.exec_driver_sql(f"SELECT COUNT(*) FROM {n}").scalar() == 0 for n in _GONE)
    eng.dispose()
    with open_store(url) as st:
        assert st.schema_revision == "0007"  # type: ignore[attr-defined]
    assert not set(_GONE) & _tables(url) and _diff(url) == []


def _first_open(url: str, barrier: Any, out: Any) -> None:
    """One of several processes opening the same new SQLite store at once."""
    try:
        barrier.wait(timeout=60)
        open_store(url, create=True).close()
        out.put("ok")
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        out.put(f"{type(e).__name__}: {e}")


def test_concurrent_first_openers_of_a_new_sqlite_store_all_open_it(tmp_path: Path) -> None:
    """Three processes that open (and so migrate) one new SQLite file at the same instant all
    succeed, and the schema is the models'. Without the migration lock one of them fails in
    about one round in ten on this machine ("table ... already exists": two processes saw
    no schema and both migrated)."""
    ctx = multiprocessing.get_context("fork")
    for rnd in range(16):
        url = f"sqlite:///{tmp_path}/new{rnd}.sqlite"
        barrier, out = ctx.Barrier(3), ctx.Queue()
        procs = [ctx.Process(target=_first_open, args=(url, barrier, out)) for _ in range(3)]
        for p in procs:
            p.start()
        results = [out.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        assert results == ["ok"] * 3, (rnd, results)
        assert _diff(url) == []


_COUNT = "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute({q!r}).fetchone()[0])"


def _count_elsewhere(db: Path) -> int:
    """The store's rows as another process sees them; its connection closes on exit, the way
    any other reader's does (the last connection to close checkpoints and deletes the WAL)."""
    code = _COUNT.format(q="SELECT COUNT(*) FROM noise_points")
    out = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def test_every_commit_stays_visible_to_other_processes_after_the_store_opened(
    tmp_path: Path,
) -> None:
    """Opening (and so migrating) a SQLite store must not drop the POSIX locks SQLite's pooled
    connections hold on the file: with them gone, another process's reader that closes takes
    the file for unused, checkpoints it and deletes the WAL, and every later commit of this
    process goes into the deleted WAL (answered, never visible, lost on restart). Each
    commit is counted by another process right after it; the migration lock that closed a
    descriptor of the database file itself failed at the second commit."""
    db = tmp_path / "store.sqlite"
    with open_store(f"sqlite:///{db}", create=True) as s:
        make_release(s)
        kp = keyed_paths(s.releases.get_release(RID))
        for k in range(1, 6):
            log_values(s, kp, RID, [0], [np.random.default_rng(k).uniform(size=10)])
            assert _count_elsewhere(db) == 10 * k
    with open_store(f"sqlite:///{db}") as s:
        assert s.count_points(RID, 0) == 50 and s.verify(RID).ok
    assert (db.parent / (db.name + LOCK_SUFFIX)).stat().st_mode & 0o077 == 0
