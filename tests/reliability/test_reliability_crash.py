"""Crash suite: the real `qveil serve` SIGKILLed at random moments while clients stream
queries of new and repeated states; SIGTERM drains in-flight calls.

The promise under test: an answer is a pure function of the release (its weights and its one
noise key) and the state, so no crash can change one, and the answer log (written off the
answer path) only ever holds the release's values. After any number of kills:

* every answer any client ever received is returned unchanged by the restarted server
  (re-asked state by state), every repeated answer during the run was identical, and every
  answer is the value computed here from the bundle's key, bit for bit;
* the answer log holds only answered states, each once, and `qveil audit --store URL --bundle
  DIR` recomputes every logged value from the key (and checks the hash chains, sequences,
  ledger and audit log): all intact. A SIGKILL may lose what was queued for the log and not
  yet written (an audit trail, not the source of any answer); the re-check asks every state
  again, so after it and a graceful stop every answered state is logged;
* a graceful stop (SIGTERM) loses nothing: every answer of the drained calls is in the log.

Quick form (make test): 8 kills; full form (make reliability): 50.
"""

from __future__ import annotations

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
    assert_answers_are_the_keys,
    assert_answers_kept,
    audit_with_key,
    get_values,
    kill_under_load,
    logged_states,
    query_workers,
    recheck,
    release_info,
    report,
    scale,
    sqlite_url,
    start_server,
    unlogged_answers,
)

pytestmark = pytest.mark.slow


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
        assert srv.terminate() == 0, srv.log_tail()
    keyed = assert_answers_are_the_keys(book, bundle)
    logged = logged_states(store_url, bundle)
    asked = {float(x) for x in _unit(bundle, book.states())}
    assert all(xs <= asked for xs in logged.values()), "the log holds a state nobody asked"
    # a SIGKILL loses what was queued for the log; the recheck answered every state again
    # and the graceful stop flushed it: now every answered state is logged
    missing = unlogged_answers(book, store_url, bundle)
    assert not missing, f"{len(missing)} answered states are not in the log: {missing[:5]}"
    t2 = time.monotonic()
    audit = audit_with_key(store_url, bundle)
    audit_s = time.monotonic() - t2
    report(
        "crash_sigkill",
        kills=kills,
        clients=clients,
        run_s=round(run_s, 1),
        calls=dict(book.codes),
        answers_rechecked=checked,
        answers_checked_against_key=keyed,
        answers_changed=0,
        answers_missing=0,
        repeats_checked_live=book.repeats_checked,
        **audit,
        recheck_s=round(recheck_s, 1),
        audit_s=round(audit_s, 1),
        unexpected_errors={},
    )


def _unit(bundle: Path, states: list[float]) -> list[float]:
    from server_helpers import grid_states

    return [float(x) for x in grid_states(bundle, states)[:, 0]] if states else []


def test_sigterm_drains_in_flight_calls(tmp_path: Path, bundle: Path) -> None:
    """Calls in flight when SIGTERM arrives all complete with OK (8 clients stream calls of
    4000 new states back to back, so calls are surely in flight); the server exits 0 with
    every answer in the log (the log is flushed on close); the restarted server answers the
    same. ``--drain-delay 0.5``: a call a client started before SIGTERM reaches the server
    while it still answers, however the threads are scheduled, so every such call must
    end OK, and a call is in flight at SIGTERM unless all 8 clients sit between calls."""
    store_url = sqlite_url(tmp_path / "store.sqlite")
    srv = start_server(tmp_path, bundle=bundle, store=store_url, extra=["--drain-delay", "0.5"])
    rel = release_info(srv.target)
    book = AnswerBook()
    results: list[tuple[float, float, str]] = []  # (start, end, code)
    lock = threading.Lock()
    stop = threading.Event()
    go = threading.Barrier(9)

    def stream(seed: int) -> None:
        from qveil.v1 import value_service_pb2_grpc as vgrpc

        rng = np.random.default_rng(seed)
        with grpc.insecure_channel(srv.target) as ch:
            stub = vgrpc.ValueServiceStub(ch)
            go.wait()
            code = "OK"
            while code == "OK" and not stop.is_set():
                states = rng.uniform(rel.state_low, rel.state_high, size=4000).tolist()
                t_start = time.monotonic()
                try:
                    reply = get_values(stub, states, timeout=60.0)
                    book.add(reply.release_id, states, list(reply.actions), list(reply.values))
                except grpc.RpcError as exc:
                    code = exc.code().name
                with lock:
                    results.append((t_start, time.monotonic(), code))

    threads = [threading.Thread(target=stream, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    go.wait()
    time.sleep(0.5)  # every client is streaming
    t_term = time.monotonic()
    code = srv.terminate(timeout=60)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    before = [r for r in results if r[0] < t_term]
    in_flight = [r for r in before if r[1] > t_term]
    failed = [r for r in before if r[2] != "OK"]
    finished_after = len(in_flight)
    assert not failed, f"calls made before SIGTERM failed during the drain: {failed}"
    # a call that starts after SIGTERM is refused (UNAVAILABLE), or, when it reaches gRPC's
    # core just as the server stops, cancelled by gRPC before any handler ran (CANCELLED,
    # grpc/grpc#41785; the SDK retries both): never processed, never an error of a call
    # that was in flight
    after = {r[2] for r in results if r[0] >= t_term}
    assert after <= {"OK", "UNAVAILABLE", "CANCELLED"}, after
    assert finished_after >= 1, "no call was still in flight at SIGTERM: nothing was drained"
    assert code == 0, f"server exit code after SIGTERM: {code}\n{srv.log_tail()}"
    missing = unlogged_answers(book, store_url, bundle)
    assert not missing, f"{len(missing)} drained answers are not in the log: {missing[:5]}"
    assert_answers_are_the_keys(book, bundle)
    srv.start()
    try:
        checked, mismatches = recheck(book, srv.target)
        assert not mismatches
    finally:
        srv.terminate()
    report(
        "sigterm_drain",
        calls_before_sigterm=len(before),
        calls_in_flight=len(in_flight),
        finished_after_sigterm=finished_after,
        errors=0,
        exit_code=code,
        answers_rechecked=checked,
        unexpected_errors={},
    )
