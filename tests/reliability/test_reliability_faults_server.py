"""Faults under a running server, seen by gRPC clients.

Clients stream GetValues with new points while the store's filesystem fills up, while the
PostgreSQL database turns read-only, and while PostgreSQL connections are cut (and, in the full
form with QVEIL_PG_RESTART=1, while the machine's PostgreSQL cluster restarts). The promises:

* new points fail cleanly: the client gets UNAVAILABLE (never INTERNAL/UNKNOWN, never a value);
  a client asking only for known states keeps getting answers;
* no value that was not stored is ever answered: after the fault every answer any client got is
  re-asked and returned unchanged, every answered state has its row in the store, and the
  store's integrity chain verifies;
* the service recovers by itself: new points are answered again once the fault is gone, with
  no restart of the server.
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
)

from qveil.bundle import load_bundle
from qveil.server.store import open_store

pytestmark = pytest.mark.slow


class Traffic:
    """Two streaming clients with new points and one asking only known states."""

    def __init__(self, target: str, low: float, high: float) -> None:
        self.book = AnswerBook()
        self.known_book = AnswerBook()
        self.unexpected: list[str] = []
        self.stop = threading.Event()
        self.target, self.low, self.high = target, low, high
        self.known = np.linspace(low, high, 50).tolist()
        self.threads = query_workers(
            self.book, [target], self.stop, clients=2, seed=40,
            low=low, high=high, n_new=16, n_known=4, pause=0.01, unexpected=self.unexpected,
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
        # the known states are stored before the fault
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

    def wait_ok_growth(self, *, within: float) -> float:
        """Seconds until new-point calls succeed again (recovery by itself)."""
        t0 = time.monotonic()
        start = self.ok_calls()
        while time.monotonic() - t0 < within:
            if self.ok_calls() >= start + 3:
                return time.monotonic() - t0
            time.sleep(0.05)
        raise AssertionError(f"no recovery within {within}s; codes {self.book.codes}")


def _check_after(traffic: Traffic, target: str, store_url: str, bundle: Path) -> int:
    assert not traffic.unexpected, f"errors other than UNAVAILABLE: {traffic.unexpected[:5]}"
    assert not traffic.book.conflicts and not traffic.known_book.conflicts
    n, mism = recheck(traffic.book, target)
    assert not mism, f"answers changed: {mism[:5]}"
    b = load_bundle(bundle)
    rid = next(iter(traffic.book.release_ids))
    store = open_store(store_url, create=False)
    try:
        stored = {a: {float(p.x) for p in store.iter_points(rid, a)} for a in range(b.n_actions)}
        assert store.verify(rid).ok
    finally:
        store.close()
    states = traffic.book.states()
    unit = dict(zip(states, b.box.to_unit(np.array(states))[:, 0].tolist(), strict=True))
    missing = [k for k in traffic.book.values if unit[k[0]] not in stored[k[1]]]
    assert not missing, f"{len(missing)} answered values are not stored: {missing[:5]}"
    return n


def test_server_store_filesystem_full(tmp_path: Path, bundle: Path) -> None:
    mnt = tmp_path / "fs"
    if not tmpfs_mount(mnt, size="8m"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    srv = None
    try:
        store_url = sqlite_url(mnt / "store.sqlite")
        srv = start_server(tmp_path, bundle=bundle, store=store_url)
        rel = release_info(srv.target)
        traffic = Traffic(srv.target, rel.state_low, rel.state_high).start()
        time.sleep(0.5)
        ballast = fill_filesystem(mnt)
        t_full = time.monotonic()
        while traffic.book.codes.get("UNAVAILABLE", 0) < 5 and time.monotonic() - t_full < 30:
            time.sleep(0.05)
        unavailable = traffic.book.codes.get("UNAVAILABLE", 0)
        known_ok_during = traffic.known_book.codes.get("OK", 0)
        time.sleep(1.0)
        known_ok_during = traffic.known_book.codes.get("OK", 0) - known_ok_during
        ballast.unlink()
        recovery_s = traffic.wait_ok_growth(within=30)
        time.sleep(0.5)
        traffic.finish()
        assert unavailable >= 5, (
            f"a full filesystem never surfaced as UNAVAILABLE: {traffic.book.codes}"
        )
        assert set(traffic.known_book.codes) == {"OK"}, (
            f"known states failed while the disk was full: {traffic.known_book.codes}"
        )
        assert known_ok_during > 0
        checked = _check_after(traffic, srv.target, store_url, bundle)
    finally:
        if srv is not None:
            srv.stop()
        umount(mnt)
    _report_recovered("server_fault_disk_full", traffic, recovery_s, checked)


def _report_recovered(name: str, traffic: Traffic, recovery_s: float, checked: int) -> None:
    """The results line of a fault the server recovered from with no unexpected error."""
    report(
        name,
        calls=dict(traffic.book.codes),
        known_state_calls_ok=traffic.known_book.codes.get("OK", 0),
        recovery_s=round(recovery_s, 2),
        answers_rechecked=checked,
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
    srv = start_server(tmp_path, bundle=bundle, store=pg_url)
    try:
        rel = release_info(srv.target)
        traffic = Traffic(srv.target, rel.state_low, rel.state_high).start()
        time.sleep(0.5)
        with _admin(pg_available) as conn:
            conn.execute(f'ALTER DATABASE "{db}" SET default_transaction_read_only = on')
        _terminate(pg_available, db)
        t0 = time.monotonic()
        while traffic.book.codes.get("UNAVAILABLE", 0) < 5 and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        ok_ro = traffic.ok_calls()
        time.sleep(1.0)
        ok_during_ro = traffic.ok_calls() - ok_ro
        with _admin(pg_available) as conn:
            conn.execute(f'ALTER DATABASE "{db}" RESET default_transaction_read_only')
        _terminate(pg_available, db)
        recovery_s = traffic.wait_ok_growth(within=30)
        traffic.finish()
        assert traffic.book.codes.get("UNAVAILABLE", 0) >= 5, traffic.book.codes
        assert ok_during_ro == 0, f"{ok_during_ro} new-point calls answered on a read-only db"
        known_errors = {k: v for k, v in traffic.known_book.codes.items() if k != "OK"}
        checked = _check_after(traffic, srv.target, pg_url, bundle)
    finally:
        with _admin(pg_available) as conn:
            conn.execute(f'ALTER DATABASE "{db}" RESET default_transaction_read_only')
        srv.stop()
    assert not known_errors, f"known states failed while read-only: {known_errors}"
    _report_recovered("server_fault_postgres_read_only", traffic, recovery_s, checked)


@pytest.mark.postgres
def test_server_postgres_connections_cut(
    tmp_path: Path, bundle: Path, pg_url: str, pg_available: str
) -> None:
    db = urlparse(pg_url).path.lstrip("/")
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
        recovery_s = traffic.wait_ok_growth(within=30)
        traffic.finish()
        checked = _check_after(traffic, srv.target, pg_url, bundle)
        alive = srv.alive()
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
        answers_rechecked=checked,
        unexpected_errors={},
    )
