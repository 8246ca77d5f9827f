"""Additive functional noise for states with d coordinates (docs/privacy.md 2.6).

The release noise of a d-coordinate release is g ~ GP(0, sigma^2 K) with the additive kernel

    K(x, y) = sum_{j=1..d} exp(-beta_j |x_j - y_j|),     x, y in [0, 1]^d,              (1)

on unit coordinates (each coordinate mapped onto [0, 1] by its public interval, see
:class:`StateBox`). Equation (1) is the covariance of

    g(x) = sum_j g_j(x_j),     g_j ~ GP(0, sigma^2 exp(-beta_j |u - v|)) independent,     (2)

since Cov(g(x), g(y)) = sum_j Cov(g_j(x_j), g_j(y_j)) = sigma^2 sum_j exp(-beta_j |x_j - y_j|).

**How sigma is split.** It is not: every coordinate path g_j carries the FULL sigma (and its
own beta_j), so the total kernel is exactly sigma^2 * K of (1), the kernel whose RKHS the
Gaussian mechanism is stated in (the accountant's sigma is that sigma). The marginal
variance at one state is therefore d sigma^2, which the accountant's noise-to-value ratio
reports (sigma sqrt(d) / value scale).

Each g_j is a 1-D OU path (:class:`qveil.noise.OUSamplePath`), exact and lazy
(docs/privacy.md section 9), so a state adds at most d new points to a path (one per
coordinate whose value is new) at O(d log n) cost, and the sum has the exact joint law of
(2) whatever the order of queries: the paths are independent, each exact on its own.

Pure numpy; no I/O. ``rng=None`` draws every path from OS entropy; an int seed or a
generator is for tests and experiments only (spawned into d independent children). A
release's noise is not drawn here: it is a function of its key (:mod:`qveil.keyed`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from qveil.errors import InvalidArgument
from qveil.noise import OUSamplePath, StateInterval
from qveil.rng import NormalSource

__all__ = ["AdditiveSamplePath", "StateBox", "additive_covariance"]

FloatArray = npt.NDArray[np.float64]


def additive_covariance(
    xs: npt.ArrayLike, ys: npt.ArrayLike | None = None, *, betas: Sequence[float], sigma: float
) -> FloatArray:
    """sigma^2 sum_j exp(-beta_j |x_j - y_j|) (equation 1) between the rows of xs (n, d) and
    ys (m, d): the dense reference the tests condition on."""
    x = np.asarray(xs, dtype=np.float64)
    y = x if ys is None else np.asarray(ys, dtype=np.float64)
    b = np.asarray(betas, dtype=np.float64)
    out = np.zeros((x.shape[0], y.shape[0]))
    for j in range(len(b)):
        out += np.exp(-b[j] * np.abs(x[:, j, None] - y[None, :, j]))
    res: FloatArray = sigma * sigma * out
    return res


@dataclass(frozen=True)
class StateBox:
    """The public per-coordinate intervals of a d-coordinate release.

    ``to_unit(states, clip=True)`` maps (n, d) states onto [0, 1]^d coordinate by coordinate,
    first clipping each coordinate into its interval: public post-processing of the state
    (the release's card says so), so an unbounded coordinate (CartPole's velocities) gets a
    bounded noise domain. ``clip=False`` refuses out-of-box states instead. NaN and
    infinities are always refused."""

    intervals: tuple[StateInterval, ...]

    def __post_init__(self) -> None:
        ivs = tuple(
            iv if isinstance(iv, StateInterval) else StateInterval(*iv) for iv in self.intervals
        )
        if not ivs:
            raise InvalidArgument("a state box needs at least one coordinate interval")
        object.__setattr__(self, "intervals", ivs)

    @classmethod
    def of(cls, pairs: Sequence[Sequence[float]]) -> StateBox:
        """From [[lo, hi], ...] (a card's or a config's ``state_intervals``)."""
        if not isinstance(pairs, list | tuple) or not all(
            isinstance(p, list | tuple) and len(p) == 2 for p in pairs
        ):
            raise InvalidArgument(f"state intervals must be [[lo, hi], ...], got {pairs!r:.80}")
        return cls(tuple(StateInterval(float(p[0]), float(p[1])) for p in pairs))

    @property
    def dims(self) -> int:
        return len(self.intervals)

    @property
    def lo(self) -> FloatArray:
        return np.array([iv.lo for iv in self.intervals])

    @property
    def hi(self) -> FloatArray:
        return np.array([iv.hi for iv in self.intervals])

    def rows_outside(self, *states: npt.ArrayLike) -> int:
        """How many rows have a coordinate outside its interval in any of ``states`` (arrays
        of the same n rows of d coordinates, e.g. the state and the next state): the rows
        whose states :meth:`to_unit` clips."""
        out: npt.NDArray[np.bool_] | None = None
        for arr in states:
            x = np.asarray(arr, dtype=np.float64)
            x = x.reshape(x.shape[0], -1)
            bad = np.asarray(((x < self.lo) | (x > self.hi)).any(axis=1), dtype=np.bool_)
            out = bad if out is None else out | bad
        return 0 if out is None else int(out.sum())

    def to_list(self) -> list[list[float]]:
        return [[iv.lo, iv.hi] for iv in self.intervals]

    def to_unit(self, states: npt.ArrayLike, *, clip: bool = True) -> FloatArray:
        """(n, d) states -> (n, d) unit states (a single state (d,) is one row; with d = 1 a
        flat list of n numbers is n states)."""
        try:
            s = np.asarray(states, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"states must be numbers: {exc}") from None
        if s.ndim <= 1 and (s.size == self.dims or self.dims == 1):
            s = s.reshape(-1, self.dims)
        if s.ndim != 2 or s.shape[1] != self.dims:
            raise InvalidArgument(
                f"states must have shape [n, {self.dims}], got {list(s.shape)[:8]}"
            )
        if not np.isfinite(s).all():
            i = int(np.flatnonzero(~np.isfinite(s).all(axis=1))[0])
            raise InvalidArgument(f"state at index {i} is not finite")
        lo, hi = self.lo, self.hi
        if not clip:
            bad = ((s < lo) | (s > hi)).any(axis=1)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise InvalidArgument(f"state at index {i} is outside the state box")
        out: FloatArray = np.clip((np.clip(s, lo, hi) - lo) / (hi - lo), 0.0, 1.0) + 0.0
        return out


def validate_unit_points(xs: npt.ArrayLike, dims: int) -> FloatArray:
    """(n, d) finite unit states, or InvalidArgument (a single state (d,) is one row; with
    d = 1 a flat list of n numbers is n states)."""
    try:
        x = np.asarray(xs, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"states must be numbers: {exc}") from None
    if x.ndim <= 1 and (x.size == dims or dims == 1):
        x = x.reshape(-1, dims)
    if x.ndim != 2 or x.shape[1] != dims:
        raise InvalidArgument(f"unit states must have shape [n, {dims}], got {list(x.shape)[:8]}")
    if not ((x >= 0.0) & (x <= 1.0)).all():  # also refuses NaN
        raise InvalidArgument("unit states must be finite numbers in [0, 1]")
    return x + 0.0  # -0.0 -> 0.0: one stored key per state


class AdditiveSamplePath:
    """One exact sample path of g ~ GP(0, sigma^2 sum_j exp(-beta_j |x_j - y_j|)) on
    [0, 1]^d, grown lazily as d independent 1-D OU paths (equation 2).

    ``sample(xs)`` with xs of shape (n, d) returns (n,): for each coordinate j the stored
    value g_j(x_j) or an exact conditional draw (stored before it is used), summed over j.
    Not thread-safe (like OUSamplePath): concurrent callers must serialize."""

    __slots__ = ("_paths", "_betas", "_sigma")

    def __init__(
        self,
        *,
        betas: Sequence[float],
        sigma: float,
        rng: NormalSource | int | np.random.Generator | None = None,
    ) -> None:
        b = [float(v) for v in betas]
        if not b:
            raise InvalidArgument("an additive path needs at least one coordinate (betas)")
        for v in b:
            if not (math.isfinite(v) and v > 0.0):
                raise InvalidArgument(f"every beta_j must be > 0, got {v!r}")
        self._betas = tuple(b)
        self._sigma = float(sigma)
        sources: list[NormalSource | None]
        if rng is None:
            sources = [None] * len(b)  # OS entropy, each path its own
        elif isinstance(rng, np.random.Generator):
            sources = list(rng.spawn(len(b)))
        elif isinstance(rng, int | np.integer) and not isinstance(rng, bool):
            sources = [
                np.random.default_rng(s) for s in np.random.SeedSequence(int(rng)).spawn(len(b))
            ]
        else:
            raise InvalidArgument("rng must be None (OS entropy), an int seed or a Generator")
        self._paths = tuple(
            OUSamplePath(beta=bj, sigma=self._sigma, rng=src)
            for bj, src in zip(b, sources, strict=True)
        )

    @property
    def dims(self) -> int:
        return len(self._paths)

    @property
    def betas(self) -> tuple[float, ...]:
        return self._betas

    @property
    def sigma(self) -> float:
        return self._sigma

    @property
    def paths(self) -> tuple[OUSamplePath, ...]:
        """The coordinate paths g_j."""
        return self._paths

    def __len__(self) -> int:
        """Stored points over all coordinates."""
        return sum(len(p) for p in self._paths)

    def __repr__(self) -> str:
        return (
            f"AdditiveSamplePath(betas={self._betas!r}, sigma={self._sigma!r}, "
            f"points={[len(p) for p in self._paths]})"
        )

    def sample_coordinates(self, xs: npt.ArrayLike) -> FloatArray:
        """(n, d): g_j(x_j) for each state and coordinate (stored or newly drawn)."""
        x = validate_unit_points(xs, self.dims)
        if x.shape[0] == 0:
            return np.zeros((0, self.dims))
        return np.stack([p.sample(x[:, j]) for j, p in enumerate(self._paths)], axis=1)

    def sample(self, xs: npt.ArrayLike) -> FloatArray:
        """(n,): g(x) = sum_j g_j(x_j) at each row of xs (n, d) in [0, 1]^d."""
        out: FloatArray = self.sample_coordinates(xs).sum(axis=1)
        return out
