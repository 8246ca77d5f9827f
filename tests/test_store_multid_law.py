"""The store's paths of a d > 1 release follow their own OU law (issue 16 part 2): path
a * d + j is a 1-D OU path with sigma and beta_j. Checked statistically against the dense
covariance: over many independent releases, the stored pair (g(0.3), g(0.3 + h)) of each
path has variance sigma^2 and correlation exp(-beta_j h). Fixed seed; tolerances ~5 standard
errors. A store that used one beta for every coordinate (beta_0 = 0.5 for the beta = 8 path)
would show correlation 0.90 instead of 0.20; mixing paths across coordinates (a shared path)
would show correlation 1 between coordinates instead of 0."""

from __future__ import annotations

import math

import numpy as np

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
