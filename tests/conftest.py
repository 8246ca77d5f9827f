"""Shared fixtures. PostgreSQL tests use the real server on 127.0.0.1:5432 (trust auth);
they skip with a reason when it is absent, except under CI=true, where they must run."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # tests/ is put on the import path when pytest starts (pytest_configure)
    from server_helpers import Served

PG_ADMIN_URL = os.environ.get("QVEIL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI", "").lower() == "true"


def _pg_connect(url: str):  # type: ignore[no-untyped-def]
    import psycopg

    return psycopg.connect(url, autocommit=True, connect_timeout=3)


def pytest_configure(config: pytest.Config) -> None:
    """The suite never touches the user's registry (~/.qveil): the session's fixtures use one
    of their own, and every test a fresh one (below)."""
    import tempfile

    os.environ["QVEIL_HOME"] = tempfile.mkdtemp(prefix="qveil-home-session-")
    os.environ.pop("QVEIL_REGISTRY", None)


@pytest.fixture(autouse=True)
def qveil_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh registry home per test (inherited by the servers and CLIs it starts)."""
    home = str(tmp_path_factory.mktemp("qveil-home"))
    monkeypatch.setenv("QVEIL_HOME", home)
    return home


@pytest.fixture(scope="session")
def pg_available() -> str:
    """The admin URL of the test PostgreSQL server, or skip (fail under CI=true)."""
    try:
        with _pg_connect(PG_ADMIN_URL) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - any failure means "absent"
        if IN_CI:
            pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} is required under CI=true: {exc}")
        pytest.skip(f"PostgreSQL at {PG_ADMIN_URL} is not reachable: {exc}")
    return PG_ADMIN_URL


@pytest.fixture
def pg_url(pg_available: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test (SQLAlchemy URL), dropped afterwards."""
    name = f"qveil_t_{uuid.uuid4().hex[:12]}"
    with _pg_connect(pg_available) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with _pg_connect(pg_available) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty SQL store URL, once per backend: a SQLite file in this test's tmp_path,
    and a fresh PostgreSQL database (:func:`pg_url`)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.sqlite'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store URL, once per backend: the in-memory store, then :func:`sql_url`'s
    two."""
    if request.param == "memory":
        return f"memory://{uuid.uuid4().hex}"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.sqlite'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture(scope="session")
def cartpole_release(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(bundle, train's stdout): the session's one d = 4 kernel fqi release of CartPole
    trained by the CLI (server_helpers.make_cartpole_kernel_bundle), recorded in a
    registry of its own. A template: never served or changed itself; a module or test
    serves or edits its own server_helpers.fresh_bundle copy."""
    from server_helpers import make_cartpole_kernel_bundle, registry_home

    d = tmp_path_factory.mktemp("cartpole-release")
    (d / "qveil-home").mkdir()
    with registry_home(d / "qveil-home"):
        return make_cartpole_kernel_bundle(d, seed=1)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One real server for the test module: a 3-action release on [-1, 2] served by
    LocalServer (grpc.aio on 127.0.0.1, port 0, over a SQLite store) with a tokens file (a
    query, an admin and an auditor token), its bundle charged in a registry of the module's
    own. Tests that share it only read, or put back what they change."""
    from server_helpers import Served, make_bundle, make_tokens, registry_home

    from qveil.server.local import LocalServer

    d = tmp_path_factory.mktemp("served")
    with registry_home(d / "qveil-home"):
        bundle = make_bundle(d / "bundle", seed=21)
        tokens = make_tokens(d / "tokens.toml")
        store = f"sqlite:///{d / 'store.sqlite'}"
        with LocalServer(bundle, store, tokens=tokens.path, max_batch=64) as s:
            yield Served(s, tokens, bundle)
