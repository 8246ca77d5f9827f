"""Alembic, run programmatically: bring a database to the models' schema, or check it is."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

import qveil.server.migrations as _migrations
from qveil.errors import FailedPrecondition

__all__ = ["LOCK_SUFFIX", "alembic_config", "current_revision", "head_revision", "upgrade"]


# the migration lock file beside a SQLite database (see _file_lock)
LOCK_SUFFIX = "-migrations.lock"


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(_migrations.__file__).resolve().parent))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: sa.Engine) -> str | None:
    with engine.connect() as conn:
        rev = MigrationContext.configure(conn).get_current_revision()
        conn.rollback()
        return rev


def upgrade(
    engine: sa.Engine,
    *,
    create: bool,
    read_engine: sa.Engine | None = None,
    new_ok: bool = True,
    where: str = "",
    lock_path: str | None = None,
) -> str:
    """Migrate to head (``create``) or check the schema is at head; returns the revision.
    ``new_ok=False`` refuses a database that is not a qveil store yet (no revision): only
    ``qveil admin init-store`` and a first serve create stores.

    Concurrent openers are serialised: on PostgreSQL by an advisory lock taken in env.py; on
    SQLite by an exclusive flock(2) on the lock file beside the database file ``lock_path``
    (:func:`_file_lock`), held from before the version is read until the migrations commit
    (Alembic reads the version and runs SQLite migrations outside one transaction, so
    without it two first openers of a new file both migrate it and one fails with "table
    ... already exists").
    """
    with _file_lock(lock_path + LOCK_SUFFIX) if lock_path else nullcontext():
        return _upgrade(engine, create=create, read_engine=read_engine, new_ok=new_ok, where=where)


@contextmanager
def _file_lock(path: str) -> Iterator[None]:
    """An exclusive flock(2) on the lock file ``path`` (created owner-only if missing),
    released when the block ends.

    Never the database file itself: closing any descriptor of a file drops every POSIX lock
    the process holds on it (fcntl semantics), including the SHARED lock SQLite's pooled
    connections keep on a WAL database. Another process closing its last connection could
    then take that file as unused, checkpoint it and delete the WAL while this process
    still commits into the deleted file: committed points lost. Where the lock file cannot
    be created (a read-only directory, where nothing can be migrated either) the block runs
    without it."""
    try:
        fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        fd = None
    if fd is None:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _upgrade(
    engine: sa.Engine,
    *,
    create: bool,
    read_engine: sa.Engine | None,
    new_ok: bool,
    where: str,
) -> str:
    head = head_revision()
    cur = current_revision(read_engine or engine)
    if cur == head:
        return head
    if cur is None and not new_ok:
        raise FailedPrecondition(
            f"{where or 'the database'} is not a qveil store yet (an empty database; "
            "nothing was created)"
        )
    if not create:
        raise FailedPrecondition(
            f"store schema is at revision {cur!r} but this code needs {head!r}; open it with "
            "create=True (or run the migrations) first"
        )
    cfg = alembic_config()
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
        conn.commit()
    return head
