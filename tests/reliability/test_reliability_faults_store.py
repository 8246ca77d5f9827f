"""Faults under the answer log's store, at the store API.

What production brings to the store: its filesystem full, its database read-only, PostgreSQL
connections cut (a restart of the cluster in the full form). For each, the promises are:

* a write of new points fails cleanly: a domain ``Unavailable`` (the server's answer log
  keeps the points and tries again), nothing half-written (the point count does not move on
  a failed call);
* nothing a returned call logged is lost: every value of every ``record_paths`` call that
  returned is in the log, unchanged, after the fault, after a reopen, and the integrity
  chain verifies;
* the log recovers by itself: once the fault is gone the same store object (no reopen, no
  restart) commits new points again.

A broken store fails these: one that returned before its commit would miss values after the
reopen; one that leaked a raw driver error would raise something other than ``Unavailable``;
one that kept a dead or read-only connection in its pool would never recover. The values
logged are those of the release's key (:func:`store_helpers.keyed_paths`). The server-level
versions (clients over gRPC) are in test_reliability_faults_server.py.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest
from reliability_helpers import (
    FULL,
    fill_filesystem,
    report,
    scale,
    sqlite_url,
    tmpfs_mount,
    tmpfs_remount,
    umount,
)
from store_helpers import keyed_paths, make_release, path_values

from qveil.errors import QveilError, Unavailable
from qveil.keyed import KeyedPaths
from qveil.server.store import SamplePathStore, open_store

RID = "rel-faults"
SIGMA, BETA = 1.0, 5.0


def _release(store: SamplePathStore) -> KeyedPaths:
    """Create the release (or find it); its paths under the tests' seeded key."""
    return keyed_paths(
        make_release(store, RID, sigma=SIGMA, beta=BETA, interval=(0.0, 1.0), status="active")
    )


