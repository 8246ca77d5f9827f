"""Several real `qveil serve` processes of one release.

``qveil serve --processes N``: N server processes on one port and one store. The first
process binds the port with SO_REUSEPORT and starts the others once its release is ready;
they bind the same port once theirs is. Every connection lands on one process; whichever
process answers, a state has one value (the release's key decides). SIGTERM stops them all;
a process that dies stops the server (exit 1); a memory store is refused (each process would
keep its own answer log, and the log is for audit).

Copies (issue 34): a ``cp -a`` copy of bundle, store and registry, a byte copy of the SQLite
store, a replica of another registry that trusts the first's key, two servers on one
PostgreSQL store and a ``CREATE DATABASE ... TEMPLATE`` clone of one, each served beside the
original at the same time: every state gets the same bits from either.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from cli_helpers import qveil_main
from server_helpers import QVEIL, InProcessServer, ServerProcess, make_bundle, start_server

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


# ----------------------------------------------------------------------------- copies
# A release's answers are a pure function of its bundle (weights and its one noise key) and
# the state: any copy of the bundle, of its store (the answer log) and of its registry answers
# every state with the same bits as the original, whether the state was asked of it before,
# of the other copy before, or of neither. Each test runs the copies side by side (both
# servers at once) and compares the float64 bytes of every answer.

RNG = np.random.default_rng(2026)
#: asked of the first server first, of the second first, and of neither before the comparison
ASK_FIRST, ASK_SECOND, ASK_NEITHER = (RNG.uniform(-1.0, 2.0, 50) for _ in range(3))


def _values(target: str, states: np.ndarray) -> bytes:
    from qveil.client import ValueClient

    with ValueClient(target) as c:
        return bytes(np.ascontiguousarray(c.values(states), dtype=np.float64).tobytes())


def _same_bits(first: str, second: str, bundle: Path) -> None:
    """Ask ``first`` and ``second`` (both serving ``bundle``'s release or a copy of it) for
    the three state sets in a crossed order; every answer is the same bits on both, and the
    bits of ``qveil.answer.released_values`` from the bundle's key."""
    from server_helpers import served_values

    a_first = _values(first, ASK_FIRST)
    b_second = _values(second, ASK_SECOND)
    assert _values(second, ASK_FIRST) == a_first  # never asked of the second before
    assert _values(first, ASK_SECOND) == b_second  # never asked of the first before
    both = [_values(t, ASK_NEITHER) for t in (second, first)]
    assert both[0] == both[1]
    for states, got in ((ASK_FIRST, a_first), (ASK_SECOND, b_second), (ASK_NEITHER, both[0])):
        assert got == served_values(bundle, states).tobytes()


def _serve_both(
    bundle: Path, first: Callable[[], ServerProcess], second: Callable[[], ServerProcess]
) -> None:
    """Start two servers at once (``first()`` then ``second()``), check :func:`_same_bits`
    between them, and stop both cleanly."""
    a = first()
    try:
        b = second()
        try:
            _same_bits(a.target, b.target, bundle)
        finally:
            assert b.terminate() == 0, b.output()
    finally:
        assert a.terminate() == 0, a.output()


def _audit(url: str, bundle: Path) -> None:
    """``qveil audit --bundle`` (its entry point in this process): every logged value of the
    release recomputed from its key."""
    import json

    r = qveil_main("audit", "--store", url, "--bundle", str(bundle), "--json", "--no-record")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    (rel,) = json.loads(r.stdout)["releases"]
    assert rel["key_checked"] and rel["integrity_ok"], rel


def test_a_cp_a_copy_of_bundle_store_and_registry_answers_identically(
    tmp_path: Path, qveil_home: str
) -> None:
    """The original (bundle, SQLite store, registry = QVEIL_HOME) serves and logs; then
    ``cp -a`` copies all three and the copy is served beside the original, both at once: the
    same bits for every state, including states only the other was asked. Both logs pass the
    audit with the key afterwards."""
    orig = tmp_path / "orig"
    bundle = make_bundle(orig / "bundle", seed=31)
    store = orig / "data" / "store.sqlite"
    store.parent.mkdir()
    url = f"sqlite:///{store}"
    with InProcessServer(bundle, url) as srv:
        _values(srv.target, ASK_FIRST[:10])  # the original's log is not empty when copied
    copy = tmp_path / "copy"
    copy.mkdir()
    for src, dst in ((bundle, "bundle"), (store.parent, "data"), (Path(qveil_home), "home")):
        subprocess.run(["cp", "-a", str(src), str(copy / dst)], check=True)
    copy_url = f"sqlite:///{copy / 'data' / 'store.sqlite'}"
    _serve_both(
        bundle,
        lambda: start_server(orig, bundle, store=url, name="orig"),
        lambda: start_server(
            copy, copy / "bundle", store=copy_url, home=copy / "home", name="copy"
        ),
    )
    _audit(url, bundle)
    _audit(copy_url, copy / "bundle")


def test_a_byte_copy_of_the_sqlite_store_serves_beside_the_original(tmp_path: Path) -> None:
    """One bundle, two stores: the original SQLite file and a byte copy of it (made after
    the original had logged answers), served by two servers at once: the same bits."""
    import shutil

    bundle = make_bundle(tmp_path / "bundle", seed=32)
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with InProcessServer(bundle, url) as srv:  # the original logs answers before the copy
        _values(srv.target, ASK_FIRST[:10])
    for f in tmp_path.glob("store.sqlite*"):
        shutil.copyfile(f, tmp_path / f.name.replace("store", "copy", 1))
    copy_url = f"sqlite:///{tmp_path / 'copy.sqlite'}"
    _serve_both(
        bundle,
        lambda: start_server(tmp_path, bundle, store=url, name="orig"),
        lambda: start_server(tmp_path, bundle, store=copy_url, name="copy"),
    )
    _audit(url, bundle)
    _audit(copy_url, bundle)


def test_export_while_serving_then_import_and_serve_beside_it(tmp_path: Path) -> None:
    """`qveil admin export-release` of the log while its server keeps serving, then
    `init-store` and `import-release` into a second store, served by a second server beside
    the first (which went on answering all along): the same bits for every state, and both
    logs pass the audit with the key."""
    from qveil.bundle import load_bundle

    bundle = make_bundle(tmp_path / "bundle", seed=36)
    rid = load_bundle(bundle).bundle_id
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    other = f"sqlite:///{tmp_path / 'other.sqlite'}"
    a = start_server(tmp_path, bundle, store=url, name="orig")
    try:
        first = _values(a.target, ASK_FIRST[:10])
        for argv in (
            ("admin", "export-release", rid, "--out", str(tmp_path / "log.jsonl"), "--store", url),
            ("admin", "init-store", "--store", other),
            ("admin", "import-release", str(tmp_path / "log.jsonl"), "--store", other),
        ):
            r = qveil_main(*argv, cwd=tmp_path)
            assert r.returncode == 0, (argv, r.stderr)
        assert _values(a.target, ASK_FIRST[:10]) == first  # the original serves on
        b = start_server(tmp_path, bundle, store=other, name="imported")
        try:
            _same_bits(a.target, b.target, bundle)
        finally:
            assert b.terminate() == 0, b.output()
    finally:
        assert a.terminate() == 0, a.output()
    _audit(url, bundle)
    _audit(other, bundle)


def test_replicas_with_different_registries_answer_identically(tmp_path: Path) -> None:
    """A replica whose registry is another (its own QVEIL_HOME, a new signing key) refuses
    the release's receipt until told to trust the first registry's key (``qveil budget
    registry-key`` of the first, ``--trust-registry-key``); then both replicas, each with its
    own store, answer the same bits."""
    from server_helpers import QVEIL, registry_key

    bundle = make_bundle(tmp_path / "bundle", seed=33)
    other_home = tmp_path / "other-home"
    other_home.mkdir()
    key = registry_key()
    assert registry_key(other_home) != key
    refused = subprocess.run(
        [QVEIL, "serve", "--bundle", str(bundle), "--listen", "127.0.0.1:0"]
        + ["--store", f"sqlite:///{tmp_path / 'refused.sqlite'}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "QVEIL_HOME": str(other_home)},
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "trust" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    _serve_both(
        bundle,
        lambda: start_server(
            tmp_path, bundle, store=f"sqlite:///{tmp_path / 'a.sqlite'}", name="a"
        ),
        lambda: start_server(
            tmp_path,
            bundle,
            "--trust-registry-key",
            key,
            store=f"sqlite:///{tmp_path / 'b.sqlite'}",
            home=other_home,
            name="b",
        ),
    )


# ----------------------------------------------------------------------------- PostgreSQL
def _pg_db(url: str) -> str:
    return url.rsplit("/", 1)[1]


@pytest.mark.postgres
def test_two_servers_share_one_postgres_store(tmp_path: Path, pg_url: str) -> None:
    """Two `qveil serve` processes log into one PostgreSQL store at once: the same bits for
    every state, whichever was asked first; afterwards the log holds each answered state
    once per action and passes the audit with the key."""
    from qveil.bundle import load_bundle
    from qveil.server.store import open_store

    bundle = make_bundle(tmp_path / "bundle", seed=34)
    _serve_both(
        bundle,
        lambda: start_server(tmp_path, bundle, store=pg_url, name="a"),
        lambda: start_server(tmp_path, bundle, store=pg_url, name="b"),
    )
    rid = load_bundle(bundle).bundle_id
    with open_store(pg_url, create=False) as st:
        assert st.count_points(rid) == 150 * 3
    _audit(pg_url, bundle)


@pytest.mark.postgres
def test_a_template_clone_of_a_postgres_store_serves_beside_the_original(
    tmp_path: Path, pg_url: str, pg_available: str
) -> None:
    """``CREATE DATABASE clone TEMPLATE <store>``: a byte-level copy of a PostgreSQL store
    (made after the original had logged answers) served beside the original, both at once:
    the same bits; both logs pass the audit with the key."""
    import uuid

    import psycopg

    bundle = make_bundle(tmp_path / "bundle", seed=35)
    with InProcessServer(bundle, pg_url) as srv:  # the original logs answers before the clone
        _values(srv.target, ASK_FIRST[:10])
    clone = f"qveil_clone_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_available, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{clone}" TEMPLATE "{_pg_db(pg_url)}"')
    clone_url = pg_url.rsplit("/", 1)[0] + "/" + clone
    try:
        _serve_both(
            bundle,
            lambda: start_server(tmp_path, bundle, store=pg_url, name="orig"),
            lambda: start_server(tmp_path, bundle, store=clone_url, name="clone"),
        )
        _audit(pg_url, bundle)
        _audit(clone_url, bundle)
    finally:
        with psycopg.connect(pg_available, autocommit=True, connect_timeout=5) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (clone,),
            )
            conn.execute(f'DROP DATABASE IF EXISTS "{clone}"')
