"""Shared by the store tests: small releases, and the values to log computed from a real key.

The store is the durable log of answered values (``record_paths``); it draws nothing. What a
test logs is what a server would have answered: each path's value at snapped unit states,
from :class:`qveil.keyed.KeyedPaths` under a seeded key (:func:`keyed_paths`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from qveil.keyed import KeyedPaths, seeded_key, snap
from qveil.server.store import ReleaseRecord, SamplePathStore

RID = "rel-1"
SIGMA = 0.7
BETA = 3.0
#: the seed of the key whose values the store tests log
KEY_SEED = 1


def make_release(
    store: SamplePathStore,
    rid: str = RID,
    *,
    n_actions: int = 2,
    sigma: float = SIGMA,
    beta: float = BETA,
    interval: tuple[float, float] = (-1.0, 2.0),
    betas: Sequence[float] | None = None,
    status: str = "staged",
) -> ReleaseRecord:
    """Create release ``rid`` in ``store`` (``betas``: one OU beta per coordinate of a
    d-coordinate release)."""
    return store.releases.create_release(
        release_id=rid,
        fingerprint="f" * 64,
        sigma=sigma,
        beta=beta,
        interval=interval,
        n_actions=n_actions,
        status=status,
        betas=betas,
    )


def keyed_paths(rec: ReleaseRecord, seed: int = KEY_SEED) -> KeyedPaths:
    """The noise paths of the release ``rec`` under ``seeded_key(seed)`` (path p = a d + j)."""
    betas = list(rec.betas) if rec.betas else [rec.beta]
    return KeyedPaths(key=seeded_key(seed), betas=betas, sigma=rec.sigma, n_actions=rec.n_actions)


def path_values(
    paths: KeyedPaths, path: int, units: npt.ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    """(snapped unit states, g_path at them) of the unit states ``units`` (1-D)."""
    idx, xs = snap(np.asarray(units, dtype=np.float64).reshape(-1))
    return xs, paths.path_values(path, idx)


def log_values(
    store: SamplePathStore,
    paths: KeyedPaths,
    rid: str,
    path_ids: Sequence[int],
    units: Sequence[npt.ArrayLike],
) -> tuple[list[np.ndarray], list[np.ndarray], int, int]:
    """Log the keyed values at ``units[k]`` (unit states, snapped here) of path
    ``path_ids[k]`` with ``record_paths``: (states per path, values per path, written,
    mismatched)."""
    xs, gs = [], []
    for p, u in zip(path_ids, units, strict=True):
        x, g = path_values(paths, p, u)
        xs.append(x)
        gs.append(g)
    written, mismatched = store.record_paths(rid, list(path_ids), xs, gs)
    return xs, gs, written, mismatched


def logged(store: SamplePathStore, rid: str, path: int) -> dict[float, float]:
    """The logged values of one path, state -> value (asserting one row per state)."""
    pts = list(store.iter_points(rid, path))
    out = {p.x: p.g for p in pts}
    assert len(out) == len(pts), f"path {path}: a state is logged twice"
    return out
