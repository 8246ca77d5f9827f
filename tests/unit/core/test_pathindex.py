"""The sorted neighbour index of a path's known points (:class:`qveil.pathindex.SortedPoints`):
after adds of every size (delta inserts and merges into the main arrays) each neighbour query
equals a brute-force search over all the points added."""

from __future__ import annotations

import numpy as np

from qveil.pathindex import SortedPoints


def test_sorted_points_neighbours_match_brute_force_across_merges() -> None:
    """Adds of 1, 50 and 3000 points (delta inserts and merges into main) keep every
    neighbour query equal to a brute-force search over all points added."""
    rng = np.random.default_rng(9)
    idx = SortedPoints()
    allx = np.empty(0)
    allg = np.empty(0)
    for k in [1, 1, 50, 3000, 1, 700, 50, 2000, 1]:
        xs = rng.uniform(size=k)
        gs = rng.normal(size=k)
        idx.add(dict(zip(xs.tolist(), gs.tolist(), strict=True)))
        allx, allg = np.concatenate([allx, xs]), np.concatenate([allg, gs])
        q = rng.uniform(size=200)
        lx, lg, rx, rg = idx.neighbours(q)
        o = np.argsort(allx)
        sx, sg = allx[o], allg[o]
        i = np.searchsorted(sx, q)
        has_l, has_r = i > 0, i < sx.size
        np.testing.assert_array_equal(lx, np.where(has_l, sx[np.maximum(i - 1, 0)], -np.inf))
        np.testing.assert_array_equal(lg, np.where(has_l, sg[np.maximum(i - 1, 0)], 0.0))
        np.testing.assert_array_equal(rx, np.where(has_r, sx[np.minimum(i, sx.size - 1)], np.inf))
        np.testing.assert_array_equal(rg, np.where(has_r, sg[np.minimum(i, sx.size - 1)], 0.0))
        assert len(idx) == allx.size
        px, pg = idx.arrays()
        np.testing.assert_array_equal(px, sx)
        np.testing.assert_array_equal(pg, sg)
