"""The log of a d > 1 release: path p = a * d + j is (action a, coordinate j), each path a
log of its own, shared by concurrent writers as a 1-D action's is.

(The law of the paths' values is the key's, tested in tests/unit/core/test_keyed.py.)"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import sqlalchemy as sa
from store_helpers import keyed_paths, log_values, make_release
from thread_helpers import run_threads

from qveil.server.store import open_store

BETAS = [1.0, 2.0, 3.0]


def test_concurrent_threads_share_coordinate_points(tmp_path: Path) -> None:
    """Threads logging overlapping coordinate values of a d = 3 release on one SQLite file:
    every (path, x) is logged once with the value handed over, the chains verify (the 1-D
    serialisation, per (action, coordinate) path), and each path's rows are keyed by its
    (action, coordinate) in the database."""
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    with open_store(url) as st:
        rec = make_release(
            st, "c", n_actions=2, sigma=1.0, beta=1.0, interval=(0.0, 1.0), betas=BETAS
        )
        assert (rec.dims, rec.n_paths) == (3, 6)
        kp = keyed_paths(rec)
        grid = np.round(np.linspace(0, 1, 41), 6)
        handed: dict[tuple[int, float], float] = {}
        lock = threading.Lock()

        def worker(k: int) -> None:
            rng = np.random.default_rng(k)
            for _ in range(10):
                paths = sorted(rng.choice(6, size=3, replace=False).tolist())
                units = [rng.choice(grid, size=5) for _ in paths]
                xs, gs, _w, mism = log_values(st, kp, "c", paths, units)
                assert mism == 0
                with lock:
                    for p, x, g in zip(paths, xs, gs, strict=True):
                        handed.update({(p, xi): gi for xi, gi in zip(x, g, strict=True)})

        run_threads(6, worker, together=False, timeout=60)
        stored = {(p, q.x): q.g for p in range(6) for q in st.iter_points("c", p)}
        assert len(stored) == st.count_points("c") == st.committer.points_logged
        assert stored == handed
        assert st.verify("c").ok
    eng = sa.create_engine(url)
    with eng.connect() as c:
        keys = {
            (a, j): n
            for a, j, n in c.exec_driver_sql(
                "SELECT action, coordinate, COUNT(*) FROM noise_points GROUP BY action, coordinate"
            )
        }
    eng.dispose()
    assert keys == {divmod(p, 3): sum(1 for q, _x in stored if q == p) for p in range(6)}


def test_paths_of_one_state_are_logged_apart(tmp_path: Path) -> None:
    """One state's d coordinates go to d different paths (each with its own value), and the
    same coordinate value in two coordinates is two rows."""
    with open_store(f"sqlite:///{tmp_path / 's.sqlite'}") as st:
        kp = keyed_paths(
            make_release(st, "c", n_actions=1, sigma=1.0, beta=1.0, interval=(0, 1), betas=BETAS)
        )
        u = [0.5]
        xs, gs, written, _m = log_values(st, kp, "c", [0, 1, 2], [u, u, u])
        assert written == 3 and len({float(g[0]) for g in gs}) == 3
        assert [st.count_points("c", p) for p in range(3)] == [1, 1, 1]
        assert [[q.g for q in st.iter_points("c", p)] for p in range(3)] == [g.tolist() for g in gs]
