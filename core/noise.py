"""The functional noise of Wang & Hegde (2019): an exact, lazily evaluated GP sample path.

The mechanism adds to each action's Q-function a sample path g ~ GP(0, sigma^2 K) with
K(x, y) = exp(-beta |x - y|) on [0, 1] (the paper's Section 3). That kernel is the covariance
of a stationary Ornstein-Uhlenbeck process, which is Markov: given any set of stored values,
a new point depends only on its nearest stored neighbour on each side. So a path can be
evaluated at any state, in any order, one point at a time, *exactly*, in O(log n), and a
server can answer unboundedly many queries from one path.

The conditionals (``../shared/NOTES-privacy.md`` section 1; the paper's Appendix A,
equation (2), is wrong: its mean weights are swapped and its variance can go negative):

* no stored point:             N(0, sigma^2)
* one neighbour at distance d: N(rho g_n, sigma^2 (1 - rho^2)),           rho = exp(-beta d)
* bridge, d1 left and d2 right, a = exp(-beta d1), b = exp(-beta d2):
      mean = [a (1 - b^2) g_l + b (1 - a^2) g_r] / (1 - a^2 b^2)
      var  = sigma^2 (1 - a^2)(1 - b^2) / (1 - a^2 b^2)

Every ``1 - exp(-2 beta d)`` is computed as ``-expm1(-2 beta d)``, so the formulas keep full
relative precision from beta d = 1e-12 (where 1 - rho^2 ~ 2e-12) to beta d = 1e5 (where the
neighbour is irrelevant and the weights underflow cleanly to 0); no sinh or cosh appears.

This module is pure: no I/O, no global RNG. The store and the trainer both use it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from sortedcontainers import SortedList

from qveil.errors import InvalidArgument
from qveil.rng import NormalSource, resolve_rng

__all__ = [
    "OUSamplePath",
    "StateInterval",
    "conditional_moments",
    "ou_covariance",
    "validate_unit_states",
]

FloatArray = npt.NDArray[np.float64]


def _check_positive(name: str, value: float) -> float:
    v = float(value)
    if not math.isfinite(v) or v <= 0:
        raise InvalidArgument(f"{name} must be a finite number > 0, got {value!r}")
    return v


def ou_covariance(xs: npt.ArrayLike, ys: npt.ArrayLike | None = None, *, beta: float,
                  sigma: float) -> FloatArray:
    """Dense covariance sigma^2 exp(-beta |x - y|) (the paper's kernel), for tests and audits."""
    x = np.asarray(xs, dtype=np.float64)
    y = x if ys is None else np.asarray(ys, dtype=np.float64)
    return float(sigma) ** 2 * np.exp(-float(beta) * np.abs(x[:, None] - y[None, :]))


def conditional_moments(*, beta: float, sigma: float,
                        d_left: float | None, g_left: float | None,
                        d_right: float | None, g_right: float | None) -> tuple[float, float]:
    """Mean and standard deviation of g(x) given its nearest stored neighbours.

    ``d_left``/``g_left`` describe the nearest stored point left of x (distance > 0 and its
    value), ``d_right``/``g_right`` the nearest one to the right; pass ``None`` for a side with
    no stored point. Exact for the OU kernel (see the module docstring); by the Markov
    property no other stored point matters.
    """
    s2 = sigma * sigma
    if d_left is None and d_right is None:
        return 0.0, sigma
    if d_right is None or g_right is None:
        assert d_left is not None and g_left is not None
        one_minus_rho2 = -math.expm1(-2.0 * beta * d_left)
        return math.exp(-beta * d_left) * g_left, math.sqrt(s2 * one_minus_rho2)
    if d_left is None or g_left is None:
        one_minus_rho2 = -math.expm1(-2.0 * beta * d_right)
        return math.exp(-beta * d_right) * g_right, math.sqrt(s2 * one_minus_rho2)
    a = math.exp(-beta * d_left)
    b = math.exp(-beta * d_right)
    one_m_a2 = -math.expm1(-2.0 * beta * d_left)
    one_m_b2 = -math.expm1(-2.0 * beta * d_right)
    one_m_a2b2 = -math.expm1(-2.0 * beta * (d_left + d_right))
    mean = (a * one_m_b2 * g_left + b * one_m_a2 * g_right) / one_m_a2b2
    var = s2 * one_m_a2 * one_m_b2 / one_m_a2b2
    return mean, math.sqrt(var)


def validate_unit_states(xs: npt.ArrayLike) -> FloatArray:
    """Return ``xs`` as a 1-D float64 array on [0, 1], or raise :class:`InvalidArgument`.

    Negative zero is folded into +0.0 so that 0.0 and -0.0 are one state.
    """
    try:
        arr = np.asarray(xs, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"states must be numbers: {exc}") from None
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise InvalidArgument(f"states must be a 1-D array, got shape {arr.shape}")
    bad = ~np.isfinite(arr) | (arr < 0.0) | (arr > 1.0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidArgument(f"state {arr[i]!r} at index {i} is not a finite number in [0, 1]")
    return arr + 0.0


class OUSamplePath:
    """One exact GP sample path g ~ GP(0, sigma^2 exp(-beta|x - y|)) on [0, 1], grown lazily.

    ``sample(xs)`` returns the stored value for every known state and draws each new state
    from its exact conditional given its nearest stored neighbours, storing it before moving
    on; so a batch, or any sequence of batches in any order, has the GP's joint law. Each new
    point costs O(log n) (a sorted index of the stored states).

    ``rng``: ``None`` (the default, for releases) draws from OS entropy; a seeded
    ``numpy.random.Generator`` or an int seed is for tests and experiments only.
    """

    __slots__ = ("_beta", "_sigma", "_rng", "_xs", "_gs")

    def __init__(self, *, beta: float, sigma: float,
                 rng: NormalSource | int | None = None) -> None:
        self._beta = _check_positive("beta", beta)
        s = float(sigma)
        if not math.isfinite(s) or s < 0:
            raise InvalidArgument(f"sigma must be a finite number >= 0, got {sigma!r}")
        self._sigma = s
        self._rng = resolve_rng(rng)
        self._xs: SortedList = SortedList()
        self._gs: dict[float, float] = {}

    @classmethod
    def from_points(cls, xs: npt.ArrayLike, gs: npt.ArrayLike, *, beta: float, sigma: float,
                    rng: NormalSource | int | None = None) -> OUSamplePath:
        """Restore a path from stored points (e.g. from :meth:`points` or a store)."""
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
        return len(self._gs)

    def __contains__(self, x: object) -> bool:
        return isinstance(x, float | int) and float(x) + 0.0 in self._gs

    def add_points(self, xs: npt.ArrayLike, gs: npt.ArrayLike) -> None:
        """Insert already-drawn points (restoring a path). A known state must keep its value."""
        x = validate_unit_states(xs)
        g = np.asarray(gs, dtype=np.float64).reshape(-1)
        if g.shape != x.shape:
            raise InvalidArgument(f"{x.size} states but {g.size} values")
        if not np.isfinite(g).all():
            raise InvalidArgument("stored noise values must be finite")
        for xi, gi in zip(x.tolist(), g.tolist(), strict=True):
            old = self._gs.get(xi)
            if old is None:
                self._xs.add(xi)
                self._gs[xi] = gi
            elif old != gi:
                raise InvalidArgument(f"state {xi!r} already has value {old!r}, not {gi!r}")

    def neighbours(self, x: float) -> tuple[tuple[float, float] | None,
                                            tuple[float, float] | None]:
        """The nearest stored (x, g) strictly left and strictly right of ``x`` (or None)."""
        i = self._xs.bisect_left(x)
        left = right = None
        if i > 0:
            xl = self._xs[i - 1]
            left = (xl, self._gs[xl])
        j = i + 1 if i < len(self._xs) and self._xs[i] == x else i
        if j < len(self._xs):
            xr = self._xs[j]
            right = (xr, self._gs[xr])
        return left, right

    def conditional(self, x: float) -> tuple[float, float]:
        """Mean and standard deviation of a new point at ``x`` given everything stored."""
        left, right = self.neighbours(x)
        return conditional_moments(
            beta=self._beta, sigma=self._sigma,
            d_left=None if left is None else x - left[0],
            g_left=None if left is None else left[1],
            d_right=None if right is None else right[0] - x,
            g_right=None if right is None else right[1],
        )

    def sample(self, xs: npt.ArrayLike) -> FloatArray:
        """g at each state of ``xs`` (1-D, in [0, 1]): stored values, new ones drawn exactly.

        New states are drawn in the order they appear (first occurrence), each conditioned
        on all points stored so far; duplicates within the call get one value.
        """
        x = validate_unit_states(xs)
        out = np.empty_like(x)
        gs = self._gs
        for i, xi in enumerate(x.tolist()):
            g = gs.get(xi)
            if g is None:
                g = self._draw(xi)
            out[i] = g
        return out

    def new_states(self, xs: Iterable[float]) -> list[float]:
        """The distinct states of ``xs`` not yet stored, in first-occurrence order."""
        seen: set[float] = set()
        out = []
        for xi in xs:
            if xi not in self._gs and xi not in seen:
                seen.add(xi)
                out.append(xi)
        return out

    def _draw(self, x: float) -> float:
        mean, std = self.conditional(x)
        g = mean + std * float(self._rng.standard_normal())
        self._xs.add(x)
        self._gs[x] = g
        return g

    def points(self) -> tuple[FloatArray, FloatArray]:
        """The stored (xs, gs), in increasing state order."""
        xs = np.fromiter(self._xs, dtype=np.float64, count=len(self._xs))
        gs = np.fromiter((self._gs[x] for x in self._xs), dtype=np.float64, count=len(self._xs))
        return xs, gs

    def max_abs(self) -> float:
        """max |g| over the stored points (0.0 for an empty path)."""
        return max((abs(v) for v in self._gs.values()), default=0.0)


@dataclass(frozen=True, slots=True)
class StateInterval:
    """A bounded state interval [lo, hi], mapped affinely onto the noise domain [0, 1].

    beta is defined on [0, 1] (``NOTES-privacy.md`` section 1), so every state is mapped
    before it reaches a sample path; values outside [lo, hi], NaN and infinities are refused.
    """

    lo: float
    hi: float

    def __post_init__(self) -> None:
        lo, hi = float(self.lo), float(self.hi)
        if not (math.isfinite(lo) and math.isfinite(hi)) or not lo < hi:
            raise InvalidArgument(
                f"state interval needs finite lo < hi, got [{self.lo!r}, {self.hi!r}]")
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
                f"[{self.lo!r}, {self.hi!r}]")
        return np.clip((s - self.lo) / self.width, 0.0, 1.0) + 0.0

    def from_unit(self, xs: npt.ArrayLike) -> FloatArray:
        """Map noise-domain points in [0, 1] back to states."""
        return self.lo + np.asarray(xs, dtype=np.float64) * self.width
