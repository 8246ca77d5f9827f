"""The functional noise of Wang & Hegde (2019): an exact, lazily evaluated GP sample path.

The mechanism adds to each action's Q-function a sample path g ~ GP(0, sigma^2 K) with
K(x, y) = exp(-beta |x - y|) on [0, 1] (the paper's Section 3). That kernel is the covariance
of a stationary Ornstein-Uhlenbeck process, which is Markov: given any set of stored values,
a new point depends only on its nearest stored neighbour on each side. So a path can be
evaluated at any state, in any order, one point at a time, *exactly*, in O(log n), and a
server can answer unboundedly many queries from one path.

The conditionals (docs/privacy.md section 9; the paper's Appendix A,
equation (2), is wrong: its mean weights are swapped and its variance can go negative):

* no stored point:             N(0, sigma^2)
* one neighbour at distance d: N(rho g_n, sigma^2 (1 - rho^2)),           rho = exp(-beta d)
* bridge, d1 left and d2 right, a = exp(-beta d1), b = exp(-beta d2):
      mean = [a (1 - b^2) g_l + b (1 - a^2) g_r] / (1 - a^2 b^2)
      var  = sigma^2 (1 - a^2)(1 - b^2) / (1 - a^2 b^2)

Every ``1 - exp(-2 beta d)`` is computed as ``-expm1(-2 beta d)``, so the formulas keep full
relative precision from beta d = 1e-12 (where 1 - rho^2 ~ 2e-12) to beta d = 1e5 (where the
neighbour is irrelevant and the weights underflow cleanly to 0); no sinh or cosh appears.

This module is pure: no I/O, no global RNG. The trainer's Algorithm 1 (its training noise),
``qveil noise``, the experiments and the audit's whitening (:mod:`qveil.stats`) use it; a
release's served noise is the keyed construction of :mod:`qveil.keyed`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from qveil.errors import InvalidArgument
from qveil.pathindex import SortedPoints
from qveil.rng import NormalSource, resolve_rng

__all__ = [
    "OUSamplePath",
    "StateInterval",
    "conditional_moments",
    "ou_covariance",
    "validate_points",
    "validate_unit_states",
]

FloatArray = npt.NDArray[np.float64]
#: What :func:`ou_bridge` computes on: floats (with math's exp/expm1) or float64 arrays (with
#: numpy's), elementwise by the same formula.
V = TypeVar("V", float, FloatArray)

#: Calls with at most this many values take a pure-Python path (no np.unique etc.): below
#: it, numpy's fixed cost per call, not the arithmetic, is what they pay. The serving path
#: uses the same bound.
FEW = 16


def _check_positive(name: str, value: float) -> float:
    v = float(value)
    if not math.isfinite(v) or v <= 0:
        raise InvalidArgument(f"{name} must be a finite number > 0, got {value!r}")
    return v


def _check_sigma(value: float) -> float:
    s = float(value)
    if not math.isfinite(s) or s < 0:
        raise InvalidArgument(f"sigma must be a finite number >= 0, got {value!r}")
    return s


def ou_covariance(
    xs: npt.ArrayLike, ys: npt.ArrayLike | None = None, *, beta: float, sigma: float
) -> FloatArray:
    """Dense covariance sigma^2 exp(-beta |x - y|) (the paper's kernel), for tests and audits."""
    x = np.asarray(xs, dtype=np.float64).reshape(-1)
    y = x if ys is None else np.asarray(ys, dtype=np.float64).reshape(-1)
    cov: FloatArray = float(sigma) ** 2 * np.exp(-float(beta) * np.abs(x[:, None] - y[None, :]))
    return cov


def ou_bridge(
    beta: float,
    s2: float,
    d1: V,
    g1: V,
    d2: V,
    g2: V,
    exp: Callable[[V], V],
    expm1: Callable[[V], V],
) -> tuple[V, V]:
    """The OU conditional, the one place its formula is written: (mean, variance) of g(x)
    given its nearest stored neighbour at distance ``d1`` on the left with value ``g1`` and
    at ``d2`` on the right with value ``g2``, for the kernel s2 exp(-beta |x - y|). With
    a = exp(-beta d1) and b = exp(-beta d2):

        mean = [a (1 - b^2) g1 + b (1 - a^2) g2] / (1 - a^2 b^2)
        var  = s2 (1 - a^2)(1 - b^2) / (1 - a^2 b^2)

    A missing side is a neighbour at distance inf with value 0.0: its weight exp(-inf) is
    0 and 1 - exp(-inf) is 1, so the bridge reduces exactly to the one-sided law
    N(b g2, s2 (1 - b^2)) and, with no neighbour, to N(0, s2). Elementwise: ``exp`` and
    ``expm1`` are :mod:`math`'s for floats or numpy's for arrays; the operations and their
    order are the same either way. Unchecked and positional: the samplers' hot path."""
    a = exp(-beta * d1)
    b = exp(-beta * d2)
    w1 = -expm1(-2.0 * beta * d1)  # 1 - a^2
    w2 = -expm1(-2.0 * beta * d2)  # 1 - b^2
    w12 = -expm1(-2.0 * beta * (d1 + d2))  # 1 - a^2 b^2
    return (a * w2 * g1 + b * w1 * g2) / w12, s2 * w1 * (w2 / w12)


def _moments(
    beta: float, s2: float, dl: float | None, gl: float, dr: float | None, gr: float
) -> tuple[float, float]:
    """The exact OU conditional (mean, std) given neighbours at ``dl``, ``dr`` (None: none)."""
    mean, var = ou_bridge(
        beta,
        s2,
        math.inf if dl is None else dl,
        0.0 if dl is None else gl,
        math.inf if dr is None else dr,
        0.0 if dr is None else gr,
        math.exp,
        math.expm1,
    )
    return mean, math.sqrt(var)


def conditional_moments(
    *,
    beta: float,
    sigma: float,
    d_left: float | None,
    g_left: float | None,
    d_right: float | None,
    g_right: float | None,
) -> tuple[float, float]:
    """Mean and standard deviation of g(x) given its nearest stored neighbours.

    ``d_left``/``g_left`` describe the nearest stored point left of x (distance >= 0 and its
    value), ``d_right``/``g_right`` the nearest one to the right; pass ``None`` for both
    values of a side with no stored point. Exact for the OU kernel (docs/privacy.md
    section 9, *not* the paper's equation (2)); by the Markov property no other stored point
    matters. ``1 - exp(-2 beta d)`` is always ``-expm1(-2 beta d)``, so the result keeps full
    relative precision for beta * d from 1e-12 to 1e5 and beyond (a side at distance
    ``inf`` is the same as no neighbour on that side).
    """
    b = _check_positive("beta", beta)
    s = _check_sigma(sigma)
    sides: list[tuple[float | None, float]] = []
    for name, d, g in (("left", d_left, g_left), ("right", d_right, g_right)):
        if (d is None) != (g is None):
            raise InvalidArgument(f"d_{name} and g_{name} must both be given or both be None")
        if d is None or g is None:
            sides.append((None, 0.0))
            continue
        dd, gg = float(d), float(g)
        if math.isnan(dd) or dd < 0:
            raise InvalidArgument(f"d_{name} must be a distance >= 0, got {d!r}")
        if not math.isfinite(gg):
            raise InvalidArgument(f"g_{name} must be finite, got {g!r}")
        sides.append((dd, gg))
    (dl, gl), (dr, gr) = sides
    if dl == 0.0 and dr == 0.0:
        raise InvalidArgument("a point cannot be at distance 0 from both neighbours")
    return _moments(b, s * s, dl, gl, dr, gr)


def validate_unit_states(xs: npt.ArrayLike) -> FloatArray:
    """Return ``xs`` as a 1-D float64 array on [0, 1], or raise :class:`InvalidArgument`.

    Accepts real numbers only (no strings, booleans, complex or objects), a scalar as a
    length-1 array. Negative zero is folded into +0.0 so that 0.0 and -0.0 are one state.
    """
    if type(xs) is float or type(xs) is int:  # one query state: skip numpy's overhead
        xs = [xs]
    elif type(xs) is np.ndarray and xs.dtype == np.float64 and xs.ndim == 1 and xs.size <= FEW:
        xs = xs.tolist()  # a few states: checked as Python floats (same verdicts, same bits)
    if (
        isinstance(xs, list)
        and len(xs) <= FEW
        and all(type(v) is float or type(v) is int for v in xs)
    ):
        try:
            vals = [float(v) + 0.0 for v in xs]
        except OverflowError:
            raise InvalidArgument("states must be finite numbers in [0, 1]") from None
        for i, v in enumerate(vals):
            if not 0.0 <= v <= 1.0:  # also catches NaN
                raise InvalidArgument(f"state {v!r} at index {i} is not a finite number in [0, 1]")
        return np.array(vals, dtype=np.float64)
    try:
        raw = np.asarray(xs)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"states must be numbers: {exc}") from None
    if raw.dtype.kind not in "iuf" and not (raw.dtype.kind == "O" and raw.size == 0):
        raise InvalidArgument(f"states must be real numbers, got dtype {raw.dtype}")
    arr = raw.astype(np.float64, copy=False)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise InvalidArgument(f"states must be a 1-D array, got shape {arr.shape}")
    bad = ~np.isfinite(arr) | (arr < 0.0) | (arr > 1.0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidArgument(f"state {arr[i]!r} at index {i} is not a finite number in [0, 1]")
    out: FloatArray = arr + 0.0
    return out


def validate_points(xs: npt.ArrayLike, gs: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
    """Stored points as two 1-D float64 arrays of one shape: states on [0, 1] (see
    :func:`validate_unit_states`) and finite noise values; else :class:`InvalidArgument`."""
    x = validate_unit_states(xs)
    try:
        g = np.asarray(gs, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"noise values must be numbers: {exc}") from None
    if g.ndim == 0:
        g = g.reshape(1)
    if g.shape != x.shape:
        raise InvalidArgument(f"states have shape {x.shape} but values {g.shape}")
    if not np.isfinite(g).all():
        raise InvalidArgument("noise values must be finite")
    return x, g


class OUSamplePath:
    """One exact GP sample path g ~ GP(0, sigma^2 exp(-beta|x - y|)) on [0, 1], grown lazily.

    ``sample(xs)`` returns the stored value for every known state and draws each new state
    from its exact conditional given its nearest stored neighbours, storing it before moving
    on; so a batch, or any sequence of batches in any order, has the GP's joint law. Each new
    point costs O(log n) amortised: the stored points live in
    :class:`qveil.pathindex.SortedPoints` (the one sorted index of a path, shared with the
    audit's whitening).

    ``rng``: ``None`` (the default) draws from OS entropy; a seeded
    ``numpy.random.Generator`` or an int seed is for tests and experiments only. (A release's
    noise is not drawn here: it is a function of the release's key, :mod:`qveil.keyed`; this
    path serves Algorithm 1's training noise, ``qveil noise`` and the experiments.)

    Not thread-safe: concurrent callers of one path must serialize. With a seeded source the
    values do not depend on how the states are split into calls, since new states are always
    drawn in first-occurrence order.
    """

    __slots__ = ("_beta", "_sigma", "_rng", "_index")

    def __init__(self, *, beta: float, sigma: float, rng: NormalSource | int | None = None) -> None:
        self._beta = _check_positive("beta", beta)
        self._sigma = _check_sigma(sigma)
        self._rng = resolve_rng(rng)
        self._index = SortedPoints()

    @classmethod
    def from_points(
        cls,
        xs: npt.ArrayLike,
        gs: npt.ArrayLike,
        *,
        beta: float,
        sigma: float,
        rng: NormalSource | int | None = None,
    ) -> OUSamplePath:
        """Rebuild a path from its points (e.g. from :meth:`points`)."""
        path = cls(beta=beta, sigma=sigma, rng=rng)
        path.add_points(xs, gs)
        return path

    @property
    def beta(self) -> float:
        return self._beta

    @property
    def sigma(self) -> float:
        return self._sigma

    @property
    def rng(self) -> NormalSource:
        return self._rng

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, x: object) -> bool:
        if isinstance(x, bool) or not isinstance(x, float | int | np.integer | np.floating):
            return False
        return self._index.find(float(x) + 0.0) is not None

    def __repr__(self) -> str:
        return f"OUSamplePath(beta={self._beta!r}, sigma={self._sigma!r}, points={len(self)})"

    # -- public API ------------------------------------------------------------------------

    def add_points(self, xs: npt.ArrayLike, gs: npt.ArrayLike) -> None:
        """Insert already-drawn points (restoring a path). A known state must keep its value.

        All or nothing: on any error (bad state, non-finite value, a state given two values)
        :class:`InvalidArgument` is raised and the path is unchanged.
        """
        x, g = validate_points(xs, gs)
        if x.size == 0:
            return
        old_x, old_g = self.points()
        all_x = np.concatenate([old_x, x])
        all_g = np.concatenate([old_g, g])
        order = np.argsort(all_x, kind="stable")
        sx, sg = all_x[order], all_g[order]
        same = sx[1:] == sx[:-1]
        clash = same & (sg[1:] != sg[:-1])
        if clash.any():
            k = int(np.flatnonzero(clash)[0])
            raise InvalidArgument(
                f"state {sx[k]!r} is given two values, {sg[k]!r} and {sg[k + 1]!r}"
            )
        keep = np.concatenate([[True], ~same])
        self._index = SortedPoints.from_sorted(sx[keep], sg[keep])

    def neighbours(self, x: float) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
        """The nearest stored (x, g) strictly left and strictly right of ``x`` (or None)."""
        xf = float(validate_unit_states(x)[0])
        lx, lg, rx, rg = self._index.around(xf)
        return (None if lx == -math.inf else (lx, lg)), (None if rx == math.inf else (rx, rg))

    def conditional(self, x: float) -> tuple[float, float]:
        """Mean and standard deviation of a new point at ``x`` given everything stored.

        For a stored ``x`` this is the law of a *new* draw given its neighbours, not the
        stored value (which :meth:`sample` returns).
        """
        xf = float(validate_unit_states(x)[0])
        lx, lg, rx, rg = self._index.around(xf)
        mean, var = ou_bridge(
            self._beta, self._sigma * self._sigma, xf - lx, lg, rx - xf, rg, math.exp, math.expm1
        )
        return mean, math.sqrt(var)

    def sample(self, xs: npt.ArrayLike) -> FloatArray:
        """g at each state of ``xs`` (1-D, in [0, 1]): stored values, new ones drawn exactly.

        New states are drawn in the order they first appear, each conditioned on all points
        stored so far (so the batch has the exact joint law); duplicates within the call get
        one value. Bad input raises :class:`InvalidArgument` before anything is stored.
        """
        x = validate_unit_states(xs)
        if x.size <= FEW:  # a query's few states: plain Python is several times faster
            xl: list[float] = x.tolist()
            get = self._index.find
            found: dict[float, float] = {}
            todo: list[float] = []
            for xi in dict.fromkeys(xl):
                g = get(xi)
                if g is None:
                    todo.append(xi)
                else:
                    found[xi] = g
            if todo:
                found.update(zip(todo, self._draw_all(todo, self._normals(len(todo))), strict=True))
            return np.array([found[xi] for xi in xl], dtype=np.float64)
        ux, first, inverse = np.unique(x, return_index=True, return_inverse=True)
        values = np.zeros(ux.size, dtype=np.float64)
        known = np.zeros(ux.size, dtype=bool)
        if 8 * ux.size >= len(self):  # a big batch: look all up at once in O(n + m log n)
            px, pg = self.points()
            if px.size:
                pos = np.minimum(np.searchsorted(px, ux), px.size - 1)
                known = px[pos] == ux
                values[known] = pg[pos[known]]
        else:  # a few states on a big path: O(log n) each
            get = self._index.find
            for k, u in enumerate(ux.tolist()):
                g = get(u)
                if g is not None:
                    known[k] = True
                    values[k] = g
        new = np.flatnonzero(~known)
        if new.size:
            new = new[np.argsort(first[new], kind="stable")]  # first-occurrence order
            values[new] = self._draw_all(ux[new].tolist(), self._normals(new.size))
        out: FloatArray = values[inverse.reshape(-1)]
        return out

    def sample_one(self, x: float) -> float:
        """g at one state ``x`` in [0, 1]: the fast path for callers that act on one state at
        a time (Algorithm 1 needs g_a(s_t) before it acts at s_t). Same law as ``sample``."""
        if isinstance(x, bool) or not isinstance(x, float | int | np.floating | np.integer):
            raise InvalidArgument(f"state must be a number, got {x!r}")
        try:
            xf = float(x) + 0.0
        except OverflowError:
            raise InvalidArgument(f"state {x!r} is not a finite number in [0, 1]") from None
        if not 0.0 <= xf <= 1.0:  # also refuses NaN
            raise InvalidArgument(f"state {x!r} is not a finite number in [0, 1]")
        g = self._index.find(xf)
        if g is None:
            g = self._draw_all([xf], self._normals(1))[0]
        return g

    def _normals(self, k: int) -> list[float]:
        """``k`` standard normals from the path's source, checked."""
        if k == 1:
            z1 = float(self._rng.standard_normal())
            if not math.isfinite(z1):
                raise InvalidArgument("the normal source returned a bad draw")
            return [z1]
        z = np.asarray(self._rng.standard_normal(k), dtype=np.float64).reshape(-1)
        if z.size != k or not np.isfinite(z).all():
            raise InvalidArgument("the normal source returned a bad draw")
        out: list[float] = z.tolist()
        return out

    def _draw_all(self, new: list[float], z: list[float]) -> list[float]:
        """Draw and store the distinct, not yet stored states ``new`` using normals ``z``, one
        after another, each from :func:`ou_bridge` given its nearest stored neighbours (a
        missing side is a neighbour at distance inf with value 0.0)."""
        beta, s2 = self._beta, self._sigma * self._sigma
        exp, expm1, sqrt, bridge = math.exp, math.expm1, math.sqrt, ou_bridge
        around, add = self._index.around, self._index.add_one
        out: list[float] = []
        for x, zi in zip(new, z, strict=True):
            lx, lg, rx, rg = around(x)
            mean, var = bridge(beta, s2, x - lx, lg, rx - x, rg, exp, expm1)
            g = mean + sqrt(var) * zi
            add(x, g)
            out.append(g)
        return out

    def points(self) -> tuple[FloatArray, FloatArray]:
        """The stored (xs, gs), in increasing state order (copies)."""
        return self._index.arrays()

    def max_abs(self) -> float:
        """max |g| over the stored points (0.0 for an empty path)."""
        gs = self.points()[1]
        return float(np.max(np.abs(gs))) if gs.size else 0.0


@dataclass(frozen=True, slots=True)
class StateInterval:
    """A bounded state interval [lo, hi], mapped affinely onto the noise domain [0, 1].

    beta is defined on [0, 1] (docs/privacy.md section 9), so every state is mapped
    before it reaches a sample path; values outside [lo, hi], NaN and infinities are refused.
    """

    lo: float
    hi: float

    def __post_init__(self) -> None:
        lo, hi = float(self.lo), float(self.hi)
        if not (math.isfinite(lo) and math.isfinite(hi)) or not lo < hi:
            raise InvalidArgument(
                f"state interval needs finite lo < hi, got [{self.lo!r}, {self.hi!r}]"
            )
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)

    @property
    def width(self) -> float:
        return self.hi - self.lo

    def to_unit(self, states: npt.ArrayLike) -> FloatArray:
        """Map states in [lo, hi] to [0, 1]; raise :class:`InvalidArgument` outside it."""
        try:
            s = np.asarray(states, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"states must be numbers: {exc}") from None
        if s.ndim == 0:
            s = s.reshape(1)
        if s.ndim != 1:
            raise InvalidArgument(f"states must be a 1-D array, got shape {s.shape}")
        bad = ~np.isfinite(s) | (s < self.lo) | (s > self.hi)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InvalidArgument(
                f"state {s[i]!r} at index {i} is outside the state interval "
                f"[{self.lo!r}, {self.hi!r}]"
            )
        return np.clip((s - self.lo) / self.width, 0.0, 1.0) + 0.0

    def from_unit(self, xs: npt.ArrayLike) -> FloatArray:
        """Map noise-domain points in [0, 1] back to states."""
        return self.lo + np.asarray(xs, dtype=np.float64) * self.width
