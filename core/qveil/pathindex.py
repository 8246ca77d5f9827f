"""The one sorted index of a 1-D sample path's points: exact and neighbour look-ups, one state
at a time or for a whole batch.

Used by every holder of a path: the store's in-process copy of each path (beside a dict
x -> g for the hits; a batch's neighbours come from two ``searchsorted`` calls instead of
one Python bisection per state), the online :class:`qveil.noise.OUSamplePath` (one state at
a time: :meth:`SortedPoints.around`, :meth:`SortedPoints.add_one`) and the audit's whitening
(:func:`qveil.stats.whiten`, replaying a path in insertion order).

Layout (a two-level log-structured merge): a large sorted ``main`` pair of float64 arrays,
framed by sentinels (-inf and +inf with value 0.0, so every state in [0, 1] has a left and a
right entry and "no neighbour" is a state at distance inf), and a small sorted ``delta`` pair
of Python lists holding the points added since the last merge (the few points of a one-state
commit go in by bisection, without a numpy call; a batch is merged in with numpy). When the
delta outgrows ``cap`` (4 sqrt(n), at least 4096) it is merged into ``main`` in one O(n)
pass. So a commit of k points costs O(cap + k) and, amortised, O(n / cap) per point: flat
enough from 1e3 to 1e6 stored points, with no Python object per point beyond the dict's
(the delta's lists point at the dict's own floats).

Pure data structure: nothing here decides or draws anything (the store adds only committed
points, after the commit). Not thread-safe for writers; the store mutates an index only under
the path's lock.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right

import numpy as np
import numpy.typing as npt

__all__ = ["SortedPoints"]

FloatArray = npt.NDArray[np.float64]

#: look-ups of at most this many states go one by one
_FEW = 16
#: adds of at most this many points go into the delta one by one (bisection, list insert)
_FEW_ADD = 128
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
    """Stored (x, g) of one path in increasing x: batch neighbour look-ups, O(log n) each."""

    __slots__ = ("_mx", "_mg", "_dx", "_dg", "_dframed", "_n")

    def __init__(self) -> None:
        self._mx, self._mg = _EMPTY_X, _EMPTY_G
        self._dx: list[float] = []  # the delta: sorted states (Python lists: a few points per
        self._dg: list[float] = []  # commit go in by bisection, no numpy call per commit)
        #: the delta as framed arrays, kept from the last batch merge (None: build on demand)
        self._dframed: tuple[FloatArray, FloatArray] | None = _EMPTY_X, _EMPTY_G
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def add(self, points: dict[float, float]) -> None:
        """Add points x -> g whose states are not stored yet (the caller checks)."""
        k = len(points)
        if k == 0:
            return
        self._n += k
        dx, dg = self._dx, self._dg
        if k <= _FEW_ADD:
            self._dframed = None
            for x, g in points.items():
                j = bisect_left(dx, x)
                dx.insert(j, x)
                dg.insert(j, g)
            if len(dx) <= max(_MIN_CAP, 4 * math.isqrt(self._n)):
                return
            points = {}
        bx, bg = _framed(
            np.fromiter(points.keys(), np.float64, len(points)),
            np.fromiter(points.values(), np.float64, len(points)),
        )
        if self._n == k:  # the first load: the points are the whole index
            self._mx, self._mg = bx, bg
            self._dframed = _EMPTY_X, _EMPTY_G
            return
        ux, ug = _merge(*self._delta_arrays(), bx, bg)
        if ux.size - 2 <= max(_MIN_CAP, 4 * math.isqrt(self._n)):
            self._dx, self._dg = ux[1:-1].tolist(), ug[1:-1].tolist()
            self._dframed = ux, ug
            return
        self._mx, self._mg = _merge(self._mx, self._mg, ux, ug)
        self._dx, self._dg = [], []
        self._dframed = _EMPTY_X, _EMPTY_G

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

    def neighbours(self, x: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """(lx, lg, rx, rg): the nearest stored state strictly left of each (not stored) state
        of ``x`` and its value, and the nearest one strictly right; -inf / +inf (value 0.0)
        where there is none."""
        if x.size <= _FEW:
            return self._neighbours_few(x.tolist())
        mx, mg = self._mx, self._mg
        i = np.searchsorted(mx, x)  # mx[i - 1] < x < mx[i]: x is not stored
        lx, lg, rx, rg = mx[i - 1], mg[i - 1], mx[i], mg[i]
        if self._dx:
            dx, dg = self._delta_arrays()
            j = np.searchsorted(dx, x)
            dlx, drx = dx[j - 1], dx[j]
            use = dlx > lx
            lx = np.where(use, dlx, lx)
            lg = np.where(use, dg[j - 1], lg)
            use = drx < rx
            rx = np.where(use, drx, rx)
            rg = np.where(use, dg[j], rg)
        return lx, lg, rx, rg

    def _neighbours_few(
        self, xs: list[float]
    ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """:meth:`neighbours` for a few states, one scalar look-up each (no array temporaries)."""
        mx, mg, dx, dg = self._mx, self._mg, self._dx, self._dg
        nd = len(dx)
        out: list[list[float]] = [[], [], [], []]
        for x in xs:
            # bisect, not mx.searchsorted: numpy's releases the interpreter lock on some
            # arrays, and a caller on a busy server then waits to get it back
            i = bisect_left(mx, x)
            lx, lg, rx, rg = float(mx[i - 1]), float(mg[i - 1]), float(mx[i]), float(mg[i])
            if nd:
                j = bisect_left(dx, x)
                if j > 0 and dx[j - 1] > lx:
                    lx, lg = dx[j - 1], dg[j - 1]
                if j < nd and dx[j] < rx:
                    rx, rg = dx[j], dg[j]
            out[0].append(lx)
            out[1].append(lg)
            out[2].append(rx)
            out[3].append(rg)
        return (
            np.array(out[0]),
            np.array(out[1]),
            np.array(out[2]),
            np.array(out[3]),
        )

    def arrays(self) -> tuple[FloatArray, FloatArray]:
        """All stored (xs, gs) in increasing x (copies; for tests and audits)."""
        mx, mg = _merge(self._mx, self._mg, *self._delta_arrays())
        return mx[1:-1].copy(), mg[1:-1].copy()
