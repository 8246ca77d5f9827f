"""The admin tables as migrations create them: exactly the tables that
qveil.server.governance.admin_tables declares on the store's MetaData."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.sqlite'}"


def test_migrations_create_exactly_the_admin_tables(store_url: str) -> None:
    """Migration 0002 yields the tables declared in qveil.server.governance.admin_tables (on the
    store's MetaData): Alembic's compare_metadata finds no difference."""
    import sqlalchemy as sa
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from qveil.server.store import open_store
    from qveil.server.store.models import metadata

    open_store(store_url).close()
    engine = sa.create_engine(store_url)
    try:
        with engine.connect() as conn:
            mc = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(mc, metadata) == []
            assert {"ledger_events", "ledger_caps", "admin_audit_log", "release_bundles"} <= set(
                sa.inspect(conn).get_table_names()
            )
    finally:
        engine.dispose()
