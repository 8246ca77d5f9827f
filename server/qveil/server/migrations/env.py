"""Alembic environment of the sample-path store. Run programmatically by
:func:`qveil.server.store.migrate.upgrade` (which passes an open connection in
``config.attributes["connection"]``); ``alembic`` on the command line also works with
``-x url=...``."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from qveil.server.governance import admin_tables
from qveil.server.store.models import metadata

# the admin records are declared on the store's MetaData (one Alembic history): importing
# their module completes `metadata` before Alembic reads it
assert admin_tables.metadata is metadata

config = context.config

#: pg_advisory_xact_lock key that serialises concurrent migrations on PostgreSQL
MIGRATION_LOCK_KEY = 0x71_76_65_69_6C_4D_49_47  # "qveilMIG"


def _run(connection: sa.Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.execute(
                sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY}
            )
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise RuntimeError("no database: pass -x url=URL or set sqlalchemy.url")
    engine = sa.create_engine(url)
    if engine.dialect.name == "sqlite":
        # the driver's own transaction handling runs DDL outside any transaction, so a
        # migration that rebuilds a table (0004, 0005) and then fails would stay half done;
        # with it off and an explicit BEGIN IMMEDIATE, each migration is one transaction
        engine.dispose()
        engine = sa.create_engine(url, connect_args={"isolation_level": None})

        @sa.event.listens_for(engine, "begin")
        def _begin(conn: sa.Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    with engine.connect() as conn:
        _run(conn)
        conn.commit()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported; pass -x url=...")
run_migrations_online()
