"""Faults of the store under a running server, seen by gRPC clients.

Clients stream GetValues with new states while the store's filesystem fills up, while the
PostgreSQL database turns read-only, and while PostgreSQL connections are cut (and, in the full
form with QVEIL_PG_RESTART=1, while the machine's PostgreSQL cluster restarts). The store is
only the answer log, written off the answer path, so the promises are:

* the answers go on: every call is answered (no error at all), each with the release's values
  (computed here from the bundle's key, bit for bit), the same when asked again;
* the fault reaches the log, which keeps what it could not write and retries (the server's
  log says so);
* the log recovers by itself, with no restart of the server: it writes again once the fault is
  gone, and after a graceful stop it holds every answered state once, intact (hash chains)
  and recomputable from the key (`qveil audit --bundle`).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import grpc
import numpy as np
import pytest
from reliability_helpers import (
    FULL,
    AnswerBook,
    assert_answers_are_the_keys,
    audit_with_key,
    fill_filesystem,
    get_values,
    query_workers,
    recheck,
    release_info,
    report,
    scale,
    sqlite_url,
    start_server,
    tmpfs_mount,
    umount,
    unlogged_answers,
)

from qveil.bundle import load_bundle
from qveil.server.store import open_store

pytestmark = pytest.mark.slow

#: what the server logs when the answer log cannot write (qveil.server.serving.answer_log)
LOG_RETRY = "answer log: could not write to the store; retrying"


class Traffic:
    """Two streaming clients with new states and one asking only known states."""

    def __init__(self, target: str, low: float, high: float) -> None:
        self.book = AnswerBook()
        self.known_book = AnswerBook()
        self.unexpected: list[str] = []
        self.stop = threading.Event()
        self.target, self.low, self.high = target, low, high
        self.known = np.linspace(low, high, 50).tolist()
        self.threads = query_workers(
            self.book, [target], self.stop, clients=2, seed=40, low=low, high=high,
            n_new=16, n_known=4, pause=0.01, expected=frozenset(), unexpected=self.unexpected,
        )  # fmt: skip
        self.threads.append(threading.Thread(target=self._known_client, daemon=True))

    def _known_client(self) -> None:
        from qveil.v1 import value_service_pb2_grpc as vgrpc

        with grpc.insecure_channel(self.target) as ch:
            stub = vgrpc.ValueServiceStub(ch)
            while not self.stop.is_set():
                try:
                    r = get_values(stub, self.known, timeout=10)
                    self.known_book.add(r.release_id, self.known, list(r.actions), list(r.values))
                except grpc.RpcError as exc:
                    self.known_book.error(exc.code().name)
                time.sleep(0.02)

    def start(self) -> Traffic:
        with grpc.insecure_channel(self.target) as ch:
            from qveil.v1 import value_service_pb2_grpc as vgrpc

            r = get_values(vgrpc.ValueServiceStub(ch), self.known)
            self.known_book.add(r.release_id, self.known, list(r.actions), list(r.values))
        for t in self.threads:
            t.start()
        return self

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)

    def ok_calls(self) -> int:
        return self.book.codes.get("OK", 0)

    def wait_ok_growth(self, n: int = 5, *, within: float = 30.0) -> None:
        """Wait until ``n`` more calls are answered (the answers go on)."""
        t0 = time.monotonic()
        start = self.ok_calls()
        while self.ok_calls() < start + n:
            assert time.monotonic() - t0 < within, f"answers stopped: {self.book.codes}"
            time.sleep(0.05)


def _logged(store_url: str, rid: str) -> int:
    store = open_store(store_url, create=False)
    try:
        return int(store.count_points(rid))
    finally:
        store.close()


def _wait_log_growth(store_url: str, rid: str, *, within: float = 30.0) -> float:
    """Seconds until the store's log of ``rid`` grows (the log writes again by itself)."""
    t0 = time.monotonic()
    start = _logged(store_url, rid)
    while _logged(store_url, rid) <= start:
        assert time.monotonic() - t0 < within, f"the log did not recover within {within} s"
        time.sleep(0.1)
    return time.monotonic() - t0


def _wait_in_log(srv: object, text: str, *, within: float = 30.0) -> None:
    t0 = time.monotonic()
    while text not in srv.log_path.read_text(errors="replace"):  # type: ignore[attr-defined]
        assert time.monotonic() - t0 < within, srv.log_tail()  # type: ignore[attr-defined]
        time.sleep(0.05)


def _check_after(traffic: Traffic, srv: object, store_url: str, bundle: Path) -> dict[str, object]:
    """No error at all; answers unchanged when asked again and the key's; after the server's
    graceful stop (``srv`` is stopped here) every answered state is in the log and the log
    passes the audit with the key."""
    target = srv.target  # type: ignore[attr-defined]
    assert not traffic.unexpected, f"calls failed: {traffic.unexpected[:5]}"
    assert set(traffic.book.codes) == {"OK"}, traffic.book.codes
    assert set(traffic.known_book.codes) == {"OK"}, traffic.known_book.codes
    assert not traffic.book.conflicts and not traffic.known_book.conflicts
    n, mism = recheck(traffic.book, target)
    assert not mism, f"answers changed: {mism[:5]}"
    assert_answers_are_the_keys(traffic.book, bundle)
    assert_answers_are_the_keys(traffic.known_book, bundle)
    assert srv.terminate() == 0, srv.log_tail()  # type: ignore[attr-defined]
    for book in (traffic.book, traffic.known_book):
        missing = unlogged_answers(book, store_url, bundle)
        assert not missing, f"{len(missing)} answered states are not in the log: {missing[:5]}"
    return {"answers_rechecked": n, **audit_with_key(store_url, bundle)}


