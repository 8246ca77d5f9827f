"""The real server the SDK's unit tests call: a 3-action release on [-1, 2] served by
LocalServer (the grpc.aio server on 127.0.0.1, port 0, over a SQLite store) with a tokens file
(a query, an admin and an auditor token), once per module, in a registry of the module's
own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from server_helpers import Served, make_bundle, make_tokens, registry_home

from qveil.server.local import LocalServer


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    d = tmp_path_factory.mktemp("client")
    with registry_home(d / "qveil-home"):
        bundle = make_bundle(d / "bundle", seed=3)
        tokens = make_tokens(d / "tokens")
        with LocalServer(bundle, f"sqlite:///{d / 'store.sqlite'}", tokens=tokens.path) as srv:
            yield Served(srv.target, bundle, tokens)
