"""Averager fitted-Q iteration on a public grid: the estimator of the rigorous `fqi` mode
(docs/privacy.md section 2.5, "The fqi mode").

Per action a, on the public grid x_k = k / (K - 1) of the unit state interval:

    Q_{t+1}(x_k, a) = sum_i w_ki y_i,     y_i = r_i + gamma (1 - terminal_i) V_t(s'_i),     (1)

with Q_0 = 0, V_t = max_b Q_t(., b) taken on the grid and linearly interpolated in between,
and w_ki >= 0, sum_i w_ki = 1 (an averager, Gordon 1995). Nadaraya-Watson weights with a
Gaussian kernel of bandwidth h, truncated at ``kernel_radius`` h, over the samples of action a:

* ``reward`` relation (pooled): w_ki proportional to exp(-(x_k - s_i)^2 / (2 h^2)) over all
  samples of action a; a grid point no sample reaches gets the public default value.
* ``user`` relation (per-user averager): Q_{t+1}(x_k, a) = (1/N) sum_u A_u[y](x_k), where
  A_u is user u's own normalised NW average over u's samples of action a, and a user none
  of whose samples reaches x_k contributes the public default value.

Either way each Q_t(x_k, a) is a convex combination of targets and public constants, so with
rewards in [lo, hi] every Q_t lies in the public range [min(lo, 0), max(hi, 0)] / (1 - gamma)
and the default is that range's midpoint. Because V_t is interpolated from grid values,
equation (1) is affine in V_t: Q_{t+1}(., a) = c_a + gamma P_a V_t with c_a in R^K and
P_a in R^{K x K} built once from the data (:func:`averaging_operators`); T iterations then
cost O(T m K^2), whatever the number of samples.

Pure numpy: no I/O, no randomness. States are clipped to the public interval and rewards to
the declared range first (public post-processing of each sample; the bound then holds for
any input).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from qveil.errors import InvalidArgument
from qveil.noise import StateInterval
from qveil.release_map import unit_grid

__all__ = ["NEIGHBOURS", "FQISpec", "averaging_operators", "fitted_q", "q_range"]

FloatArray = npt.NDArray[np.float64]
NEIGHBOURS = ("user", "reward")

#: Samples per chunk when building the operators (bounds memory to ~100 MB at K = 101).
_CHUNK = 1 << 17


@dataclass(frozen=True, kw_only=True)
class FQISpec:
    """The public parameters of the estimator (none may be tuned on the private data)."""

    gamma: float
    iterations: int
    grid_points: int = 101
    bandwidth: float = 0.05
    """h: the NW kernel's bandwidth in unit state coordinates."""
    kernel_radius: float = 3.0
    """The kernel is cut off beyond this many bandwidths (0 weight)."""
    neighbour: str = "user"

    def __post_init__(self) -> None:
        if not (0.0 <= self.gamma < 1.0):
            raise InvalidArgument(f"gamma must be in [0, 1), got {self.gamma!r}")
        if int(self.iterations) != self.iterations or self.iterations < 1:
            raise InvalidArgument(f"iterations must be an integer >= 1, got {self.iterations!r}")
        unit_grid(self.grid_points)
        if not (math.isfinite(self.bandwidth) and self.bandwidth > 0.0):
            raise InvalidArgument(f"bandwidth must be > 0, got {self.bandwidth!r}")
        if not (math.isfinite(self.kernel_radius) and self.kernel_radius > 0.0):
            raise InvalidArgument(f"kernel_radius must be > 0, got {self.kernel_radius!r}")
        if self.neighbour not in NEIGHBOURS:
            raise InvalidArgument(
                f"neighbour must be one of {', '.join(NEIGHBOURS)}, got {self.neighbour!r:.80}"
            )


def q_range(reward_range: tuple[float, float], gamma: float) -> tuple[float, float]:
    """[min(lo, 0), max(hi, 0)] / (1 - gamma): where every Q_t of equation (1) lies."""
    lo, hi = (float(v) for v in reward_range)
    return min(lo, 0.0) / (1.0 - gamma), max(hi, 0.0) / (1.0 - gamma)


def _kernel_band(
    x: FloatArray, grid: FloatArray, h: float, radius: float
) -> tuple[npt.NDArray[np.int64], FloatArray]:
    """Grid indices (n, 2W+1) around each x and the truncated Gaussian weights there."""
    k = len(grid)
    reach = radius * h
    half = int(math.ceil(reach * (k - 1))) + 1
    offs = np.arange(-half, half + 1)
    ks = np.rint(x * (k - 1)).astype(np.int64)[:, None] + offs[None, :]
    inside = (ks >= 0) & (ks < k)
    kc = np.clip(ks, 0, k - 1)
    d = grid[kc] - x[:, None]
    ok = inside & (np.abs(d) <= reach)
    w = np.where(ok, np.exp(-(d * d) / (2.0 * h * h)), 0.0)
    return kc, w


def _interp_weights(x2: FloatArray, k: int) -> tuple[npt.NDArray[np.int64], FloatArray]:
    """Left grid index j and the weight of j + 1 for linear interpolation at x2."""
    pos = x2 * (k - 1)
    j = np.minimum(np.floor(pos).astype(np.int64), k - 2)
    return j, pos - j


