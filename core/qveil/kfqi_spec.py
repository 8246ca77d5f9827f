"""The public design of the d-coordinate (kernel) fqi estimator: its parameters
(:class:`KernelFQISpec`, none tuned on private data) and the public anchor set they define
(:class:`Anchors`: equation 1's anchors and the KRR's fit points, see :mod:`qveil.kfqi`), with
the two ways samples reach it (the truncated NW kernel's pairs, and a convex interpolation).

Pure numpy/scipy: no I/O; the Sobol anchors use a fixed public seed, and the ``file``
layout's points are given (read by :mod:`qveil.kfqi_anchors`).
"""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from qveil.errors import InvalidArgument

__all__ = [
    "ANCHOR_LAYOUTS",
    "SOBOL_SEED",
    "Anchors",
    "KernelFQISpec",
    "NEIGHBOURS",
    "anchor_grid",
    "check_in_q_range",
    "points_sha256",
    "multilinear_weights",
    "nw_pairs",
    "q_range",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
NEIGHBOURS = ("user", "reward")


def q_range(reward_range: tuple[float, float], gamma: float) -> tuple[float, float]:
    """[min(lo, 0), max(hi, 0)] / (1 - gamma): where every Q_t of the averager FQI lies (a
    convex combination of targets r + gamma V_t and public constants).

    The ends are computed exactly from the numbers as written (each float's shortest decimal
    form, in rational arithmetic) and rounded once: a reward range [-1, 0] with gamma 0.99
    gives [-100, 0], not the -99.99999999999991 that float arithmetic on 1 - 0.99 gives, so
    the end a config names is the end it gets (its default value, a clip bound)."""
    lo, hi, g = (Fraction(repr(float(v))) for v in (*reward_range, gamma))
    scale = 1 / (1 - g)
    return float(min(lo, Fraction(0)) * scale), float(max(hi, Fraction(0)) * scale)


def check_in_q_range(
    values: npt.ArrayLike, *, reward_range: tuple[float, float], gamma: float
) -> None:
    """Every value of a (K, m) table of public votes (a prior) finite and in the Q range of
    (reward_range, gamma), else InvalidArgument naming the first offending (anchor, action)
    and its value. D_T's proof needs the votes there; nothing is clipped."""
    v = np.asarray(values, dtype=np.float64)
    qlo, qhi = q_range(reward_range, gamma)
    bad = ~np.isfinite(v) | (v < qlo) | (v > qhi)
    if bad.any():
        k, a = (int(i) for i in np.argwhere(bad)[0])
        raise InvalidArgument(
            f"the prior's values must lie in the Q range [{qlo:g}, {qhi:g}]; "
            f"{int(bad.sum())} do not, e.g. anchor {k} action {a}: {float(v[k, a])!r}"
        )


@dataclass(frozen=True, kw_only=True)
class KernelFQISpec:
    """The public parameters of the d-coordinate estimator (none tuned on private data)."""

    gamma: float
    iterations: int
    betas: tuple[float, ...]
    """beta_j of the noise kernel (unit coordinates), one per coordinate: also the RKHS of L."""
    anchor_points: int = 6
    """G: anchors per coordinate of the ``grid`` layout (K = G^d)."""
    anchors: str = "grid"
    """The public anchor layout (equation 1's anchors, the KRR's fit points): ``grid`` (the
    G^d product grid; next states multilinearly interpolated), ``sobol`` (``anchor_count``
    scrambled Sobol points of a fixed public seed), or ``file`` (the K given public points
    ``anchor_set``, e.g. where simulated public episodes go: :mod:`qveil.kfqi_anchors`). In
    ``sobol`` and ``file``, samples and next states reach their ``neighbours`` nearest
    anchors, whatever d."""
    anchor_count: int = 4096
    """K of the ``sobol`` layout."""
    neighbours: int = 16
    """k of the ``sobol`` and ``file`` layouts: anchors each sample and each next state
    reaches."""
    anchor_set: FloatArray | None = field(default=None, compare=False, repr=False)
    """The (K, d) points in [0, 1]^d of the ``file`` layout (public, fixed before any data is
    read; its identity is :attr:`anchor_sha256`); None for the other layouts."""
    bandwidth: float = 0.12
    """h: NW bandwidth in unit coordinates (every coordinate)."""
    kernel_radius: float = 2.0
    """The NW kernel is cut off beyond this many bandwidths, per coordinate."""
    inducing_points: int = 11
    """M: inducing points per coordinate of the KRR subspace (equation 2)."""
    lam: float = 0.05
    """lambda of equation (2): kappa = 1 / (4 lambda)."""
    neighbour: str = "user"
    default: float | None = None
    """The public value an uncovering user contributes (and the KRR centre c0); must lie in
    the Q range [min(lo, 0), max(hi, 0)] / (1 - gamma); None: its midpoint."""

    def __post_init__(self) -> None:
        if not (0.0 <= self.gamma < 1.0):
            raise InvalidArgument(f"gamma must be in [0, 1), got {self.gamma!r}")
        if int(self.iterations) != self.iterations or self.iterations < 1:
            raise InvalidArgument(f"iterations must be an integer >= 1, got {self.iterations!r}")
        b = tuple(float(v) for v in self.betas)
        if not b or not all(math.isfinite(v) and v > 0 for v in b):
            raise InvalidArgument(f"betas must be positive numbers, got {self.betas!r:.80}")
        object.__setattr__(self, "betas", b)
        for name in ("anchor_points", "inducing_points"):
            v = getattr(self, name)
            if int(v) != v or v < 2:
                raise InvalidArgument(f"{name} must be an integer >= 2, got {v!r}")
        for name in ("bandwidth", "kernel_radius", "lam"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0.0):
                raise InvalidArgument(f"{name} must be > 0, got {v!r}")
        if self.neighbour not in NEIGHBOURS:
            raise InvalidArgument(
                f"neighbour must be one of {', '.join(NEIGHBOURS)}, got {self.neighbour!r:.80}"
            )
        if self.anchors not in ANCHOR_LAYOUTS:
            raise InvalidArgument(
                f"anchors must be one of {', '.join(ANCHOR_LAYOUTS)}, got {self.anchors!r:.80}"
            )
        for name in ("anchor_count", "neighbours"):
            v = getattr(self, name)
            if int(v) != v or v < 1:
                raise InvalidArgument(f"{name} must be an integer >= 1, got {v!r}")
        if self.anchors == "sobol" and not self.neighbours <= self.anchor_count <= 2_000_000:
            raise InvalidArgument(
                f"anchor_count must lie in [neighbours, 2e6], got {self.anchor_count}"
            )
        if (self.anchors == "file") != (self.anchor_set is not None):
            raise InvalidArgument('anchor_set is given with anchors = "file", and only then')
        if self.anchor_set is not None:
            pts = np.array(self.anchor_set, dtype=np.float64)  # a copy: the spec owns it
            if pts.ndim != 2 or pts.shape[1] != len(b):
                raise InvalidArgument(
                    f"the anchor set must be (K, {len(b)}) points, got shape {pts.shape}"
                )
            if not (np.isfinite(pts).all() and (pts >= 0.0).all() and (pts <= 1.0).all()):
                raise InvalidArgument("the anchor set's points must lie in [0, 1]^d")
            if not self.neighbours <= len(pts) <= 2_000_000:
                raise InvalidArgument(
                    f"the anchor set must hold between neighbours ({self.neighbours}) and 2e6 "
                    f"points, got {len(pts)}"
                )
            pts.setflags(write=False)
            object.__setattr__(self, "anchor_set", pts)
        if self.anchors == "grid" and self.anchor_points ** len(b) > 2_000_000:
            raise InvalidArgument(
                f"anchor_points^d = {self.anchor_points}^{len(b)} anchors is too many "
                "(at most 2e6): lower anchor_points"
            )

    @property
    def dims(self) -> int:
        return len(self.betas)

    def default_value(self, reward_range: tuple[float, float]) -> float:
        """The public default (and centre): ``default`` checked against the Q range (the
        proof of D_T needs it inside), or the range's midpoint."""
        qlo, qhi = q_range(reward_range, self.gamma)
        if self.default is None:
            return float(0.5 * (qlo + qhi))
        v = float(self.default)
        if not (math.isfinite(v) and qlo <= v <= qhi):
            raise InvalidArgument(
                f"default must lie in the Q range [{qlo:g}, {qhi:g}], got {self.default!r}"
            )
        return v

    @property
    def kappa(self) -> float:
        """1 / (4 lam): the subspace-KRR bound (docs/privacy.md 2.6)."""
        return 1.0 / (4.0 * self.lam)

    @property
    def anchor_total(self) -> int:
        """K, the number of anchors."""
        if self.anchor_set is not None:
            return int(len(self.anchor_set))
        return int(self.anchor_points**self.dims if self.anchors == "grid" else self.anchor_count)

    @property
    def anchor_sha256(self) -> str | None:
        """:func:`points_sha256` of the ``file`` layout's points; None for the others (their
        anchors are a function of the spec's numbers)."""
        return None if self.anchor_set is None else points_sha256(self.anchor_set)


def points_sha256(points: npt.ArrayLike) -> str:
    """sha256 of (K, d) points as little-endian float64 in C order (prefixed by the shape):
    the identity of a public anchor set, whatever file holds it."""
    v = np.ascontiguousarray(np.asarray(points, dtype="<f8"))
    h = hashlib.sha256(f"{v.shape[0]}x{v.shape[1]}:".encode())
    h.update(v.tobytes())
    return h.hexdigest()


#: The public anchor layouts of :class:`KernelFQISpec`.
ANCHOR_LAYOUTS = ("grid", "sobol", "file")
#: The seed of the Sobol scrambling: public and fixed, so the anchors are a public constant.
SOBOL_SEED = 20261125


class Anchors:
    """A public anchor set in [0, 1]^d and the two ways samples reach it (equation 1):
    :meth:`pairs`, the NW kernel's (sample, anchor, weight) triples, and :meth:`interp`, a
    convex combination of anchors at each next state. ``grid``: the G^d product grid (every
    anchor within the kernel's radius; multilinear interpolation). ``sobol`` (K scrambled
    Sobol points) and ``file`` (the spec's K given points): a sample reaches its k nearest
    anchors within the radius, a next state is the Gaussian-weighted average of its k
    nearest anchors: O(samples x k) pairs whatever d."""

    def __init__(self, spec: KernelFQISpec) -> None:
        self.layout = spec.anchors
        self.dims = spec.dims
        if spec.anchors == "grid":
            self.g = int(spec.anchor_points)
            self.points = anchor_grid(self.g, self.dims)
            half = int(math.floor(spec.kernel_radius * spec.bandwidth * (self.g - 1) + 0.5))
            self.per_sample = (2 * half + 1) ** self.dims
        else:
            # scipy's spatial and qmc load only for a scattered anchor set
            from scipy.spatial import cKDTree

            if spec.anchor_set is not None:
                self.points = np.asarray(spec.anchor_set, dtype=np.float64)
            else:
                from scipy.stats import qmc  # loads only for the Sobol points

                sob = qmc.Sobol(self.dims, scramble=True, seed=SOBOL_SEED)
                m = int(math.log2(spec.anchor_count))
                n = spec.anchor_count
                pts = sob.random_base2(m) if 2**m == n else sob.random(n)
                self.points = np.asarray(pts, dtype=np.float64)
            self.tree = cKDTree(self.points)
            self.k = int(spec.neighbours)
            self.per_sample = self.k
        self.h = float(spec.bandwidth)
        self.radius = float(spec.kernel_radius)

    @property
    def count(self) -> int:
        return int(len(self.points))

    def pairs(self, x: FloatArray) -> tuple[IntArray, IntArray, FloatArray]:
        """The non-zero (sample, anchor, weight) triples of the truncated product Gaussian
        kernel exp(-|z - s|^2 / (2 h^2)) 1{|z_j - s_j| <= R h for all j}."""
        if self.layout == "grid":
            return nw_pairs(x, self.g, self.h, self.radius)
        reach = self.radius * self.h
        k = min(self.k, self.count)
        dist, idx = self.tree.query(x, k=k, p=np.inf, distance_upper_bound=reach)
        dist, idx = dist.reshape(len(x), k), idx.reshape(len(x), k)
        rows, cols = np.nonzero(np.isfinite(dist))
        anchors = idx[rows, cols].astype(np.int64)
        dz = self.points[anchors] - x[rows]
        w = np.exp(-np.einsum("ij,ij->i", dz, dz) / (2.0 * self.h * self.h))
        keep = w > 0.0
        return rows[keep].astype(np.int64), anchors[keep], w[keep]

    def interp(self, x: FloatArray) -> tuple[IntArray, FloatArray]:
        """(n, k) anchor indices and non-negative weights summing to 1 at each row."""
        if self.layout == "grid":
            return multilinear_weights(x, self.g)
        k = min(self.k, self.count)
        dist, idx = self.tree.query(x, k=k)
        dist, idx = dist.reshape(len(x), k), idx.reshape(len(x), k).astype(np.int64)
        logw = -(dist * dist) / (2.0 * self.h * self.h)
        w = np.exp(logw - logw.max(axis=1, keepdims=True))  # the nearest has weight 1
        w /= w.sum(axis=1, keepdims=True)
        return idx, w


def anchor_grid(points: int, dims: int) -> FloatArray:
    """The K = G^d anchors (K, d), C order: anchor k = ravel_multi_index of its grid indices."""
    g = np.linspace(0.0, 1.0, int(points))
    mesh = np.meshgrid(*([g] * dims), indexing="ij")
    return np.stack([m.reshape(-1) for m in mesh], axis=1)


def multilinear_weights(x: FloatArray, points: int) -> tuple[IntArray, FloatArray]:
    """(n, 2^d) anchor indices and weights of multilinear interpolation at x (n, d) in
    [0, 1]^d on the G^d grid: non-negative, summing to 1 (a convex combination)."""
    n, d = x.shape
    g = int(points)
    pos = x * (g - 1)
    j0 = np.minimum(np.floor(pos).astype(np.int64), g - 2)
    frac = pos - j0
    strides = g ** np.arange(d - 1, -1, -1)
    idx = np.zeros((n, 1 << d), dtype=np.int64)
    w = np.ones((n, 1 << d))
    for c, bits in enumerate(itertools.product((0, 1), repeat=d)):
        for j, bj in enumerate(bits):
            idx[:, c] += (j0[:, j] + bj) * strides[j]
            w[:, c] *= frac[:, j] if bj else 1.0 - frac[:, j]
    return idx, w


def nw_pairs(
    x: FloatArray, points: int, h: float, radius: float
) -> tuple[IntArray, IntArray, FloatArray]:
    """The non-zero (sample, anchor, weight) triples of the truncated product Gaussian
    kernel between samples x (n, d) and the anchors."""
    n, d = x.shape
    g = int(points)
    reach = radius * h
    half = int(math.floor(reach * (g - 1) + 0.5))
    offs = np.arange(-half, half + 1)
    centre = np.rint(x * (g - 1)).astype(np.int64)
    strides = g ** np.arange(d - 1, -1, -1)
    flat = np.zeros((n, 1), dtype=np.int64)
    wt = np.ones((n, 1))
    for j in range(d):
        kj = centre[:, j, None] + offs[None, :]
        inside = (kj >= 0) & (kj < g)
        dz = kj / (g - 1) - x[:, j, None]
        wj = np.where(inside & (np.abs(dz) <= reach), np.exp(-(dz * dz) / (2.0 * h * h)), 0.0)
        kj = np.clip(kj, 0, g - 1)
        flat = (flat[:, :, None] + (kj * strides[j])[:, None, :]).reshape(n, -1)
        wt = (wt[:, :, None] * wj[:, None, :]).reshape(n, -1)
    rows, cols = np.nonzero(wt > 0.0)
    return rows.astype(np.int64), flat[rows, cols], wt[rows, cols]
