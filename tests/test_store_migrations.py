"""Alembic: the migrations produce exactly the models' schema (compare_metadata is empty),
on SQLite and PostgreSQL; a database at an older revision is refused with create=False."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from qveil.errors import FailedPrecondition
from qveil.server.store import open_store
from qveil.server.store.migrate import head_revision
from qveil.server.store.models import metadata

# other parts declare their tables on the store's MetaData (same Alembic history)
for _mod in ("qveil.server.admin_tables",):
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


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_migrations_match_models(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = (
        f"sqlite:///{tmp_path / 's.sqlite'}"
        if kind == "sqlite"
        else str(request.getfixturevalue("pg_url"))
    )
    with open_store(url) as s:
        assert s.schema_revision == head_revision()  # type: ignore[attr-defined]
    assert _diff(url) == []
    with open_store(url, create=False) as s:  # already at head: opens without migrating
        assert s.list_releases() == []


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


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_0004_upgrades_a_one_dimensional_store_bit_for_bit(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Migration 0004 (issue 16: the coordinate key) on a store at 0003 holding a 1-D
    release: every row keeps its seq, x, g and chain hash (coordinate 0), the release gets
    dims 1, the chains verify, stored states are answered as stored and new ones are drawn;
    compare_metadata is empty afterwards."""
    src_url = f"sqlite:///{tmp_path / 'src.sqlite'}"
    url = (
        f"sqlite:///{tmp_path / 'old.sqlite'}"
        if kind == "sqlite"
        else str(request.getfixturevalue("pg_url"))
    )
    with open_store(src_url, rng=7) as src:  # the rows a 0003 store would hold (same chain)
        src.create_release(
            release_id="r1",
            fingerprint="f" * 64,
            sigma=1.5,
            beta=3.0,
            interval=(-1, 2),
            n_actions=2,
        )
        for a in range(2):
            src.get_or_sample("r1", a, np.linspace(0, 1, 17) ** (a + 1))
        want = {a: [(p.seq, p.x, p.g, p.hash) for p in src.iter_points("r1", a)] for a in range(2)}
        rec = src.get_release("r1")
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
        r = st.get_release("r1")
        assert (r.dims, r.betas, r.n_paths, r.beta) == (1, (), 2, 3.0)
        for a in range(2):
            assert [(p.seq, p.x, p.g, p.hash) for p in st.iter_points("r1", a)] == want[a]
            xs = [x for _s, x, _g, _h in want[a]]
            assert st.get_or_sample("r1", a, xs).tolist() == [g for _s, _x, g, _h in want[a]]
        assert st.verify("r1").ok
        st.get_or_sample("r1", 0, [0.123])
        assert st.count_points("r1") == 35 and st.verify("r1").ok
    assert _diff(url) == []
    eng = sa.create_engine(url)
    with eng.connect() as c:
        assert set(c.exec_driver_sql("SELECT DISTINCT coordinate FROM noise_points").scalars()) == {
            0
        }
    eng.dispose()
