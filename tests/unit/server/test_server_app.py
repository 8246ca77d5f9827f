"""The server factory and lifecycle (qveil.server.app), in-process: listen addresses and
the transport rules, the store's URL beside the bundle, permission warnings, create_server on
port 0 and on a taken port, and one whole ``serve`` run (bind, start, SERVING, answer, SIGTERM,
drain, exit 0) on this process's event loop (``qveil serve`` as a process:
tests/integration/test_server_e2e.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from server_helpers import make_bundle, served_values

from qveil.client import ValueClient
from qveil.errors import InvalidArgument, PortInUse
from qveil.server.app import (
    ServeConfig,
    _redact,
    check_transport,
    create_server,
    default_store_url,
    host_port,
    is_loopback,
    loose_permissions,
    port_in_use,
    resolve_store_url,
    serve,
    split_host,
)
from qveil.server.protocol.dataplane import DataPlane, new_executor
from qveil.server.serving.auth import Authorizer
from qveil.server.serving.health import Health
from qveil.server.serving.services import Services

SERVING = health_pb2.HealthCheckResponse.SERVING


def test_listen_addresses() -> None:
    assert split_host("127.0.0.1:50051") == ("127.0.0.1", "50051")
    assert split_host("[::1]:0") == ("::1", "0")
    assert split_host(":8080") == ("", "8080")
    for bad in ("localhost", "host:", "host:port", "1.2.3.4:-1"):
        with pytest.raises(InvalidArgument, match="must be HOST:PORT"):
            split_host(bad)
    assert host_port("::1", 5) == "[::1]:5" and host_port("10.0.0.1", "7") == "10.0.0.1:7"
    assert is_loopback("localhost:1") and is_loopback("127.0.0.2:1") and is_loopback("[::1]:1")
    assert not is_loopback("0.0.0.0:1") and not is_loopback("example.org:1")


def test_the_transport_rules(tmp_path: Path) -> None:
    b, tokens = tmp_path / "b", tmp_path / "tokens.toml"
    check_transport(ServeConfig(bundle=b, listen="127.0.0.1:0"))  # loopback: anything goes
    with pytest.raises(InvalidArgument, match="non-loopback '0.0.0.0:1' without TLS"):
        check_transport(ServeConfig(bundle=b, listen="0.0.0.0:1", tokens_file=tokens))
    with pytest.raises(InvalidArgument, match="without --tokens-file"):
        check_transport(ServeConfig(bundle=b, listen="0.0.0.0:1", insecure=True))
    check_transport(ServeConfig(bundle=b, listen="0.0.0.0:1", insecure=True, tokens_file=tokens))


def test_resolve_store_url_unit(tmp_path: Path) -> None:
    b = tmp_path / "runs" / "bundle"
    assert resolve_store_url("sqlite:///s.sqlite", b) == (
        f"sqlite:///{(tmp_path / 'runs' / 's.sqlite').resolve()}",
        True,
    )
    assert resolve_store_url("sqlite:///../x/s.sqlite?timeout=3", b)[0].endswith(
        f"{(tmp_path / 'x' / 's.sqlite').resolve()}?timeout=3"
    )
    for same in ("sqlite:////abs/s.sqlite", "sqlite:///:memory:", "memory:x", "postgresql://h/db"):
        assert resolve_store_url(same, b) == (same, False)
    assert default_store_url(b) == f"sqlite:///{(tmp_path / 'runs').resolve()}/qveil-store.sqlite"


def test_a_store_url_is_said_without_its_password() -> None:
    assert _redact("postgresql://u:secret@h/db") == "postgresql://u:***@h/db"
    assert _redact("postgresql://u@h/db") == "postgresql://u@h/db"
    assert _redact("sqlite:///x") == "sqlite:///x"


def test_loose_permissions_are_named_with_their_fix(tmp_path: Path) -> None:
    b = tmp_path / "b"
    b.mkdir(mode=0o700)
    for name in ("card.json", "weights.npz"):
        (b / name).write_text("x")
        (b / name).chmod(0o600)
    db = tmp_path / "s.sqlite"
    db.write_text("")
    db.chmod(0o600)
    url = f"sqlite:///{db}"
    assert loose_permissions(b, url) == []
    (b / "card.json").chmod(0o644)
    (b / "weights.npz").chmod(0o640)
    db.chmod(0o664)
    wb, ws = loose_permissions(b, url)
    assert f"{b / 'card.json'} is mode 0644" in wb and "(and 1 more in the bundle)" in wb
    assert wb.endswith(f"chmod -R go-rwx {b}")
    assert f"store file {db} is mode 0664" in ws and ws.endswith(f"chmod -R go-rwx {db}")
    assert loose_permissions(tmp_path / "none", "postgresql://h/db") == []


def test_create_server_binds_port_0_and_refuses_a_taken_port() -> None:
    async def main() -> None:
        executor = new_executor(1)
        plane = DataPlane(Services.create(store=None), Authorizer(None), executor)
        health = Health()
        server, port = create_server(plane, health, listen="127.0.0.1:0")
        try:
            assert port > 0 and port_in_use("127.0.0.1", port)
            with pytest.raises(PortInUse, match=f"port 127.0.0.1:{port} is already in use"):
                create_server(plane, health, listen=f"127.0.0.1:{port}")
            with pytest.raises(InvalidArgument, match="cannot bind '203.0.113.9:0'"):
                create_server(plane, health, listen="203.0.113.9:0")
        finally:
            await server.stop(0)
            executor.shutdown()

    asyncio.run(main())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert not port_in_use("127.0.0.1", free)


def test_serve_runs_a_release_until_sigterm(tmp_path: Path) -> None:
    """The whole life of ``qveil serve`` on this thread's event loop: SIGTERM is sent to this
    process only once serve() has installed its handler (health is SERVING by then)."""
    bundle = make_bundle(tmp_path / "b", seed=3)
    store = tmp_path / "s.sqlite"
    events: list[str] = []
    config = ServeConfig(
        bundle=bundle,
        store_url=f"sqlite:///{store}",
        listen="127.0.0.1:0",
        port_file=tmp_path / "port",
        grace=5.0,
        workers=2,
    )
    xs = np.array([0.25, -1.0])

    def client(port: int) -> np.ndarray:
        target = f"127.0.0.1:{port}"
        with grpc.insecure_channel(target) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            deadline = time.monotonic() + 30
            while stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status != SERVING:
                assert time.monotonic() < deadline, events
                time.sleep(0.01)
        with ValueClient(target) as c:
            return c.get_values(xs).values

    async def main() -> int:
        task = asyncio.ensure_future(serve(config, on_event=events.append))
        while not config.port_file.exists():  # type: ignore[union-attr]
            assert not task.done(), events
            await asyncio.sleep(0.005)
        port = int(config.port_file.read_text())  # type: ignore[union-attr]
        with ThreadPoolExecutor(1) as pool:
            got = await asyncio.get_running_loop().run_in_executor(pool, client, port)
        assert got.tobytes() == served_values(bundle, xs).tobytes()
        os.kill(os.getpid(), signal.SIGTERM)
        return await asyncio.wait_for(task, 30)

    assert asyncio.run(main()) == 0
    text = "\n".join(events)
    assert "listening on 127.0.0.1:" in text and "no tokens: anonymous query only" in text
    assert f"store sqlite:///{store}" in text and "serving release" in text
    assert "draining: health NOT_SERVING" in text and events[-1] == "stopped"
    assert store.is_file()
