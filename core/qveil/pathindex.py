"""The one sorted index of a 1-D sample path's points: exact and neighbour look-ups, one state
at a time.

Used by the online :class:`qveil.noise.OUSamplePath` (:meth:`SortedPoints.around`,
:meth:`SortedPoints.add_one`) and the audit's whitening (:func:`qveil.stats.whiten`,
replaying a path in insertion order).

Layout (a two-level log-structured merge): a large sorted ``main`` pair of float64 arrays,
framed by sentinels (-inf and +inf with value 0.0, so every state in [0, 1] has a left and a
right entry and "no neighbour" is a state at distance inf), and a small sorted ``delta`` pair
of Python lists holding the points added since the last merge (each goes in by bisection,
without a numpy call). When the delta outgrows ``cap`` (4 sqrt(n), at least 4096) it is
merged into ``main`` in one O(n) pass. So an add costs O(log n) plus a list insert and,
amortised, O(n / cap) per point: flat enough from 1e3 to 1e6 stored points.

Pure data structure: nothing here decides or draws anything. Not thread-safe for writers.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right

import numpy as np
import numpy.typing as npt

__all__ = ["SortedPoints"]

FloatArray = npt.NDArray[np.float64]

#: the delta holds up to max(_MIN_CAP, 4 sqrt(n)) points before it is merged into main
_MIN_CAP = 4096
_EMPTY_X = np.array([-np.inf, np.inf])
_EMPTY_G = np.zeros(2)


def _framed(
    xs: list[float] | FloatArray, gs: list[float] | FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Points as framed arrays sorted by x (sentinels -inf and +inf with value 0.0)."""
    x = np.asarray(xs, dtype=np.float64)
    g = np.asarray(gs, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    return np.concatenate(([-np.inf], x[order], [np.inf])), np.concatenate(([0.0], g[order], [0.0]))


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
    """Stored (x, g) of one path in increasing x: neighbour look-ups, O(log n) each."""

    __slots__ = ("_mx", "_mg", "_dx", "_dg", "_dframed", "_n")

    def __init__(self) -> None:
        self._mx, self._mg = _EMPTY_X, _EMPTY_G
        self._dx: list[float] = []  # the delta: sorted states (Python lists: each point goes
        self._dg: list[float] = []  # in by bisection, no numpy call per point)
        #: the delta as framed arrays (None: build on demand)
        self._dframed: tuple[FloatArray, FloatArray] | None = _EMPTY_X, _EMPTY_G
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def add_one(self, x: float, g: float) -> None:
        """Add one point whose state is not stored yet (the caller checks): O(log n) plus a
        list insert into the delta, and an O(n) merge once per ``cap`` points."""
        self._n += 1
        dx, dg = self._dx, self._dg
        self._dframed = None
        j = bisect_left(dx, x)
        dx.insert(j, x)
        dg.insert(j, g)
        if len(dx) > max(_MIN_CAP, 4 * math.isqrt(self._n)):
            self._mx, self._mg = _merge(self._mx, self._mg, *_framed(dx, dg))
            self._dx, self._dg = [], []
            self._dframed = _EMPTY_X, _EMPTY_G

    @classmethod
    def from_sorted(cls, xs: FloatArray, gs: FloatArray) -> SortedPoints:
        """An index of distinct states ``xs`` in increasing order, with values ``gs``."""
        index = cls()
        if xs.size:
            index._mx = np.concatenate(([-np.inf], xs, [np.inf]))
            index._mg = np.concatenate(([0.0], gs, [0.0]))
            index._n = int(xs.size)
        return index

    def find(self, x: float) -> float | None:
        """The value stored at state ``x``, or None."""
        mx = self._mx
        i = int(mx.searchsorted(x))
        if mx.item(i) == x:
            return float(self._mg.item(i))
        dx = self._dx
        if dx:
            j = bisect_left(dx, x)
            if j < len(dx) and dx[j] == x:
                return self._dg[j]
        return None

    def around(self, x: float) -> tuple[float, float, float, float]:
        """(lx, lg, rx, rg): the nearest stored state strictly left of ``x`` and its value,
        and the nearest one strictly right (``x`` itself, if stored, is neither); -inf /
        +inf (value 0.0) where there is none. One state: no array temporaries."""
        mx, mg = self._mx, self._mg
        i = int(mx.searchsorted(x))  # mx[i - 1] < x <= mx[i]
        rx = mx.item(i)
        k = i
        if rx == x:
            k = i + 1
            rx = mx.item(k)
        lx, lg, rg = mx.item(i - 1), mg.item(i - 1), mg.item(k)
        dx = self._dx
        if dx:
            j = bisect_left(dx, x)
            if j > 0 and dx[j - 1] > lx:
                lx, lg = dx[j - 1], self._dg[j - 1]
            j = bisect_right(dx, x)
            if j < len(dx) and dx[j] < rx:
                rx, rg = dx[j], self._dg[j]
        return lx, lg, rx, rg

    def _delta_arrays(self) -> tuple[FloatArray, FloatArray]:
        """The delta as framed arrays (cached until the next one-by-one add)."""
        if self._dframed is None:
            self._dframed = _framed(self._dx, self._dg)
        return self._dframed

    def arrays(self) -> tuple[FloatArray, FloatArray]:
        """All stored (xs, gs) in increasing x (copies; for tests and audits)."""
        mx, mg = _merge(self._mx, self._mg, *self._delta_arrays())
        return mx[1:-1].copy(), mg[1:-1].copy()
