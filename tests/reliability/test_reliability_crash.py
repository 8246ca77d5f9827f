"""Crash suite: the real `qveil serve` SIGKILLed at random moments while
clients stream queries with new points; SIGTERM drains in-flight calls.

The promise under test (non-negotiable 1): a noise value is never answered before it is
durably committed, and a stored value never changes. So after any number of kills:

* every answer any client ever received is returned unchanged by the restarted server
  (re-asked state by state), and every repeated answer during the run was identical;
* none is missing: every answered state has its noise row in the store (read directly);
* the audit (`qveil audit --store URL`: hash chains, sequence gaps) passes.

A server that answered before committing (or committed with synchronous=OFF) loses the last
answers on SIGKILL: the restarted server draws fresh values for those states and the re-check
reports them as changed. Quick form (make test): 8 kills; full form (make reliability): 50.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from reliability_helpers import (
    AnswerBook,
    assert_answers_kept,
    get_values,
    kill_under_load,
    query_workers,
    recheck,
    release_info,
    report,
    run_audit,
    scale,
    sqlite_url,
    start_server,
)

from qveil.bundle import load_bundle
from qveil.server.store import open_store

pytestmark = pytest.mark.slow


def _stored_states(
    store_url: str, bundle_dir: Path, release_id: str
) -> dict[int, dict[float, float]]:
    store = open_store(store_url, create=False)
    try:
        n_actions = load_bundle(bundle_dir).n_actions
        return {
            a: {float(p.x): float(p.g) for p in store.iter_points(release_id, a)}
            for a in range(n_actions)
        }
    finally:
        store.close()


def test_sigkill_at_random_moments_loses_no_answer(tmp_path: Path, bundle: Path) -> None:
    kills = int(scale(8, 50))
    clients = 4
    store_url = sqlite_url(tmp_path / "store.sqlite")
    srv = start_server(tmp_path, bundle=bundle, store=store_url)
    rel = release_info(srv.target)
    book = AnswerBook()
    unexpected: list[str] = []
    stop = threading.Event()
    workers = query_workers(
        book, [srv.target], stop, clients=clients, seed=10,
        low=rel.state_low, high=rel.state_high, n_new=16, n_known=8, unexpected=unexpected,
    )  # fmt: skip
    t0 = time.monotonic()
    codes = kill_under_load(
        srv, workers, stop, kills=kills, rnd=random.Random(1234), gap=(0.1, 0.9)
    )
    run_s = time.monotonic() - t0
    try:
        assert codes == [-signal.SIGKILL] * kills
        assert book.release_ids == {rel.release_id}
        t1 = time.monotonic()
        checked = assert_answers_kept(book, unexpected, srv.target, min_ok=10 * kills)
        recheck_s = time.monotonic() - t1
    finally:
        srv.terminate()
    stored = _stored_states(store_url, bundle, rel.release_id)
    b = load_bundle(bundle)
    xs = dict(
        zip(book.states(), b.box.to_unit(np.array(book.states()))[:, 0].tolist(), strict=True)
    )
    missing = [(s, a) for (s, a) in book.values if xs[s] not in stored[a]]
    assert not missing, f"{len(missing)} answered states have no stored noise: {missing[:5]}"
    t2 = time.monotonic()
    audit = run_audit(store_url, "--json")
    audit_s = time.monotonic() - t2
    # integrity after the kills is what this test pins: every row and chain link intact. The
    # statistical verdict on OS-entropy noise has a by-design false-alarm rate (~0.08 % per
    # path), so it is reported, not asserted (tests/unit/server/test_audit.py tests the law
    # test itself)
    assert audit.returncode in (0, 1), f"audit failed:\n{audit.stdout}\n{audit.stderr}"
    audit_rep = json.loads(audit.stdout)
    assert all(r["integrity_ok"] for r in audit_rep["releases"]), audit.stdout[-2000:]
    report(
        "crash_sigkill",
        kills=kills,
        clients=clients,
        run_s=round(run_s, 1),
        calls=dict(book.codes),
        answers_rechecked=checked,
        answers_changed=0,
        answers_missing=0,
        repeats_checked_live=book.repeats_checked,
        stored_points=sum(len(v) for v in stored.values()),
        audit="passed" if audit_rep["passed"] else "integrity ok; law test false alarm",
        recheck_s=round(recheck_s, 1),
        audit_s=round(audit_s, 1),
        unexpected_errors={},
    )


def test_sigterm_drains_in_flight_calls(tmp_path: Path, bundle: Path) -> None:
    """Calls in flight when SIGTERM arrives all complete with OK (big batches of new points,
    so the server is busy committing); the server exits 0; their answers are stored."""
    store_url = sqlite_url(tmp_path / "store.sqlite")
    srv = start_server(tmp_path, bundle=bundle, store=store_url)
    rel = release_info(srv.target)
    book = AnswerBook()
    results: list[tuple[float, float, str]] = []  # (start, end, code)
    lock = threading.Lock()
    go = threading.Barrier(9)

    def one(seed: int) -> None:
        from qveil.v1 import value_service_pb2_grpc as vgrpc

        rng = np.random.default_rng(seed)
        with grpc.insecure_channel(srv.target) as ch:
            stub = vgrpc.ValueServiceStub(ch)
            states = rng.uniform(rel.state_low, rel.state_high, size=3000).tolist()
            go.wait()
            t_start = time.monotonic()
            try:
                reply = get_values(stub, states, timeout=60.0)
                code = "OK"
                book.add(reply.release_id, states, list(reply.actions), list(reply.values))
            except grpc.RpcError as exc:
                code = exc.code().name
            with lock:
                results.append((t_start, time.monotonic(), code))

    threads = [threading.Thread(target=one, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    go.wait()
    time.sleep(0.15)  # every call is on the wire and admitted
    t_term = time.monotonic()
    code = srv.terminate(timeout=60)
    for t in threads:
        t.join(timeout=60)
    in_flight = [r for r in results if r[0] < t_term - 0.05]
    assert len(in_flight) == 8
    failed = [r for r in in_flight if r[2] != "OK"]
    finished_after = sum(1 for r in in_flight if r[1] > t_term)
    assert not failed, f"in-flight calls failed during the drain: {failed}"
    assert finished_after >= 1, "no call was still in flight at SIGTERM: nothing was drained"
    assert code == 0, f"server exit code after SIGTERM: {code}\n{srv.log_tail()}"
    srv.start()
    try:
        checked, mismatches = recheck(book, srv.target)
        assert not mismatches
    finally:
        srv.terminate()
    report(
        "sigterm_drain",
        calls_in_flight=len(in_flight),
        finished_after_sigterm=finished_after,
        errors=0,
        exit_code=code,
        answers_rechecked=checked,
        unexpected_errors={},
    )
