"""The model kinds a bundle serves, behind one interface (:class:`Model`:
``q_values_unit(x) -> (n, m)``), with their array checks and the Lipschitz bounds of the
Algorithm 1 network. Pure numpy: no files, no card."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from qveil.errors import InvalidArgument
from qveil.kfqi import additive_mean

__all__ = [
    "FloatArray",
    "GridModel",
    "KernelModel",
    "MLPModel",
    "Model",
    "grid_arrays",
    "kernel_arrays",
    "layers_of",
    "lipschitz_bound",
    "measured_lipschitz",
    "mlp_forward",
]

FloatArray = npt.NDArray[np.float64]


def layers_of(weights: Mapping[str, np.ndarray]) -> list[tuple[FloatArray, FloatArray]]:
    """(W, b) pairs in order, checked for shape (W: (out, in), b: (out,), input 1)."""
    n = 0
    while f"W{n}" in weights:
        n += 1
    if n == 0:
        raise InvalidArgument("weights: no W0 array (expected W0, b0, W1, b1, ...)")
    extra = sorted(set(weights) - {f"{p}{i}" for i in range(n) for p in "Wb"})
    if extra:
        raise InvalidArgument(f"weights: unexpected arrays {extra}")
    layers = []
    fan_in = 1
    for i in range(n):
        if f"b{i}" not in weights:
            raise InvalidArgument(f"weights: W{i} has no b{i}")
        w = np.asarray(weights[f"W{i}"], dtype=np.float64)
        b = np.asarray(weights[f"b{i}"], dtype=np.float64)
        if w.ndim != 2 or w.shape[1] != fan_in or b.shape != (w.shape[0],):
            raise InvalidArgument(
                f"weights: layer {i} has W{i} {w.shape}, b{i} {b.shape}; expected "
                f"({'out'}, {fan_in}) and (out,)"
            )
        if not (np.isfinite(w).all() and np.isfinite(b).all()):
            raise InvalidArgument(f"weights: layer {i} has non-finite values")
        layers.append((w, b))
        fan_in = w.shape[0]
    return layers


def mlp_forward(weights: Mapping[str, np.ndarray], xs: npt.ArrayLike) -> FloatArray:
    """Q values (n, m) of the bundle MLP at unit states ``xs`` (no validation of xs)."""
    return _forward(layers_of(weights), xs)


def _forward(layers: list[tuple[FloatArray, FloatArray]], xs: npt.ArrayLike) -> FloatArray:
    """The forward pass over already-checked layers (ReLU between layers)."""
    h = np.asarray(xs, dtype=np.float64).reshape(-1, 1)
    for i, (w, b) in enumerate(layers):
        h = h @ w.T + b
        if i < len(layers) - 1:
            np.maximum(h, 0.0, out=h)
    return h


class Model(Protocol):
    """What the server serves: the released mean function of every action at unit states.
    One interface for every model kind, so there is one serving path."""

    @property
    def kind(self) -> str: ...

    @property
    def n_actions(self) -> int: ...

    def q_values_unit(self, x: FloatArray) -> FloatArray:
        """Q values (n, m) at already-validated unit states x in [0, 1]."""
        ...


@dataclass(frozen=True, eq=False)
class MLPModel:
    """The Algorithm 1 network (checked layers), clamped to +-q_bound when one is set."""

    layers: list[tuple[FloatArray, FloatArray]] = field(repr=False)
    q_bound: float | None = None
    kind: str = "mlp"

    @property
    def n_actions(self) -> int:
        return int(self.layers[-1][0].shape[0])

    def q_values_unit(self, x: FloatArray) -> FloatArray:
        q = _forward(self.layers, x)
        if self.q_bound is not None:
            np.clip(q, -self.q_bound, self.q_bound, out=q)
        return q


def grid_arrays(weights: Mapping[str, np.ndarray]) -> tuple[FloatArray, FloatArray]:
    """(grid, values) of a grid model, checked: grid strictly increasing from 0 to 1,
    values (K, m) finite."""
    if set(weights) != {"grid", "values"}:
        raise InvalidArgument(f"grid model: expected arrays grid, values; got {sorted(weights)}")
    g = np.asarray(weights["grid"], dtype=np.float64)
    v = np.asarray(weights["values"], dtype=np.float64)
    if g.ndim != 1 or len(g) < 2 or g[0] != 0.0 or g[-1] != 1.0 or not (np.diff(g) > 0).all():
        raise InvalidArgument("grid model: grid must increase strictly from 0 to 1")
    if v.ndim != 2 or v.shape[0] != len(g) or not np.isfinite(v).all():
        raise InvalidArgument(f"grid model: values must be finite of shape ({len(g)}, m)")
    return g, v


@dataclass(frozen=True, eq=False)
class GridModel:
    """The mean function of a 1-D fqi release of the retired grid fit: values (K, m) at the
    grid, linear in between. Kept so that bundles an earlier version wrote still load and
    serve; new 1-D releases are the kernel estimator with d = 1 (:class:`KernelModel`)."""

    grid: FloatArray = field(repr=False)
    values: FloatArray = field(repr=False)
    kind: str = "grid"

    @property
    def n_actions(self) -> int:
        return int(self.values.shape[1])

    def q_values_unit(self, x: FloatArray) -> FloatArray:
        xs = np.asarray(x, dtype=np.float64).reshape(-1)
        j = np.clip(np.searchsorted(self.grid, xs, side="right") - 1, 0, len(self.grid) - 2)
        frac = (xs - self.grid[j]) / (self.grid[j + 1] - self.grid[j])
        out: FloatArray = (
            self.values[j] * (1.0 - frac)[:, None] + self.values[j + 1] * frac[:, None]
        )
        return out


_KERNEL_ARRAYS = {"inducing", "betas", "alpha", "centre"}


def kernel_arrays(
    weights: Mapping[str, np.ndarray],
) -> tuple[FloatArray, FloatArray, FloatArray, float]:
    """(inducing, betas, alpha, centre) of an additive model, checked."""
    if set(weights) != _KERNEL_ARRAYS:
        raise InvalidArgument(
            f"additive model: expected arrays {sorted(_KERNEL_ARRAYS)}; got {sorted(weights)}"
        )
    u = np.asarray(weights["inducing"], dtype=np.float64)
    b = np.asarray(weights["betas"], dtype=np.float64)
    a = np.asarray(weights["alpha"], dtype=np.float64)
    c = np.asarray(weights["centre"], dtype=np.float64)
    if u.ndim != 1 or len(u) < 2 or not np.isfinite(u).all():
        raise InvalidArgument("additive model: inducing must be finite of shape (M,)")
    if b.ndim != 1 or len(b) < 1 or not (np.isfinite(b).all() and (b > 0).all()):
        raise InvalidArgument("additive model: betas must be positive of shape (d,)")
    if a.ndim != 3 or a.shape[1:] != (len(b), len(u)) or not np.isfinite(a).all():
        raise InvalidArgument(
            f"additive model: alpha must be finite of shape (m, {len(b)}, {len(u)})"
        )
    if c.shape != () or not np.isfinite(c):
        raise InvalidArgument("additive model: centre must be a finite scalar")
    return u, b, a, float(c)


@dataclass(frozen=True, eq=False)
class KernelModel:
    """The d-coordinate fqi release's mean function: an additive kernel expansion
    f_a(x) = centre + sum_j sum_l alpha[a, j, l] exp(-beta_j |x_j - u_l|) in the RKHS of the
    noise kernel sum_j exp(-beta_j |x_j - y_j|) (the same beta_j)."""

    inducing: FloatArray = field(repr=False)
    betas: FloatArray = field(repr=False)
    alpha: FloatArray = field(repr=False)
    centre: float = 0.0
    kind: str = "additive"

    @property
    def n_actions(self) -> int:
        return int(self.alpha.shape[0])

    @property
    def dims(self) -> int:
        return int(len(self.betas))

    def q_values_unit(self, x: FloatArray) -> FloatArray:
        """(n, m) at unit states x of shape (n, d) (already validated and clipped)."""
        xs = np.asarray(x, dtype=np.float64).reshape(-1, self.dims)
        out: FloatArray = additive_mean(
            xs,
            alpha=self.alpha,
            centre=self.centre,
            inducing=self.inducing,
            betas=self.betas.tolist(),
        )
        return out


def lipschitz_bound(weights: Mapping[str, np.ndarray]) -> float:
    """An upper bound on max_a sup_x |dQ_a/dx|: max_a ||w_a|| prod_i ||W_i||_2 (ReLU is
    1-Lipschitz; w_a is row a of the output layer, W_i the hidden layers)."""
    layers = layers_of(weights)
    prod = 1.0
    for w, _ in layers[:-1]:
        prod *= float(np.linalg.norm(w, ord=2))
    return prod * float(np.linalg.norm(layers[-1][0], axis=1).max())


def measured_lipschitz(weights: Mapping[str, np.ndarray], *, grid: int = 20001) -> float:
    """max_a max |Q_a(x_{i+1}) - Q_a(x_i)| / (x_{i+1} - x_i) on a uniform grid of [0, 1].

    The MLP is piecewise linear in x, so this approaches the true Lipschitz constant from
    below as the grid refines; it can never exceed :func:`lipschitz_bound`.
    """
    xs = np.linspace(0.0, 1.0, int(grid))
    q = mlp_forward(weights, xs)
    return float((np.abs(np.diff(q, axis=0)) / np.diff(xs)[:, None]).max())
