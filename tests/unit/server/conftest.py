"""Fixtures of the server's unit tests: one real in-process server per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from server_helpers import Served, make_bundle, make_tokens

from qveil.server.serving.local import LocalServer


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server for the module (its bundle charged in the session's registry): tests that
    share it only read, or change what they put back."""
    d = tmp_path_factory.mktemp("served")
    bundle = make_bundle(d / "bundles" / "b1", seed=21)
    tokens = make_tokens(d / "tokens.toml")
    with LocalServer(bundle, f"sqlite:///{d / 's.sqlite'}", tokens=tokens.path, max_batch=64) as s:
        yield Served(s, tokens, bundle)
