"""Alembic: the migrations produce exactly the models' schema (compare_metadata is empty),
on SQLite and PostgreSQL; a database at an older revision is refused with create=False."""

from __future__ import annotations

import importlib
from pathlib import Path

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
