"""The sorted part of the store's in-process copy of one path: neighbour look-ups for a batch.

The copy of a path is a dict x -> g (exact look-ups, the hits) and this index: the stored
states in increasing order with their values, as float64 numpy arrays, so the nearest stored
neighbours of a whole batch of new states are found by two ``searchsorted`` calls instead of
one Python bisection per state (issue 15: the batch path was bound by Python work per state).

Layout (a two-level log-structured merge): a large sorted ``main`` pair of arrays and a small
sorted ``delta`` pair holding the points added since the last merge, each framed by sentinels
(-inf and +inf with value 0.0), so every state in [0, 1] has a left and a right entry in both
and "no neighbour" is a state at distance inf. New points go into ``delta`` (a copy of at
most ``cap`` entries); when it outgrows ``cap`` (4 sqrt(n), at least 4096) it is merged
into ``main`` (one O(n) pass). So a commit of k points costs O(cap + k) and, amortised,
O(n / cap) per point: flat enough from 1e3 to 1e6 stored points, and no per-point Python
object beyond the dict's.

Nothing here decides anything: the store adds only committed points, after the commit.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

__all__ = ["SortedPoints"]

FloatArray = npt.NDArray[np.float64]

#: the delta holds up to max(_MIN_CAP, 4 sqrt(n)) points before it is merged into main
_MIN_CAP = 4096
_EMPTY_X = np.array([-np.inf, np.inf])
_EMPTY_G = np.zeros(2)


def _merge(
    ax: FloatArray, ag: FloatArray, bx: FloatArray, bg: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Sorted union of two framed sorted arrays (``b``'s sentinels are dropped; the states
    of ``b`` are not in ``a``): one O(len(a) + len(b)) pass per array."""
    bx, bg = bx[1:-1], bg[1:-1]
    k = bx.size
    if k == 0:
        return ax, ag
    at = np.searchsorted(ax, bx) + np.arange(k)  # where b's entries land in the union
    keep = np.ones(ax.size + k, dtype=bool)
    keep[at] = False
    ox, og = np.empty(ax.size + k), np.empty(ax.size + k)
    ox[at], og[at] = bx, bg
    ox[keep], og[keep] = ax, ag
    return ox, og


class SortedPoints:
    """Stored (x, g) of one path in increasing x: batch neighbour look-ups, O(log n) each."""

    __slots__ = ("_mx", "_mg", "_dx", "_dg", "_n")

    def __init__(self) -> None:
        self._mx, self._mg = _EMPTY_X, _EMPTY_G
        self._dx, self._dg = _EMPTY_X, _EMPTY_G
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def add(self, xs: FloatArray, gs: FloatArray) -> None:
        """Add points whose states are distinct and not stored yet (the caller checks)."""
        k = int(xs.size)
        if k == 0:
            return
        order = np.argsort(xs, kind="stable")
        nx = np.concatenate(([-np.inf], xs[order], [np.inf]))
        ng = np.concatenate(([0.0], gs[order], [0.0]))
        self._n += k
        dx, dg = _merge(self._dx, self._dg, nx, ng)
        if dx.size - 2 <= max(_MIN_CAP, 4 * math.isqrt(self._n)):
            self._dx, self._dg = dx, dg
            return
        self._mx, self._mg = _merge(self._mx, self._mg, dx, dg)
        self._dx, self._dg = _EMPTY_X, _EMPTY_G

    def neighbours(self, x: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """(lx, lg, rx, rg): the nearest stored state strictly left of each (not stored) state
        of ``x`` and its value, and the nearest one strictly right; -inf / +inf (value 0.0)
        where there is none."""
        mx, mg, dx, dg = self._mx, self._mg, self._dx, self._dg
        i = np.searchsorted(mx, x)  # mx[i - 1] < x < mx[i]: x is not stored
        lx, lg, rx, rg = mx[i - 1], mg[i - 1], mx[i], mg[i]
        if dx.size > 2:
            j = np.searchsorted(dx, x)
            dlx, drx = dx[j - 1], dx[j]
            use = dlx > lx
            lx = np.where(use, dlx, lx)
            lg = np.where(use, dg[j - 1], lg)
            use = drx < rx
            rx = np.where(use, drx, rx)
            rg = np.where(use, dg[j], rg)
        return lx, lg, rx, rg

    def arrays(self) -> tuple[FloatArray, FloatArray]:
        """All stored (xs, gs) in increasing x (copies; for tests and audits)."""
        mx, mg = _merge(self._mx, self._mg, self._dx, self._dg)
        return mx[1:-1].copy(), mg[1:-1].copy()
