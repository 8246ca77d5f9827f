"""Fixtures of the server's unit tests: a registry per test module, a store made by `qveil
admin init-store`, a tiny training config."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from config_helpers import tiny_linewalk_config
from server_helpers import (
    ModuleRegistry,
    charge,
    make_uncharged_bundle,
)

from qveil.cli import main
from qveil.server.governance.registry import open_registry
from qveil.server.serving import logs


@pytest.fixture(scope="module")
def module_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleRegistry]:
    """A registry of the test module's own, with a bundle charged in it."""
    d = tmp_path_factory.mktemp("module-registry")
    bundle = make_uncharged_bundle(d / "bundle", seed=7)
    charge(bundle, home=d / "home")
    with open_registry(f"sqlite:///{d / 'home' / 'registry.sqlite'}") as reg:
        yield ModuleRegistry(d / "home", reg, bundle)


@pytest.fixture
def tiny_config(tmp_path: Path) -> Path:
    """A tiny LineWalk training config (config_helpers.tiny_linewalk_config)."""
    return tiny_linewalk_config(tmp_path)


@pytest.fixture
def admin_store(tmp_path: Path) -> str:
    """The URL of a new SQLite store in its own directory ``srv``, made the way an operator
    makes one (``qveil admin init-store``)."""
    (tmp_path / "srv").mkdir()
    url = f"sqlite:///{tmp_path / 'srv' / 'qveil-store.sqlite'}"
    assert main(["admin", "init-store", "--store", url]) == 0  # admin creates stores only here
    return url


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """The log configuration of this process put back after the test (qveil.server.serving.logs
    .configure, which `qveil serve` runs, replaces the root handler and levels)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    access = (logs.ACCESS.level, logs.ACCESS.disabled)
    alembic = logging.getLogger("alembic").level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)
    logs.ACCESS.setLevel(access[0])
    logs.ACCESS.disabled = access[1]
    logging.getLogger("alembic").setLevel(alembic)
