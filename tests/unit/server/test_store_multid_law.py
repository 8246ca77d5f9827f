"""The store's paths of a d > 1 release: each follows its own OU law, and
concurrent writers share them as they share a 1-D action's path.

Path a * d + j is a 1-D OU path with sigma and beta_j. Checked statistically against the dense
covariance: over many independent releases, the stored pair (g(0.3), g(0.3 + h)) of each
path has variance sigma^2 and correlation exp(-beta_j h). Fixed seed; tolerances ~5 standard
errors. A store that used one beta for every coordinate (beta_0 = 0.5 for the beta = 8 path)
would show correlation 0.90 instead of 0.20; mixing paths across coordinates (a shared path)
would show correlation 1 between coordinates instead of 0."""

from __future__ import annotations

import math

import numpy as np
from store_helpers import make_release
from thread_helpers import run_threads

from qveil.server.store import open_store

BETAS = [0.5, 8.0]
SIGMA, H, R = 1.5, 0.2, 1500


def test_each_coordinate_path_has_its_own_beta() -> None:
    g = np.empty((R, 2, 2))  # release, coordinate, (x, x + h)
    with open_store("memory://", rng=20261124) as st:
        for r in range(R):
            rid = f"r{r}"
            st.create_release(
                release_id=rid,
                fingerprint="f",
                sigma=SIGMA,
                beta=BETAS[0],
                interval=(0.0, 1.0),
                n_actions=1,
                betas=BETAS,
            )
            out = st.get_or_sample_paths(rid, [0, 1], [[0.3, 0.3 + H], [0.3, 0.3 + H]])
            g[r] = np.array(out)
    var = g.reshape(-1).var()
    assert abs(var / SIGMA**2 - 1) < 5 * math.sqrt(2 / g.size) * 2
    for j, b in enumerate(BETAS):
        rho = np.corrcoef(g[:, j, 0], g[:, j, 1])[0, 1]
        want = math.exp(-b * H)
        assert abs(rho - want) < 5 * (1 - want**2) / math.sqrt(R) + 0.01, (j, rho, want)
    cross = np.corrcoef(g[:, 0, 0], g[:, 1, 0])[0, 1]  # coordinates are independent
    assert abs(cross) < 5 / math.sqrt(R)


def test_concurrent_threads_share_coordinate_points(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Threads storing overlapping coordinate values of a d = 3 release on one SQLite file:
    every (path, x) is stored once, every thread is answered the stored value, the chains
    verify (the 1-D serialisation, per (action, coordinate) path)."""
    import threading

    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    with open_store(url) as st:
        make_release(
            st, "c", n_actions=2, sigma=1.0, beta=1.0, interval=(0.0, 1.0), betas=[1.0, 2.0, 3.0]
        )
        grid = np.round(np.linspace(0, 1, 41), 6)
        answers: list[tuple[int, float, float]] = []
        lock = threading.Lock()

        def worker(k: int) -> None:
            rng = np.random.default_rng(k)
            for _ in range(10):
                paths = sorted(rng.choice(6, size=3, replace=False).tolist())
                xs = [rng.choice(grid, size=5) for _ in paths]
                out = st.get_or_sample_paths("c", paths, xs)
                with lock:
                    for p, x, g in zip(paths, xs, out, strict=True):
                        answers.extend(zip([p] * len(x), x.tolist(), g.tolist(), strict=True))

        run_threads(6, worker, together=False, timeout=60)
        stored = {(p, q.x): q.g for p in range(6) for q in st.iter_points("c", p)}
        assert len(stored) == st.count_points("c")
        for p, x, g in answers:
            assert stored[(p, x)] == g
        assert st.verify("c").ok