def averaging_operators(
    x: FloatArray,
    r: FloatArray,
    x2: FloatArray,
    terminal: npt.NDArray[np.bool_],
    user: npt.NDArray[np.int64],
    *,
    users: int,
    spec: FQISpec,
    default: float,
) -> tuple[FloatArray, FloatArray]:
    """(c, P) of one action: Q_{t+1}(., a) = c + gamma P V_t (equation 1), from that action's
    samples (unit states x, rewards r, unit next states x2, terminal flags, user index in
    [0, users)). Rows of [P | c-weights] are convex combinations (tested)."""
    k = spec.grid_points
    grid = unit_grid(k)
    n = len(x)
    c = np.zeros(k)
    p = np.zeros(k * k)
    per_user = spec.neighbour == "user"
    den = np.zeros(users * k if per_user else k)
    # pass 1: the NW denominators (per user and grid point, or per grid point)
    for lo in range(0, n, _CHUNK):
        sl = slice(lo, lo + _CHUNK)
        kc, w = _kernel_band(x[sl], grid, spec.bandwidth, spec.kernel_radius)
        idx = (user[sl, None] * k + kc) if per_user else kc
        den += np.bincount(idx.ravel(), weights=w.ravel(), minlength=den.size)
    # pass 2: normalised weights into c (rewards) and P (next-state interpolation)
    for lo in range(0, n, _CHUNK):
        sl = slice(lo, lo + _CHUNK)
        kc, w = _kernel_band(x[sl], grid, spec.bandwidth, spec.kernel_radius)
        idx = (user[sl, None] * k + kc) if per_user else kc
        dd = den[idx]
        om = np.divide(w, dd, out=np.zeros_like(w), where=dd > 0)
        c += np.bincount(kc.ravel(), weights=(om * r[sl, None]).ravel(), minlength=k)
        j, frac = _interp_weights(x2[sl], k)
        cont = om * (~terminal[sl])[:, None]
        p += np.bincount(
            (kc * k + j[:, None]).ravel(),
            weights=(cont * (1.0 - frac)[:, None]).ravel(),
            minlength=k * k,
        )
        p += np.bincount(
            (kc * k + (j + 1)[:, None]).ravel(),
            weights=(cont * frac[:, None]).ravel(),
            minlength=k * k,
        )
    pm = p.reshape(k, k)
    if per_user:
        covered = (den.reshape(users, k) > 0).sum(axis=0)
        c = (c + (users - covered) * default) / users
        pm /= users
    else:
        c = np.where(den > 0, c, default)
    return c, pm


def fitted_q(
    states: npt.ArrayLike,
    actions: npt.ArrayLike,
    rewards: npt.ArrayLike,
    next_states: npt.ArrayLike,
    terminal: npt.ArrayLike,
    users: npt.ArrayLike,
    *,
    n_actions: int,
    reward_range: tuple[float, float],
    interval: StateInterval,
    spec: FQISpec,
    on_iteration: Callable[[float], object] | None = None,
) -> FloatArray:
    """Q_T on the grid, shape (K, m): T iterations of equation (1) from Q_0 = 0.
    ``on_iteration`` receives sup |Q_{t+1} - Q_t| after each iteration."""
    s = np.asarray(states, dtype=np.float64).reshape(-1)
    s2 = np.asarray(next_states, dtype=np.float64).reshape(-1)
    a = np.asarray(actions, dtype=np.int64).reshape(-1)
    lo, hi = (float(v) for v in reward_range)
    r = np.clip(np.asarray(rewards, dtype=np.float64).reshape(-1), lo, hi)
    term = np.asarray(terminal, dtype=bool).reshape(-1)
    _, uid = np.unique(np.asarray(users).reshape(-1), return_inverse=True)
    n_users = int(uid.max()) + 1 if len(uid) else 0
    if not (len(s) == len(s2) == len(a) == len(r) == len(term) == len(uid)) or n_users == 0:
        raise InvalidArgument("fitted_q: empty or mismatched sample arrays")
    x = (np.clip(s, interval.lo, interval.hi) - interval.lo) / interval.width
    x2 = (np.clip(s2, interval.lo, interval.hi) - interval.lo) / interval.width
    qlo, qhi = q_range((lo, hi), spec.gamma)
    default = 0.5 * (qlo + qhi)
    ops = []
    for act in range(int(n_actions)):
        m = a == act
        ops.append(
            averaging_operators(
                x[m],
                r[m],
                x2[m],
                term[m],
                uid[m].astype(np.int64),
                users=n_users,
                spec=spec,
                default=default,
            )
        )
    q = np.zeros((spec.grid_points, int(n_actions)))
    for _ in range(int(spec.iterations)):
        v = q.max(axis=1)
        nxt = np.stack([c + spec.gamma * (p @ v) for c, p in ops], axis=1)
        if on_iteration is not None:
            on_iteration(float(np.abs(nxt - q).max()))
        q = nxt
    return q
