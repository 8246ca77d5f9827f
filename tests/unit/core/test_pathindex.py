"""The sorted neighbour index of a path's known points (:class:`qveil.pathindex.SortedPoints`):
after adds past several merges of the delta into the main arrays, each look-up equals a
brute-force search over all the points added."""

from __future__ import annotations

import numpy as np

from qveil.pathindex import SortedPoints


def test_sorted_points_look_ups_match_brute_force_across_merges() -> None:
    """10000 points added one by one (delta inserts and merges into main): every neighbour
    look-up (of new and of stored states), exact look-up and the arrays equal a brute-force
    search over all points added."""
    rng = np.random.default_rng(9)
    idx = SortedPoints()
    allx: list[float] = []
    allg: list[float] = []
    for n in [1, 2, 50, 3000, 4200, 4300, 10000]:
        while len(allx) < n:
            x, g = float(rng.uniform()), float(rng.normal())
            idx.add_one(x, g)
            allx.append(x)
            allg.append(g)
        o = np.argsort(allx)
        sx, sg = np.asarray(allx)[o], np.asarray(allg)[o]
        for q in rng.uniform(size=50).tolist() + allx[-5:]:
            lo, hi = sx < q, sx > q
            want = (
                float(sx[lo].max()) if lo.any() else -np.inf,
                float(sg[lo][-1]) if lo.any() else 0.0,
                float(sx[hi].min()) if hi.any() else np.inf,
                float(sg[hi][0]) if hi.any() else 0.0,
            )
            assert idx.around(q) == want
        assert idx.find(allx[0]) == allg[0] and idx.find(2.0) is None
        assert len(idx) == len(allx)
        px, pg = idx.arrays()
        np.testing.assert_array_equal(px, sx)
        np.testing.assert_array_equal(pg, sg)


def test_from_sorted_holds_the_given_points() -> None:
    xs, gs = np.array([0.1, 0.4, 0.7]), np.array([1.0, -2.0, 3.0])
    idx = SortedPoints.from_sorted(xs, gs)
    assert len(idx) == 3 and idx.find(0.4) == -2.0
    assert idx.around(0.5) == (0.4, -2.0, 0.7, 3.0)
    idx.add_one(0.5, 9.0)
    assert idx.around(0.45) == (0.4, -2.0, 0.5, 9.0)
