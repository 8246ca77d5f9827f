"""A port held by a running `qveil serve` is refused: a second server on the same gRPC port
(or the same v2 REST port) exits 2 with one line naming the port, and the first keeps
answering alone. Real subprocesses on loopback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
from reliability_helpers import free_port, health_status, serve_argv, sqlite_url, start_server
from server_helpers import make_bundle

from qveil.client import ValueClient


def _second(argv: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp)


def test_second_server_on_a_taken_grpc_port_exits_2(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "bundle", seed=5)
    first = start_server(tmp_path, bundle=bundle, store=sqlite_url(tmp_path / "a.sqlite"))
    try:
        with ValueClient(first.target) as c:
            before = np.asarray(c.values([0.0, 0.5, 1.0]))
        r = _second(
            serve_argv(bundle=bundle, store=sqlite_url(tmp_path / "b.sqlite"), port=first.port),
            tmp_path,
        )
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stderr.strip() == (
            f"qveil serve: port 127.0.0.1:{first.port} is already in use (another qveil "
            "serve?); choose another --listen port or stop the other server"
        ), r.stderr
        assert "Traceback" not in r.stderr and "listening" not in r.stderr
        assert not (tmp_path / "b.sqlite").exists()  # refused before the store was opened
        # the first server still answers, every call, with the same values
        assert first.alive() and health_status(first.target) == "SERVING"
        with ValueClient(first.target) as c:
            for _ in range(5):
                assert np.array_equal(np.asarray(c.values([0.0, 0.5, 1.0])), before)
    finally:
        first.stop()


def test_second_server_on_a_taken_rest_port_exits_2(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "bundle", seed=6)
    http = free_port()
    first = start_server(
        tmp_path,
        bundle=bundle,
        store=sqlite_url(tmp_path / "a.sqlite"),
        extra=["--http-port", str(http)],
    )
    try:
        argv = serve_argv(
            bundle=bundle,
            store=sqlite_url(tmp_path / "b.sqlite"),
            port=free_port(),
            extra=["--http-port", str(http)],
        )
        r = _second(argv, tmp_path)
        assert r.returncode == 2, r.stdout + r.stderr
        assert (
            f"qveil serve: port 127.0.0.1:{http} is already in use (another qveil serve?); "
            "choose another --http-port or stop the other server"
        ) in r.stderr.splitlines()
        assert "Traceback" not in r.stderr
        assert first.alive() and health_status(first.target) == "SERVING"
    finally:
        first.stop()
