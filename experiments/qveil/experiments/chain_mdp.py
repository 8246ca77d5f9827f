"""The chain MDP of Balle, Gomrokchi & Precup (2016), Section 6, and its first-visit returns.

N states in a row; in each non-final state the policy stays with probability p and advances one
state to the right with probability 1 - p. Reaching the final, absorbing state N - 1 pays a
reward of 1; every other transition pays 0. The paper says only that trajectories start from
"an initial state distribution"; ``start="uniform"`` draws it uniformly from the N - 1
non-absorbing states, ``start="first"`` starts every trajectory in state 0 (every patient
enters at the first stage). Trajectories run until absorption. The absorbing state is
recorded as the last visited state of every trajectory, with return 0, so all N states carry
a value (V(N-1) = 0).

Everything here is pure numpy and vectorised over trajectories: because the chain only moves
right, the time spent in state s is an independent Geometric(1 - p) holding time H_s >= 1, and
the first-visit return of a visited state s is gamma ** (H_s + ... + H_{N-2} - 1) (the reward 1
arrives on the step that enters N - 1). Returns lie in [0, 1], so R_max = 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from qveil.errors import InvalidArgument

__all__ = ["ChainMDP", "Batch", "pairs_features", "tabular_features"]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Batch:
    """A batch X of m trajectories, kept as the sufficient statistics of first-visit Monte Carlo.

    ``counts[s]`` = |X_s| (trajectories visiting s: the dataset's signature <X>) and
    ``return_sums[s]`` = sum of F_{x, s} over the trajectories visiting s. Every estimator of
    BGP16 (eqs. (4), (8), (11)) and every noise scale (eqs. (9), (12)) depends on X only
    through these two vectors and m.
    """

    m: int
    counts: npt.NDArray[np.int64]
    return_sums: FloatArray

    def mean_returns(self) -> FloatArray:
        """F_X (BGP16 eq. (4)): average first-visit return per state, 0 where unvisited."""
        c = self.counts
        return np.where(c > 0, self.return_sums / np.maximum(c, 1), 0.0)

    @classmethod
    def from_returns(cls, returns: npt.ArrayLike, visited: npt.ArrayLike) -> Batch:
        """From per-trajectory first-visit returns (m, N) and visit indicators (m, N)."""
        r = np.asarray(returns, dtype=np.float64)
        v = np.asarray(visited, dtype=bool)
        if r.shape != v.shape or r.ndim != 2:
            raise InvalidArgument(f"returns {r.shape} and visited {v.shape} must be (m, N)")
        return cls(
            m=int(r.shape[0]),
            counts=v.sum(axis=0).astype(np.int64),
            return_sums=np.where(v, r, 0.0).sum(axis=0),
        )


@dataclass(frozen=True)
class ChainMDP:
    """The chain of BGP16 Section 6 (defaults: N = 40, p = 0.5, gamma = 0.99)."""

    n_states: int = 40
    p_stay: float = 0.5
    gamma: float = 0.99
    start: str = "uniform"

    def __post_init__(self) -> None:
        if self.start not in ("uniform", "first"):
            raise InvalidArgument(f"start must be 'uniform' or 'first', got {self.start!r}")
        if self.n_states < 2:
            raise InvalidArgument(f"n_states must be >= 2, got {self.n_states}")
        if not 0.0 <= self.p_stay < 1.0:
            raise InvalidArgument(f"p_stay must be in [0, 1), got {self.p_stay}")
        if not 0.0 < self.gamma < 1.0:
            raise InvalidArgument(f"gamma must be in (0, 1), got {self.gamma}")

    @property
    def r_max(self) -> float:
        return 1.0

    def true_values(self) -> FloatArray:
        """Exact V by dynamic programming on the chain (the RMSE reference)."""
        n, p, g = self.n_states, self.p_stay, self.gamma
        v = np.zeros(n)
        # V(N-2) = p g V(N-2) + (1 - p) * 1 ;  V(s) = p g V(s) + (1 - p) g V(s + 1).
        v[n - 2] = (1 - p) / (1 - p * g)
        for s in range(n - 3, -1, -1):
            v[s] = (1 - p) * g * v[s + 1] / (1 - p * g)
        return v

    def sample(
        self,
        m: int,
        rng: np.random.Generator,
        *,
        chunk: int = 50_000,
        on_chunk: Callable[[FloatArray, npt.NDArray[np.bool_]], None] | None = None,
    ) -> Batch:
        """m i.i.d. trajectories of the policy, summarised as a :class:`Batch` (drawn in chunks
        so that a million trajectories need little memory). ``on_chunk(hold, visited)``, if
        given, sees each chunk's holding times ``hold[i, s]`` in the non-absorbing states and
        ``visited[i, s]`` (state s at or after trajectory i's start), for statistics of its
        own from the same trajectories."""
        if m < 1:
            raise InvalidArgument(f"batch size must be >= 1, got {m}")
        n = self.n_states
        counts = np.zeros(n, dtype=np.int64)
        sums = np.zeros(n)
        cols = np.arange(n)
        done = 0
        while done < m:
            b = min(chunk, m - done)
            done += b
            hold = rng.geometric(1.0 - self.p_stay, size=(b, n - 1)).astype(np.float64)
            if self.start == "uniform":
                start = rng.integers(0, n - 1, size=b)
            else:
                start = np.zeros(b, dtype=np.int64)
            # suffix[i, s] = H_s + ... + H_{N-2}; the first-visit return of s is
            # gamma ** (suffix - 1); the absorbing state's return is 0.
            suffix = np.cumsum(hold[:, ::-1], axis=1)[:, ::-1]
            visited = cols[None, :] >= start[:, None]
            ret = np.power(self.gamma, suffix - 1.0)
            counts += visited.sum(axis=0)
            sums[: n - 1] += np.where(visited[:, : n - 1], ret, 0.0).sum(axis=0)
            if on_chunk is not None:
                on_chunk(hold, visited)
        return Batch(m=m, counts=counts, return_sums=sums)


def tabular_features(n_states: int) -> FloatArray:
    """Phi = I: one parameter per state."""
    return np.eye(n_states)


def pairs_features(n_states: int) -> FloatArray:
    """Aggregate pairs of adjacent states (BGP16 Section 6): states 2j and 2j+1 share theta_j."""
    d = (n_states + 1) // 2
    phi = np.zeros((n_states, d))
    phi[np.arange(n_states), np.arange(n_states) // 2] = 1.0
    return phi
