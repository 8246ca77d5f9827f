"""Transport: TLS rejects a plaintext client, mutual TLS rejects a client without a
certificate, the loopback/TLS/tokens rules of `qveil serve`, and a SIGTERM drain (health
NOT_SERVING first, calls keep succeeding, the process exits 0)."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from server_helpers import (
    QVEIL,
    InProcessServer,
    fresh_bundle,
    health_status,
    make_bundle,
    make_certs,
    start_server,
    wait_health,
)

from qveil.client import RetryPolicy, TLSConfig, UnavailableError, ValueClient


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A template bundle, never served: each test serves a copy charged in its registry."""
    return make_bundle(tmp_path_factory.mktemp("b") / "bundle", seed=21)


@pytest.fixture
def bundle(template: Path, tmp_path: Path) -> Path:
    return fresh_bundle(template, tmp_path / "bundle")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return make_certs(tmp_path_factory.mktemp("certs"))


NO_RETRY = RetryPolicy(attempts=1)


def test_tls_rejects_plaintext_client(bundle: Path, certs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from qveil.server.app import TLSFiles, create_server

    with InProcessServer(None, f"sqlite:///{tmp_path / 's.sqlite'}") as s:

        async def tls_server():  # type: ignore[no-untyped-def]
            creds = TLSFiles(cert=certs.server_cert, key=certs.server_key).credentials()
            srv, port = create_server(s.plane, s.health, listen="127.0.0.1:0", credentials=creds)
            await srv.start()
            return srv, port

        srv, port = s.run(tls_server())
        s.ready(bundle)
        target = f"127.0.0.1:{port}"
        try:
            with ValueClient(target, tls=TLSConfig(ca=certs.ca), timeout=10) as c:
                assert c.values([0.5]).shape == (1, 3)
            with (
                ValueClient(target, timeout=3, retry=NO_RETRY) as plain,
                pytest.raises(UnavailableError),
            ):
                plain.values([0.5])
            # a TLS client that does not trust the server's CA fails too
            with (
                ValueClient(
                    target, tls=TLSConfig(ca=certs.client_cert), timeout=3, retry=NO_RETRY
                ) as wrong_ca,
                pytest.raises(UnavailableError),
            ):
                wrong_ca.values([0.5])
        finally:
            s.run(srv.stop(0))


def test_mtls_rejects_client_without_certificate(bundle: Path, certs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tls = certs.mtls_flags()
    hc = certs.client_credentials()
    sp = start_server(
        tmp_path, bundle, *tls, store=f"sqlite:///{tmp_path / 's.sqlite'}", health_creds=hc
    )
    try:
        good = TLSConfig(ca=certs.ca, cert=certs.client_cert, key=certs.client_key)
        with ValueClient(sp.target, tls=good, timeout=10) as c:
            assert c.values([0.5]).shape == (1, 3)
        for bad in (TLSConfig(ca=certs.ca), None):
            with (
                ValueClient(sp.target, tls=bad, timeout=3, retry=NO_RETRY) as c,
                pytest.raises(UnavailableError),
            ):
                c.values([0.5])
    finally:
        assert sp.terminate() == 0


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--listen", "0.0.0.0:0"], "without TLS"),
        (["--listen", "0.0.0.0:0", "--insecure"], "without --tokens-file"),
    ],
)
def test_refuses_non_loopback_without_tls_or_tokens(
    bundle: Path, tmp_path: Path, extra: list[str], needle: str
) -> None:
    r = subprocess.run(
        [QVEIL, "serve", "--bundle", str(bundle), *extra],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert not list(tmp_path.glob("*.sqlite"))  # refused before opening any store


def test_sigterm_drains(bundle: Path, tmp_path: Path) -> None:
    """SIGTERM: health turns NOT_SERVING at once while calls still succeed for
    --drain-delay seconds; then calls in flight finish and the process exits 0. A client
    never sees an error other than UNAVAILABLE (after the server stopped listening)."""
    sp = start_server(
        tmp_path,
        bundle,
        "--drain-delay",
        "1.5",
        "--grace",
        "5",
        # this client floods states on purpose (calls surely in flight at SIGTERM): lift the
        # per-host state budget, which would answer RESOURCE_EXHAUSTED
        "--state-rate",
        "1e9",
        store=f"sqlite:///{tmp_path / 's.sqlite'}",
    )
    results: list[str] = []
    reasons: list[str] = []  # SERVER_CANCELLED: reset by grpc-core before a handler took it
    stop = threading.Event()

    def load() -> None:
        with ValueClient(sp.target, timeout=10, retry=NO_RETRY) as c:
            rng = np.random.default_rng(0)
            while not stop.is_set():
                try:
                    c.values(rng.uniform(-1, 2, size=64))
                    results.append("OK")
                except UnavailableError as exc:
                    results.append("UNAVAILABLE")
                    reasons.append(exc.reason)
                except Exception as exc:  # noqa: BLE001
                    results.append(repr(exc))

    th = threading.Thread(target=load)
    th.start()
    time.sleep(0.5)
    n_before = len(results)
    sp.proc.send_signal(signal.SIGTERM)
    seen = wait_health(sp.target, "NOT_SERVING", timeout=1.0)
    assert seen[-1] == "NOT_SERVING"
    time.sleep(0.5)
    assert "OK" in results[n_before:]  # still answering during the drain delay
    assert sp.proc.wait(20) == 0, sp.output()
    stop.set()
    th.join(20)
    assert set(results) <= {"OK", "UNAVAILABLE"}, set(results)
    print(
        f"drain: {results.count('OK')} OK, {len(reasons)} UNAVAILABLE, of them "
        f"{reasons.count('SERVER_CANCELLED')} reset by the server's transport"
    )
    assert "draining" in sp.output() and "stopped" in sp.output()
    with pytest.raises(grpc.RpcError):
        health_status(sp.target)


def test_sigterm_ends_health_watch_streams(bundle: Path, tmp_path: Path) -> None:
    """An open health Watch is an RPC in flight: before the fix it held `server.stop(grace)`
    for the whole grace period (60 s here) and was then cancelled. Now the drain sends it
    NOT_SERVING and ends the stream with status OK, and the process exits long before the
    grace period is over (the wait below gives up at 30 s, half of it)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    sp = start_server(tmp_path, bundle, "--grace", "60", store=f"sqlite:///{tmp_path / 's.sqlite'}")
    seen: list[str] = []
    ended: list[str] = []

    def watch() -> None:
        with grpc.insecure_channel(sp.target) as ch:
            stream = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest())
            try:
                for msg in stream:
                    seen.append(health_pb2.HealthCheckResponse.ServingStatus.Name(msg.status))
                ended.append("OK")
            except grpc.RpcError as exc:
                ended.append(exc.code().name)

    th = threading.Thread(target=watch)
    th.start()
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == ["SERVING"]
    sp.proc.send_signal(signal.SIGTERM)
    assert sp.proc.wait(30) == 0, sp.output()
    th.join(10)
    assert seen == ["SERVING", "NOT_SERVING"] and ended == ["OK"], (seen, ended)
