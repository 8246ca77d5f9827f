"""The batch draw of :mod:`qveil.noise` (:func:`qveil.noise.sample_batch`: new states given
the known points of an OU path; a release's served noise is keyed, :mod:`qveil.keyed`) against
dense GP conditioning, with the neighbours its sorted index (:class:`SortedPoints`; tested
alone in test_pathindex.py) records.

``sample_batch`` is affine in its normals: g = mu + A z. So its exact law is read off without
sampling: mu = g(z = 0) and column k of A = g(e_k) - mu, and the batch's law N(mu, A A^T)
must equal the dense conditional of the new states given the stored ones (docs/privacy.md
section 9). Tolerance 1e-9 (relative to sigma^2 for the covariance). A draw that conditions
each new state on its stored neighbours only (ignoring the batch's earlier states in its gap)
has zero covariance where the truth has ~0.3 sigma^2, and one that uses the paper's swapped
weights misses the mean by O(sigma): both fail by orders of magnitude.
"""

from __future__ import annotations

import numpy as np
import pytest

from qveil.noise import OUSamplePath, ou_covariance, sample_batch
from qveil.pathindex import SortedPoints

BETA, SIGMA = 7.0, 0.6


def _dense(sx: np.ndarray, sg: np.ndarray, nx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance of g(nx) given g(sx) = sg (dense GP conditioning)."""
    if sx.size == 0:
        return np.zeros(nx.size), ou_covariance(nx, beta=BETA, sigma=SIGMA)
    kss = ou_covariance(sx, beta=BETA, sigma=SIGMA)
    kns = ou_covariance(nx, sx, beta=BETA, sigma=SIGMA)
    knn = ou_covariance(nx, beta=BETA, sigma=SIGMA)
    w = np.linalg.solve(kss, kns.T).T
    return w @ sg, knn - w @ kns.T


def _law(sx: np.ndarray, sg: np.ndarray, nx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    idx = SortedPoints()
    idx.add(dict(zip(sx.tolist(), sg.tolist(), strict=True)))
    nb = idx.neighbours(nx)

    def draw(z: np.ndarray) -> np.ndarray:
        return sample_batch(nx, *nb, beta=BETA, sigma=SIGMA, z=z)[0]

    mu = draw(np.zeros(nx.size))
    a = np.stack([draw(e) - mu for e in np.eye(nx.size)], axis=1)
    return mu, a @ a.T


def _case(n_stored: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    sx = np.sort(rng.uniform(0.15, 0.85, size=n_stored))
    sg = OUSamplePath(beta=BETA, sigma=SIGMA, rng=seed).sample(sx) if n_stored else sx
    # lone states (vectorised step), clusters sharing a gap in shuffled order (the loop),
    # and states left and right of every stored point
    lone = (sx[:-1] + sx[1:]) / 2 if n_stored > 1 else np.array([0.5])
    cluster = rng.uniform(0.0, 0.1, size=6).tolist() + rng.uniform(0.9, 1.0, size=5).tolist()
    if n_stored > 3:
        cluster += np.linspace(sx[2], sx[3], 6)[1:-1].tolist()
    nx = np.array(lone.tolist() + cluster)
    nx = np.unique(nx)
    nx = nx[~np.isin(nx, sx)]
    return sx, np.asarray(sg, dtype=np.float64), rng.permutation(nx)


@pytest.mark.parametrize(("n_stored", "seed"), [(0, 1), (1, 2), (12, 3), (40, 4)])
def test_batch_law_is_the_dense_conditional(n_stored: int, seed: int) -> None:
    sx, sg, nx = _case(n_stored, seed)
    mu, cov = _law(sx, sg, nx)
    mu_ref, cov_ref = _dense(sx, sg, nx)
    np.testing.assert_allclose(mu, mu_ref, rtol=0, atol=1e-9 * SIGMA)
    np.testing.assert_allclose(cov, cov_ref, rtol=0, atol=1e-9 * SIGMA**2)


def test_conditioning_only_on_stored_neighbours_fails() -> None:
    """The tolerance has teeth: drawing every state from its stored neighbours alone (each
    as if it were alone in its gap) gets the cluster covariances wrong by ~0.1 sigma^2."""
    sx, sg, nx = _case(12, 3)
    idx = SortedPoints()
    idx.add(dict(zip(sx.tolist(), sg.tolist(), strict=True)))
    lx, lg, rx, rg = idx.neighbours(nx)

    def alone(z: float) -> np.ndarray:
        """Each state drawn from its stored neighbours only, with normal z."""
        return np.stack(
            [
                sample_batch(
                    nx[k : k + 1],
                    lx[k : k + 1],
                    lg[k : k + 1],
                    rx[k : k + 1],
                    rg[k : k + 1],
                    beta=BETA,
                    sigma=SIGMA,
                    z=np.full(1, z),
                )[0]
                for k in range(nx.size)
            ]
        )

    wrong, mu0 = alone(1.0), alone(0.0)
    a = np.diag((wrong - mu0).ravel())
    _, cov_ref = _dense(sx, sg, nx)
    assert np.max(np.abs(a @ a.T - cov_ref)) > 1e-2 * SIGMA**2


def test_recorded_neighbours_are_the_nearest_earlier_points() -> None:
    sx, sg, nx = _case(12, 5)
    idx = SortedPoints()
    idx.add(dict(zip(sx.tolist(), sg.tolist(), strict=True)))
    _, left, right = sample_batch(
        nx, *idx.neighbours(nx), beta=BETA, sigma=SIGMA, z=np.zeros(nx.size)
    )
    for k, v in enumerate(nx.tolist()):
        known = np.concatenate([sx, nx[:k]])
        lo, hi = known[known < v], known[known > v]
        assert left[k] == (lo.max() if lo.size else -np.inf)
        assert right[k] == (hi.min() if hi.size else np.inf)
