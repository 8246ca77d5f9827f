"""The path cache: the in-process copy of each path's log, and what it promises.

* A ``record_paths`` call returns only once its states are committed: 16 threads log single
  new states of two paths at once (group commit puts several callers in one transaction, and
  a follower returns when the leader's commit held its states); right after each call,
  another connection finds every state of the call in the database.
* ``refresh(wait=False)`` does not wait for a commit in flight (a path whose lock is held is
  left as it is) and still loads what other writers logged on the other paths; the waiting
  ``refresh`` loads everything once the commit is over.
* The copy decides "logged already": a state in it is compared, not written (a different
  value is counted), without a database read.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import numpy as np
from store_helpers import keyed_paths, log_values, make_release

from qveil.server.store import open_store
from qveil.server.store.pathcache import _process_lock

CALLERS, CALLS = 16, 12


def _store(url: str) -> Any:
    st = open_store(url)
    make_release(st, "r", n_actions=2, sigma=1.0, beta=1.0, interval=(0.0, 1.0))
    return st


def test_every_call_returns_after_its_commit(tmp_path: Path) -> None:
    db = tmp_path / "s.sqlite"
    st = _store(f"sqlite:///{db}")
    kp = keyed_paths(st.releases.get_release("r"))
    errors: list[BaseException] = []
    unseen: list[tuple[int, float]] = []
    start = threading.Barrier(CALLERS)

    def caller(i: int) -> None:
        rng = np.random.default_rng(100 + i)
        con = sqlite3.connect(db)  # another connection: only committed rows
        try:
            start.wait()
            for _ in range(CALLS):
                u = [float(rng.uniform())]
                xs, _gs, _w, _m = log_values(st, kp, "r", [0, 1], [u, u])
                for p in (0, 1):
                    row = con.execute(
                        "SELECT COUNT(*) FROM noise_points WHERE release_id = 'r' "
                        "AND action = ? AND x = ?",
                        (p, float(xs[p][0])),
                    ).fetchone()
                    if row[0] != 1:
                        unseen.append((p, float(xs[p][0])))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            con.close()

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(CALLERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and unseen == []
    assert st.count_points("r") == st.committer.points_logged == 2 * CALLERS * CALLS
    # several callers' states went into one commit
    commits = {p.created_at for p in st.iter_points("r", 0)}
    assert len(commits) < CALLERS * CALLS
    assert st.verify("r").ok
    st.close()


def test_refresh_without_waiting_skips_a_path_in_flight(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    a = _store(url)
    b = open_store(url, create=False)
    kp = keyed_paths(a.releases.get_release("r"))
    units = np.linspace(0, 1, 7)
    assert log_values(b, kp, "r", [0, 1], [units, units])[2:] == (14, 0)
    lock = _process_lock(a._identity, "r", 0)  # a commit of path 0 in flight in `a`
    lock.acquire()
    try:
        assert a.paths.refresh("r", wait=False) == 7  # returns at once, path 1 loaded
        assert (a.paths.cached_points("r", 0), a.paths.cached_points("r", 1)) == (0, 7)
        done = threading.Event()
        got: list[int] = []

        def waiting() -> None:
            got.append(a.paths.refresh("r"))
            done.set()

        t = threading.Thread(target=waiting)
        t.start()
        assert not done.wait(0.3)  # the waiting refresh waits for the commit
    finally:
        lock.release()
    t.join(timeout=30)
    assert got == [14] and a.paths.known_points("r") == 14
    assert (a.paths.cached_points("r", 0), a.paths.cached_points("r", 1)) == (7, 7)
    a.close()
    b.close()


def test_the_copy_decides_logged_already(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    st = _store(url)
    kp = keyed_paths(st.releases.get_release("r"))
    xs, gs, written, _m = log_values(st, kp, "r", [0], [[0.25, 0.5]])
    assert written == 2
    reads = [0]
    real = st._db_fetch_since

    def counted(*args: Any) -> Any:
        reads[0] += 1
        return real(*args)

    st._db_fetch_since = counted
    assert st.record_paths("r", [0], xs, gs) == (0, 0)
    assert st.record_paths("r", [0], xs, [gs[0] + 1.0]) == (0, 2)  # counted, not written
    assert reads[0] == 0
    assert [p.g for p in st.iter_points("r", 0)] == gs[0].tolist()
    st.close()
