"""Replicas: three `qveil serve` processes of one release logging into one PostgreSQL store.

Six clients walk the SAME list of batches of new states, each starting on a different replica,
so at any moment the same new states are being asked of all three replicas at once and the
three answer logs write the same points concurrently (maximal overlap). Mid-run one replica is
SIGKILLed; its clients fail over to the others and retry. Afterwards (the killed replica
restarted, every answer re-asked of each replica, all stopped gracefully):

* every answer is identical across all three replicas, equal to what clients received and to
  the value computed here from the bundle's key, bit for bit;
* the log holds every answered state once per action (the group commit under the per-path
  advisory locks: two replicas logging one state write one row), and `qveil audit --bundle`
  recomputes every logged value from the key: hash chains, sequences and values intact; the
  law of each path passes (qveil.server.governance.audit at a level with a false-alarm rate < 1e-6,
  with power against sigma x 1.3).

A log that wrote a state twice (no lock, or a lost race not retried) fails the audit ("a state
appears twice"); an answer that depended on the replica fails the cross-replica comparison.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from reliability_helpers import (
    AnswerBook,
    assert_answers_are_the_keys,
    audit_with_key,
    get_values,
    logged_states,
    recheck,
    release_info,
    replicas,
    report,
    scale,
    unlogged_answers,
    value_stubs,
)
from server_helpers import grid_states

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def _walker(
    book: AnswerBook,
    targets: list[str],
    batches: list[list[float]],
    start: int,
    progress: list[int],
    idx: int,
    unexpected: list[str],
) -> None:
    k = start
    with value_stubs(targets) as stubs:
        for b, states in enumerate(batches):
            for _attempt in range(50):
                try:
                    reply = get_values(stubs[k], states, timeout=30.0)
                except grpc.RpcError as exc:
                    book.error(exc.code().name)
                    if exc.code() != grpc.StatusCode.UNAVAILABLE:
                        unexpected.append(f"{targets[k]}: {exc.code().name}: {exc.details()}")
                    k = (k + 1) % len(stubs)  # fail over
                    time.sleep(0.02)
                    continue
                book.add(reply.release_id, states, list(reply.actions), list(reply.values))
                break
            else:
                unexpected.append(f"batch {b} never answered")
            progress[idx] = b + 1


# long-function: one scenario top to bottom: three replicas under load, one killed and restarted,
#   then every answer rechecked on each and the stored law checked
def test_three_replicas_one_postgres_store(tmp_path: Path, bundle: Path, pg_url: str) -> None:
    n_batches = int(scale(150, 1000))
    batch = 20
    srvs = replicas(tmp_path, 3, bundle=bundle, store=pg_url)
    try:
        for s in srvs:  # all three at once on the fresh database (migrations, registration)
            s.start(wait=False)
        for s in srvs:
            s.wait_serving(timeout=90)
        targets = [s.target for s in srvs]
        rel = release_info(targets[0])
        rng = np.random.default_rng(2024)
        batches = [
            rng.uniform(rel.state_low, rel.state_high, size=batch).tolist()
            for _ in range(n_batches)
        ]
        book = AnswerBook()
        unexpected: list[str] = []
        clients = 6
        progress = [0] * clients
        threads = [
            threading.Thread(
                target=_walker,
                args=(book, targets, batches, i % 3, progress, i, unexpected),
                daemon=True,
            )
            for i in range(clients)
        ]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        victim = 2
        kill_at = random.Random(5).randint(n_batches // 3, n_batches // 2)
        while min(progress) < kill_at and any(t.is_alive() for t in threads):
            time.sleep(0.01)
        srvs[victim].kill()
        killed_at_batch = min(progress)
        for t in threads:
            t.join(timeout=300)
        run_s = time.monotonic() - t0
        assert not unexpected, f"errors other than UNAVAILABLE: {unexpected[:5]}"
        assert not book.conflicts, f"clients got different values: {book.conflicts[:5]}"
        srvs[victim].start()
        compared = 0
        for s in srvs:
            n, mism = recheck(book, s.target)
            assert not mism, f"{s.target} answers differently: {mism[:5]}"
            compared += n
    finally:
        for s in srvs:
            s.stop()
    keyed = assert_answers_are_the_keys(book, bundle)
    missing = unlogged_answers(book, pg_url, bundle)
    assert not missing, f"{len(missing)} answered states are not in the log: {missing[:5]}"
    distinct = len(set(grid_states(bundle, [x for b in batches for x in b])[:, 0].tolist()))
    logged = logged_states(pg_url, bundle)
    assert all(len(xs) == distinct for xs in logged.values()), "one logged value per state"
    audit = audit_with_key(pg_url, bundle)
    report(
        "replicas",
        replicas=3,
        killed=1,
        killed_at_batch=killed_at_batch,
        clients=clients,
        batches=n_batches,
        states_per_batch=batch,
        run_s=round(run_s, 1),
        calls=dict(book.codes),
        answers_rechecked=compared,
        answers_checked_against_key=keyed,
        answers_changed=0,
        repeats_checked_live=book.repeats_checked,
        **audit,
        unexpected_errors={},
    )
