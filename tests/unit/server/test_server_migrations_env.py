"""The Alembic environment of the store (qveil.server.migrations.env), run by Alembic in this
process as the ``alembic`` command line runs it: ``-x url=...`` migrates that database to head
(every table of the models and the admin records), no database or offline (SQL script) mode
is refused with its reason (the programmatic path, an open connection:
test_server_store_migrate.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

from qveil.server.store import models
from qveil.server.store.migrate import alembic_config, current_revision, head_revision


def _config(*x: str):  # type: ignore[no-untyped-def]
    cfg = alembic_config()
    cfg.cmd_opts = argparse.Namespace(x=list(x))
    return cfg


def test_a_url_is_migrated_to_head(tmp_path: Path) -> None:
    f = tmp_path / "s.sqlite"
    command.upgrade(_config(f"url=sqlite:///{f}"), "head")
    command.upgrade(_config(f"url=sqlite:///{f}"), "head")  # at head: nothing to do
    eng = sa.create_engine(f"sqlite:///{f}")
    try:
        assert current_revision(eng) == head_revision()
        tables = set(sa.inspect(eng).get_table_names())
        assert set(models.metadata.tables) <= tables  # the store's and the admin records'
        assert {"releases", "noise_points", "ledger_events", "admin_audit_log"} <= tables
    finally:
        eng.dispose()


def test_no_database_is_refused() -> None:
    with pytest.raises(RuntimeError, match="no database: pass -x url=URL"):
        command.upgrade(_config(), "head")


def test_offline_sql_scripts_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="offline .* migrations are not supported"):
        command.upgrade(_config(f"url=sqlite:///{tmp_path / 's.sqlite'}"), "head", sql=True)
    assert not (tmp_path / "s.sqlite").exists()