def test_server_store_filesystem_full(tmp_path: Path, bundle: Path) -> None:
    mnt = tmp_path / "fs"
    if not tmpfs_mount(mnt, size="8m"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    srv = None
    rid = load_bundle(bundle).bundle_id
    try:
        store_url = sqlite_url(mnt / "store.sqlite")
        srv = start_server(tmp_path, bundle=bundle, store=store_url)
        rel = release_info(srv.target)
        traffic = Traffic(srv.target, rel.state_low, rel.state_high).start()
        time.sleep(0.5)
        ballast = fill_filesystem(mnt)
        _wait_in_log(srv, LOG_RETRY)  # the log cannot write
        traffic.wait_ok_growth()  # ... and the answers go on
        ballast.unlink()
        recovery_s = _wait_log_growth(store_url, rid)
        time.sleep(0.5)
        traffic.finish()
        numbers = _check_after(traffic, srv, store_url, bundle)
    finally:
        if srv is not None:
            srv.stop()
        umount(mnt)
    _report_recovered("server_fault_disk_full", traffic, recovery_s, numbers)


def _report_recovered(
    name: str, traffic: Traffic, recovery_s: float, numbers: dict[str, object]
) -> None:
    """The results line of a fault the server's log recovered from, every call answered."""
    report(
        name,
        calls=dict(traffic.book.codes),
        known_state_calls_ok=traffic.known_book.codes.get("OK", 0),
        recovery_s=round(recovery_s, 2),
        **numbers,
        unexpected_errors={},
    )


def _admin(url: str):  # type: ignore[no-untyped-def]
    import psycopg

    return psycopg.connect(url, autocommit=True, connect_timeout=5)


def _terminate(admin_url: str, db: str) -> int:
    with _admin(admin_url) as conn:
        return len(
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (db,),
            ).fetchall()
        )


@pytest.mark.postgres
def test_server_postgres_read_only_and_back(
    tmp_path: Path, bundle: Path, pg_url: str, pg_available: str
) -> None:
    db = urlparse(pg_url).path.lstrip("/")
    rid = load_bundle(bundle).bundle_id
    srv = start_server(tmp_path, bundle=bundle, store=pg_url)
    try:
        rel = release_info(srv.target)
        traffic = Traffic(srv.target, rel.state_low, rel.state_high).start()
        time.sleep(0.5)
        with _admin(pg_available) as conn:
            conn.execute(f'ALTER DATABASE "{db}" SET default_transaction_read_only = on')
        _terminate(pg_available, db)
        _wait_in_log(srv, LOG_RETRY)  # the log cannot write
        logged_ro = _logged(pg_url, rid)
        traffic.wait_ok_growth()  # ... and the answers go on
        time.sleep(1.0)
        assert _logged(pg_url, rid) == logged_ro, "the log wrote to a read-only database"
        with _admin(pg_available) as conn:
            conn.execute(f'ALTER DATABASE "{db}" RESET default_transaction_read_only')
        _terminate(pg_available, db)
        recovery_s = _wait_log_growth(pg_url, rid)
        traffic.finish()
        numbers = _check_after(traffic, srv, pg_url, bundle)
    finally:
        with _admin(pg_available) as conn:
            conn.execute(f'ALTER DATABASE "{db}" RESET default_transaction_read_only')
        srv.stop()
    _report_recovered("server_fault_postgres_read_only", traffic, recovery_s, numbers)


@pytest.mark.postgres
def test_server_postgres_connections_cut(
    tmp_path: Path, bundle: Path, pg_url: str, pg_available: str
) -> None:
    db = urlparse(pg_url).path.lstrip("/")
    rid = load_bundle(bundle).bundle_id
    cuts = int(scale(5, 25))
    restart = FULL and os.environ.get("QVEIL_PG_RESTART") == "1"
    srv = start_server(tmp_path, bundle=bundle, store=pg_url)
    terminated = 0
    try:
        rel = release_info(srv.target)
        traffic = Traffic(srv.target, rel.state_low, rel.state_high).start()
        for i in range(cuts):
            time.sleep(0.4)
            terminated += _terminate(pg_available, db)
            if restart and i == cuts // 2:
                from test_reliability_faults_store import _pg_cluster_restart

                _pg_cluster_restart()
        recovery_s = _wait_log_growth(pg_url, rid)
        traffic.wait_ok_growth()
        traffic.finish()
        alive = srv.alive()
        numbers = _check_after(traffic, srv, pg_url, bundle)
    finally:
        srv.stop()
    assert alive
    report(
        "server_fault_postgres_connections_cut",
        cuts=cuts,
        backends_terminated=terminated,
        cluster_restarted=restart,
        calls=dict(traffic.book.codes),
        known_state_calls=dict(traffic.known_book.codes),
        recovery_s=round(recovery_s, 2),
        **numbers,
        unexpected_errors={},
    )
