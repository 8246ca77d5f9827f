"""``qveil serve --processes N``: N real server processes on one port and one store.

The first process binds the port with SO_REUSEPORT and starts the others once its release
is ready; they bind the same port once theirs is. Every connection lands on one process;
whichever process answers, a state has one value (the store serializes new points across
processes). SIGTERM stops them all; a process that dies stops the server (exit 1); a
memory store is refused (a private store per process would be a second noise draw).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from server_helpers import QVEIL, ServerProcess, make_bundle, start_server

from qveil.v1 import value_service_pb2 as pb
from qveil.v1 import value_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_REUSEPORT")


def _children(pid: int) -> list[int]:
    """Pids of the spawned server processes of ``pid`` (not multiprocessing's helpers)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and "spawn_main" in cmd and "resource_tracker" not in cmd:
            out.append(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_for(what: str, sp: ServerProcess, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while what not in sp.output():
        assert sp.proc.poll() is None, sp.output()
        assert time.monotonic() < deadline, sp.output()
        time.sleep(0.05)


def _ask(target: str, states: list[float]) -> list[float]:
    """GetValues over a connection of its own (a local subchannel pool)."""
    with grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        reply = pb_grpc.ValueServiceStub(ch).GetValues(
            pb.GetValuesRequest(states=states), timeout=60
        )
    return list(reply.values)


def _two_processes(tmp_path: Path) -> ServerProcess:
    """``qveil serve --processes 2`` on a SQLite store, once both processes serve."""
    bundle = make_bundle(tmp_path / "bundle")
    store = f"sqlite:///{tmp_path / 'store.sqlite'}"
    sp = start_server(tmp_path, bundle, "--processes", "2", store=store, timeout=120)
    try:
        _wait_for("2 processes serving on", sp)
    except BaseException:
        sp.terminate()
        raise
    return sp


def test_two_processes_share_the_port_and_every_state_has_one_value(tmp_path: Path) -> None:
    sp = _two_processes(tmp_path)
    try:
        kids = _children(sp.proc.pid)
        assert len(kids) == 1, (kids, sp.output())
        # 16 connections at once ask the same new states, then the same again: one value each
        states = np.random.default_rng(3).uniform(-1.0, 2.0, 6).tolist()
        with ThreadPoolExecutor(8) as pool:
            first = list(pool.map(lambda _: _ask(sp.target, states), range(16)))
            again = list(pool.map(lambda _: _ask(sp.target, states), range(16)))
        assert all(a == first[0] for a in first + again)
    finally:
        code = sp.terminate(timeout=60)
    assert code == 0, sp.output()
    assert not any(_alive(k) for k in kids), sp.output()
    assert "stopped" in sp.output()


def test_a_process_that_dies_stops_the_server(tmp_path: Path) -> None:
    sp = _two_processes(tmp_path)
    try:
        (kid,) = _children(sp.proc.pid)
        os.kill(kid, signal.SIGKILL)
        code = sp.proc.wait(timeout=60)
    finally:
        sp.terminate()
    assert code == 1, sp.output()
    assert "process 2 exited" in sp.output()


def test_processes_need_a_shared_store(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "bundle")
    for argv, message in (
        (["--store", "memory://", "--processes", "2"], "needs a shared store"),
        (["--processes", "0"], "--processes must be in 1..256"),
    ):
        r = subprocess.run(
            [QVEIL, "serve", "--bundle", str(bundle), "--listen", "127.0.0.1:0", *argv],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert r.returncode == 2, r.stderr
        assert message in r.stderr and "Traceback" not in r.stderr, r.stderr