def _log(
    store: SamplePathStore, kp: KeyedPaths, action: int, units: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Log the key's values at ``units`` on path ``action``: (snapped states, values)."""
    xs, gs = path_values(kp, action, units)
    store.record_paths(RID, [action], [xs], [gs])
    return xs, gs


def _record(
    answered: dict[tuple[int, float], float], action: int, xs: np.ndarray, gs: np.ndarray
) -> None:
    for x, g in zip(xs.tolist(), np.asarray(gs).tolist(), strict=True):
        prev = answered.setdefault((action, x), g)
        assert prev == g, f"two values handed over for action {action} x={x}: {prev} {g}"


def _log_new(
    store: SamplePathStore,
    kp: KeyedPaths,
    answered: dict[tuple[int, float], float],
    rng: np.random.Generator,
    n: int,
    action: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Log ``n`` fresh random states of ``action`` and record them once the call returned:
    (states, values)."""
    xs, gs = _log(store, kp, action, rng.uniform(size=n))
    _record(answered, action, xs, gs)
    return xs, gs


def _open_with_known(
    url: str, seed: int, n: int
) -> tuple[
    SamplePathStore,
    KeyedPaths,
    dict[tuple[int, float], float],
    np.random.Generator,
    np.ndarray,
    np.ndarray,
]:
    """A store on ``url`` holding the release and ``n`` logged states of action 0: (store,
    the release's paths, the logged points, the states' generator (``seed + 1``), the states,
    their values). The store is closed if any of that fails."""
    store = open_store(url)
    answered: dict[tuple[int, float], float] = {}
    rng = np.random.default_rng(seed + 1)
    try:
        kp = _release(store)
        known, g_known = _log_new(store, kp, answered, rng, n)
    except BaseException:
        store.close()
        raise
    return store, kp, answered, rng, known, g_known


def _known_still_logged(
    store: SamplePathStore, action: int, xs: np.ndarray, gs: np.ndarray
) -> None:
    """Logging known points again writes nothing (the copy holds them, unchanged)."""
    assert store.record_paths(RID, [action], [xs], [gs]) == (0, 0)


def _check_all_stored(url: str, answered: dict[tuple[int, float], float]) -> int:
    """Reopen the store; every logged value is there unchanged; chains verify."""
    store = open_store(url, create=False)
    try:
        stored: dict[tuple[int, float], float] = {}
        for a in (0, 1):
            for p in store.iter_points(RID, a):
                stored[(a, float(p.x))] = float(p.g)
        missing = [k for k in answered if k not in stored]
        changed = [k for k, g in answered.items() if k in stored and stored[k] != g]
        assert not missing, f"{len(missing)} logged values not in the store, e.g. {missing[:3]}"
        assert not changed, f"{len(changed)} logged values changed, e.g. {changed[:3]}"
        rep = store.verify(RID)
        assert rep.ok, f"integrity verification failed after the fault: {rep}"
        return len(answered)
    finally:
        store.close()


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "fs"
    if not tmpfs_mount(mnt, size="4m"):
        pytest.skip(
            "cannot mount a tmpfs here (needs root); the store's own tests cover "
            "a full disk with SQLite max_page_count"
        )
    try:
        yield mnt
    finally:
        umount(mnt)


def test_sqlite_filesystem_full_fails_cleanly_and_recovers(tmpfs: Path) -> None:
    """A 4 MiB tmpfs under the SQLite store is filled with a ballast file while the store is
    open: the next commits fail with Unavailable and store nothing, known points are still
    known unchanged, and deleting the ballast lets the SAME store object commit again."""
    url = sqlite_url(tmpfs / "store.sqlite")
    store, kp, answered, rng, known, g_known = _open_with_known(url, 91, 200)
    try:
        ballast = fill_filesystem(tmpfs)
        failed_xs = None
        committed_while_full = 0
        for _ in range(400):
            xs, gs = path_values(kp, 0, rng.uniform(size=50))
            before = store.count_points(RID, 0)
            try:
                store.record_paths(RID, [0], [xs], [gs])
            except Unavailable as exc:
                assert store.count_points(RID, 0) == before, "a failed call stored points"
                failed_xs, failed_gs, message = xs, gs, str(exc)
                break
            except QveilError as exc:
                pytest.fail(
                    f"a full disk must surface as Unavailable, got {type(exc).__name__}: {exc}"
                )
            _record(answered, 0, xs, gs)
            committed_while_full += 1
        assert failed_xs is not None, "20000 new points fit on a full 4 MiB filesystem?"
        _known_still_logged(store, 0, known, g_known)
        ballast.unlink()
        t0 = time.monotonic()
        # the same object, no reopen
        assert store.record_paths(RID, [0], [failed_xs], [failed_gs]) == (len(failed_xs), 0)
        recovery_s = time.monotonic() - t0
        _record(answered, 0, failed_xs, failed_gs)
    finally:
        store.close()
    checked = _check_all_stored(url, answered)
    report(
        "fault_sqlite_disk_full",
        commits_after_full=committed_while_full,
        error=message[:120],
        answers_rechecked=checked,
        recovered=True,
        recovery_s=recovery_s,
    )


def test_sqlite_read_only_filesystem(tmpfs: Path) -> None:
    """The store's filesystem is read-only when the store opens (a remount after an error, a
    read-only volume): either the open is refused with a clear domain error, or known points
    are known and new points fail with Unavailable, storing nothing. After the remount
    read-write a store opened again commits, and nothing logged before was lost."""
    url = sqlite_url(tmpfs / "store.sqlite")
    answered: dict[tuple[int, float], float] = {}
    rng = np.random.default_rng(93)
    store = open_store(url)
    try:
        kp = _release(store)
        known, g_known = _log_new(store, kp, answered, rng, 100, action=1)
    finally:
        store.close()
    tmpfs_remount(tmpfs, "ro")
    outcome = ""
    try:
        try:
            ro = open_store(url, create=False)
        except QveilError as exc:
            outcome = f"open refused: {type(exc).__name__}: {exc}"
        else:
            try:
                _known_still_logged(ro, 1, known, g_known)
                with pytest.raises(Unavailable):
                    _log(ro, kp, 1, rng.uniform(size=10))
                assert ro.count_points(RID, 1) == len(known)
                outcome = "known points known, new points Unavailable"
            finally:
                ro.close()
    finally:
        tmpfs_remount(tmpfs, "rw")
    store = open_store(url)
    try:
        _log_new(store, kp, answered, rng, 10, action=1)
    finally:
        store.close()
    checked = _check_all_stored(url, answered)
    report("fault_sqlite_read_only", outcome=outcome, answers_rechecked=checked)


# ---------------------------------------------------------------- PostgreSQL -------------


def _admin(url: str):  # type: ignore[no-untyped-def]
    import psycopg

    return psycopg.connect(url, autocommit=True, connect_timeout=5)


def _terminate(admin_url: str, db: str) -> int:
    with _admin(admin_url) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (db,),
        ).fetchall()
    return len(rows)


def _retry_new_points(
    store: SamplePathStore,
    kp: KeyedPaths,
    rng: np.random.Generator,
    answered: dict[tuple[int, float], float],
    *,
    within: float,
) -> float:
    """Call with new points until one commits (the store recovering by itself)."""
    t0 = time.monotonic()
    last: Exception | None = None
    while time.monotonic() - t0 < within:
        try:
            _log_new(store, kp, answered, rng, 5)
            return time.monotonic() - t0
        except Unavailable as exc:
            last = exc
            time.sleep(0.1)
    pytest.fail(f"store did not recover within {within}s; last error: {last}")


@pytest.mark.postgres
def test_postgres_read_only_then_writable_again(pg_url: str, pg_available: str) -> None:
    """The database turns read-only (default_transaction_read_only, then the store's sessions
    are cut, as in a failover to a read-only node): new points fail with Unavailable and store
    nothing; known points are still known; when it is writable again (and the read-only
    sessions are cut again), the same store object commits again by itself."""
    db = urlparse(pg_url).path.lstrip("/")
    store, kp, answered, rng, known, g_known = _open_with_known(pg_url, 96, 100)
    try:
        with _admin(pg_available) as conn:
            conn.execute(f'ALTER DATABASE "{db}" SET default_transaction_read_only = on')
        _terminate(pg_available, db)
        before = store.count_points(RID, 0)
        failures = Counter[str]()
        for _ in range(3):
            try:
                _log(store, kp, 0, rng.uniform(size=10))
                pytest.fail("a read-only database committed new points")
            except Unavailable:
                failures["UNAVAILABLE"] += 1
            except QveilError as exc:
                pytest.fail(f"read-only must be Unavailable, got {type(exc).__name__}: {exc}")
        assert store.count_points(RID, 0) == before
        _known_still_logged(store, 0, known, g_known)
        with _admin(pg_available) as conn:
            conn.execute(f'ALTER DATABASE "{db}" RESET default_transaction_read_only')
        _terminate(pg_available, db)
        recovery_s = _retry_new_points(store, kp, rng, answered, within=15.0)
    finally:
        with _admin(pg_available) as conn:
            conn.execute(f'ALTER DATABASE "{db}" RESET default_transaction_read_only')
        store.close()
    checked = _check_all_stored(pg_url, answered)
    report(
        "fault_postgres_read_only",
        failed_cleanly=failures["UNAVAILABLE"],
        recovery_s=recovery_s,
        answers_rechecked=checked,
    )


def _pg_cluster_restart() -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True,
        capture_output=True,
        timeout=120,
    )


@pytest.mark.postgres
def test_postgres_connections_cut_while_streaming(pg_url: str, pg_available: str) -> None:
    """Four threads log new points while the store's PostgreSQL sessions are terminated
    again and again (pg_terminate_backend; full form with QVEIL_PG_RESTART=1: the machine's
    cluster is restarted once too). Calls may fail with Unavailable, never otherwise; every
    value of every call that returned is logged unchanged; calls succeed again after the
    last cut."""
    db = urlparse(pg_url).path.lstrip("/")
    store = open_store(pg_url)
    kp = _release(store)
    answered: dict[tuple[int, float], float] = {}
    lock = threading.Lock()
    codes: Counter[str] = Counter()
    unexpected: list[str] = []
    stop = threading.Event()

    def stream(seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            a = int(rng.integers(2))
            try:
                xs, gs = _log(store, kp, a, rng.uniform(size=20))
            except Unavailable:
                with lock:
                    codes["UNAVAILABLE"] += 1
                time.sleep(0.05)
                continue
            except Exception as exc:  # noqa: BLE001 - recorded and asserted below
                with lock:
                    unexpected.append(f"{type(exc).__name__}: {exc}")
                continue
            with lock:
                codes["OK"] += 1
                _record(answered, a, xs, gs)

    cuts = int(scale(5, 25))
    restart = FULL and os.environ.get("QVEIL_PG_RESTART") == "1"
    threads = [threading.Thread(target=stream, args=(100 + i,)) for i in range(4)]
    for t in threads:
        t.start()
    terminated = 0
    try:
        for i in range(cuts):
            time.sleep(0.4)
            terminated += _terminate(pg_available, db)
            if restart and i == cuts // 2:
                _pg_cluster_restart()
        time.sleep(0.2)
        ok_before_end = codes["OK"]
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    try:
        recovery_s = _retry_new_points(store, kp, np.random.default_rng(99), answered, within=15.0)
    finally:
        store.close()
    assert not unexpected, f"errors other than Unavailable: {unexpected[:5]}"
    assert codes["OK"] > ok_before_end or recovery_s < 15.0
    checked = _check_all_stored(pg_url, answered)
    report(
        "fault_postgres_connections_cut",
        cuts=cuts,
        backends_terminated=terminated,
        cluster_restarted=restart,
        calls_ok=codes["OK"],
        calls_unavailable=codes["UNAVAILABLE"],
        answers_rechecked=checked,
        recovery_s=recovery_s,
    )
