"""Replicas: three `qveil serve` processes on one PostgreSQL store.

Six clients walk the SAME list of batches of new states, each starting on a different replica,
so at any moment the same new points are being asked of all three replicas at once (maximal
overlap). Mid-run one replica is SIGKILLed; its clients fail over to the others and retry.
Afterwards (the killed replica restarted):

* every answer is identical across all three replicas and equal to what clients received;
* each stored point was drawn once (the unique (release, action, x) row) and the joint law of
  each action's path, whitened in insertion order by the exact OU conditionals
  (qveil.stats.whiten), passes qveil.stats.normality_report at the suite-wide
  level of noise_helpers.assert_unseeded_law.

A store that sampled concurrent new points without the per-action advisory lock would give
two replicas two values for one state (caught by the cross-replica comparison) or draw
neighbours without conditioning on each other (whitened variance far from 1: with beta = 20
and ~1e3 points on [0, 1], neighbours are strongly correlated, so ignoring one inflates the
innovation variance; the report's var_p then falls far below the 1e-3 level).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from noise_helpers import assert_unseeded_law
from reliability_helpers import (
    AnswerBook,
    get_values,
    recheck,
    release_info,
    replicas,
    report,
    scale,
    value_stubs,
)

from qveil.bundle import load_bundle
from qveil.server.store import open_store

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
    b = load_bundle(bundle)
    store = open_store(pg_url, create=False)
    try:
        reports = {}
        for a in range(b.n_actions):
            pts = list(store.iter_points(rel.release_id, a))
            xs = np.array([p.x for p in pts])
            gs = np.array([p.g for p in pts])
            assert len(pts) == n_batches * batch, "one stored value per distinct state"
            # OS-entropy noise cannot be seeded: the suite-wide level, with its power shown
            reports[a] = assert_unseeded_law(xs, gs, beta=b.beta, sigma=b.sigma)
        assert store.verify(rel.release_id).ok
    finally:
        store.close()
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
        answers_changed=0,
        repeats_checked_live=book.repeats_checked,
        normality={
            a: {k: r[k] for k in ("n", "var", "ks_p", "chi2_p", "var_p", "passed")}
            for a, r in reports.items()
        },
        unexpected_errors={},
    )
