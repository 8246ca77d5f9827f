"""The store's tables (qveil.server.store.models) created on a real SQLite file: the columns
and keys the store relies on, the constraints the database itself enforces (a status outside
RELEASE_STATUSES, no actions, a point of an unknown release, a second row at a taken seq),
doubles that round-trip bit for bit, and the naming convention the migrations use
(migrations against these models: test_server_store_migrate.py)."""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from qveil.server.store import models as M


@pytest.fixture
def engine(tmp_path: Path) -> sa.Engine:
    eng = sa.create_engine(f"sqlite:///{tmp_path / 'm.sqlite'}")

    @sa.event.listens_for(eng, "connect")
    def _fk(dbapi_conn, _rec) -> None:  # type: ignore[no-untyped-def]
        dbapi_conn.execute("PRAGMA foreign_keys = ON")

    M.metadata.create_all(eng, tables=[M.releases, M.noise_points, M.store_meta])
    return eng


def _release(**over: object) -> dict[str, object]:
    row: dict[str, object] = {
        "release_id": "r",
        "fingerprint": "f",
        "sigma": 1.0,
        "beta": 2.0,
        "interval_lo": -1.0,
        "interval_hi": 2.0,
        "n_actions": 2,
        "status": "staged",
        "created_at": datetime(2026, 1, 1, tzinfo=UTC),
    }
    return row | over


def _point(seq: int, **over: object) -> dict[str, object]:
    row: dict[str, object] = {
        "release_id": "r",
        "action": 0,
        "seq": seq,
        "x": 0.5,
        "g": 0.1,
        "created_at": 0.0,
        "hash": "h" * 64,
    }
    return row | over


def test_the_tables_and_their_keys() -> None:
    assert [c.name for c in M.noise_points.primary_key] == [
        "release_id",
        "action",
        "coordinate",
        "seq",
    ]
    assert [c.name for c in M.releases.primary_key] == ["release_id"]
    assert M.noise_points.dialect_options["sqlite"]["with_rowid"] is False
    assert not M.noise_points.indexes  # an append log: no index on x
    assert M.RELEASE_STATUSES == ("staged", "active", "retired")
    assert M.STORE_ID_KEY == "store_id"
    names = {c.name for c in M.releases.constraints if c.name}
    assert {"pk_releases", "ck_releases_status", "ck_releases_n_actions"} <= names


def test_defaults_and_exact_doubles(engine: sa.Engine) -> None:
    tricky = [0.1 + 0.2, 5e-324, -2.5e-310, 1.7976931348623157e308]
    with engine.begin() as c:
        c.execute(M.releases.insert().values(**_release()))
        for i, v in enumerate(tricky, start=1):
            c.execute(M.noise_points.insert().values(**_point(i, x=v, g=-v)))
    with engine.connect() as c:
        rel = c.execute(sa.select(M.releases)).one()
        assert rel.dims == 1 and rel.betas is None
        rows = c.execute(sa.select(M.noise_points).order_by(M.noise_points.c.seq)).all()
    assert [r.coordinate for r in rows] == [0] * 4
    assert [struct.pack("<d", r.x) for r in rows] == [struct.pack("<d", v) for v in tricky]


@pytest.mark.parametrize(
    ("table", "row"),
    [
        ("releases", _release(status="deleted")),
        ("releases", _release(n_actions=0)),
        ("releases", _release(sigma=None)),
        ("noise_points", _point(1, release_id="unknown")),
        ("noise_points", _point(1)),  # the seq taken below
    ],
)
def test_the_database_refuses_bad_rows(
    engine: sa.Engine, table: str, row: dict[str, object]
) -> None:
    with engine.begin() as c:
        c.execute(M.releases.insert().values(**_release()))
        c.execute(M.noise_points.insert().values(**_point(1, x=0.9)))
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as c:
        c.execute(getattr(M, table).insert().values(**row))
    with engine.connect() as c:
        assert c.execute(sa.select(sa.func.count()).select_from(M.releases)).scalar() == 1
        assert c.execute(sa.select(sa.func.count()).select_from(M.noise_points)).scalar() == 1
