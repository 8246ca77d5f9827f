"""Release bundles: the trained network, its privacy card and its training record.

A bundle is a directory written once, atomically (a temporary sibling directory renamed into
place), by the trainer, and read by the server. It holds

* ``weights.npz``: the model of the released mean function, of one of two kinds behind one
  interface (:class:`Model`: ``q_values_unit(x) -> (n, m)``), which the server serves alike:

  - ``mlp`` (Algorithm 1 modes): ``W0, b0, W1, b1, ...`` of an MLP on the UNIT state x in
    [0, 1] (input shape (1,)) with m outputs; each W has shape (out, in), a layer is
    ``h @ W.T + b`` and ReLU sits between layers (``card["network"]["activation"]``);
  - ``grid`` (the `fqi` mode): ``grid`` (K,) unit states and ``values`` (K, m), the released
    mean function L(Q_T) at the grid points, linearly interpolated in between
    (``card["model"]``);
  - ``additive`` (the `fqi` mode's kernel estimator, d coordinates; issue 16): ``inducing``
    (M,), ``betas`` (d,), ``alpha`` (m, d, M) and ``centre`` (): the released mean function
    f_a(x) = centre + sum_j sum_l alpha[a, j, l] exp(-beta_j |x_j - inducing_l|) on unit
    states x in [0, 1]^d (:class:`KernelModel`); the card has ``state_intervals`` (one
    [lo, hi] per coordinate; states outside are clipped) and ``betas``;
* ``card.json``: the PUBLIC card, what a query client may see (:data:`PUBLIC_CARD_KEYS`, an
  allow-list of purely public parameters: none of them is a function of the trained weights);
* ``card_admin.json``: the rest of the card (weights hash, measured Lipschitz constants, the
  network layout, hyperparameters, training record, ``card_sha256``), for the admin role only.
  :attr:`Bundle.card` is the two merged; ``card_sha256`` covers the merged card, so editing
  either file is detected;
* ``config.toml`` (the training configuration), ``training_log.csv`` (per-episode return)
  and ``learning_curve.png``;
* ``binding.json``: the store that holds the release's noise and the registry that records it
  (one release, one noise lineage: :func:`write_binding`), written by ``qveil train`` right
  after the bundle. It is not part of the :func:`release_fingerprint`; its own checksum covers
  its fields and the fingerprint.

:func:`load_bundle` with ``verify=True`` (the default) refuses a bundle whose weights do not
match ``weights_sha256``, whose card does not match ``card_sha256`` (a checksum against
accidental or careless edits; it is not a signature), whose network is not L-Lipschitz in x,
or whose privacy numbers differ from what the accountant computes *now* from the card's own
``privacy_params`` (non-negotiable 6): ``qveil.privacy.account`` is rerun on every load.

This module needs numpy only (no torch): the server imports it.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import json
import math
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from qveil.errors import IntegrityError, InvalidArgument, NotFound
from qveil.noise import StateInterval, validate_unit_states

__all__ = [
    "ADMIN_CARD_FILE",
    "BINDING_FILE",
    "CARD_KEYS",
    "FQI_CARD_KEYS",
    "PUBLIC_CARD_KEYS",
    "Binding",
    "Bundle",
    "GridModel",
    "KernelModel",
    "MLPModel",
    "Model",
    "build_card",
    "build_fqi_card",
    "build_kernel_fqi_card",
    "is_kernel_card",
    "card_digest",
    "lipschitz_bound",
    "load_bundle",
    "measured_lipschitz",
    "merge_card",
    "mlp_forward",
    "nonprivate_privacy",
    "public_card_of",
    "read_binding",
    "release_fingerprint",
    "split_card",
    "value_scale_warning",
    "verify_privacy",
    "write_binding",
    "write_bundle",
    "write_grid_bundle",
    "write_kernel_bundle",
]

WEIGHTS_FILE = "weights.npz"
CARD_FILE = "card.json"
ADMIN_CARD_FILE = "card_admin.json"
CONFIG_FILE = "config.toml"
LOG_FILE = "training_log.csv"
CURVE_FILE = "learning_curve.png"
FILES = (WEIGHTS_FILE, CARD_FILE, ADMIN_CARD_FILE, CONFIG_FILE, LOG_FILE, CURVE_FILE)
BINDING_FILE = "binding.json"
BINDING_FORMAT = "qveil.binding.v2"

#: Keys every card has (CONTRACTS.md), plus ``network``, ``noise`` and ``card_sha256``.
CARD_KEYS = (
    "bundle_id",
    "env_id",
    "state_interval",
    "actions",
    "hyperparameters",
    "sigma",
    "beta",
    "k",
    "J",
    "mode",
    "epsilon",
    "delta",
    "delta_total",
    "holds",
    "basis",
    "reason",
    "privacy",
    "privacy_params",
    "q_bound",
    "lipschitz",
    "assumptions",
    "env_fingerprint",
    "weights_sha256",
    "created_at",
    "code_version",
    "seeded",
    "network",
    "card_sha256",
)

#: Keys every fqi card has (issue 13 section 3), besides the common ones.
FQI_CARD_KEYS = (
    "bundle_id",
    "env_id",
    "state_interval",
    "actions",
    "hyperparameters",
    "mode",
    "neighbour",
    "users",
    "reward_bound",
    "reward_range",
    "gamma",
    "iterations",
    "sup_sensitivity",
    "kappa",
    "beta",
    "sensitivity",
    "sigma",
    "epsilon",
    "delta",
    "delta_total",
    "holds",
    "basis",
    "reason",
    "noise_to_value",
    "privacy",
    "privacy_params",
    "dataset_fingerprint",
    "model",
    "weights_sha256",
    "created_at",
    "code_version",
    "seeded",
    "card_sha256",
)

#: Keys a d-coordinate (kernel estimator) fqi card has besides FQI_CARD_KEYS (issue 16).
#: Its ``state_interval`` is null: a 1-D server must not mistake it for a 1-D release.
KERNEL_CARD_KEYS = ("state_intervals", "betas", "dims", "clipping")

#: What ordinary clients may see (issue 14 item 3): an ALLOW-LIST, the one place that says
#: what is public. A bare key is public with its whole value; ``key.sub`` makes only that
#: sub-field of a mapping public. Every entry must be a purely public parameter: a function of
#: the training configuration, the environment, the accountant, the release's random id and
#: time, and NEVER of the trained weights (tests/test_card_split.py trains twice and perturbs
#: weights to check). Absent keys are skipped, so a mode whose card carries more public
#: parameters (the fqi mode: users, reward_bound, gamma, iterations, sup_sensitivity, kappa,
#: sensitivity, ...) only has to be listed here.
PUBLIC_CARD_KEYS = (
    # identity of the release: random id and time
    "bundle_id",
    "created_at",
    # what may be queried: from the configuration
    "env_id",
    "state_interval",
    "actions",
    "q_bound",
    # the accountant's result and its inputs (declared, not measured: a client can rerun it)
    "mode",
    "epsilon",
    "delta",
    "delta_total",
    "holds",
    "basis",
    "reason",
    "neighbour",
    "sigma",
    "beta",
    "k",
    "J",
    "privacy",
    "privacy_params",
    "assumptions",
    # the declared Lipschitz bound L (an input of the accountant), never the measured ones
    "lipschitz.bound",
    "lipschitz.with_respect_to",
    "lipschitz.raw_state_bound",
    # provenance: which code, which environment, whether the noise was seeded
    "env_fingerprint",
    "code_version",
    "seeded",
    # fqi: public parameters only. Not dataset_fingerprint: a hash of the private data would
    # let anyone holding a candidate dataset confirm it exactly (it stays in the admin view).
    "users",
    "reward_bound",
    "reward_range",
    "gamma",
    "iterations",
    "sup_sensitivity",
    "kappa",
    "sensitivity",
    "noise_to_value",
    "model",
    "estimator",  # the fqi estimator's public configuration (gamma, grid, bandwidths, ...)
    # kernel estimator (d coordinates): public parameters
    "state_intervals",
    "betas",
    "dims",
    "clipping",
)

#: Top-level fqi card fields that must equal the fqi accountant's result.
_FQI_RESULT_FIELDS = (
    "mode",
    "neighbour",
    "epsilon",
    "delta",
    "delta_total",
    "holds",
    "basis",
    "reason",
    "sigma",
    "beta",
    "kappa",
    "sup_sensitivity",
    "sensitivity",
    "noise_to_value",
)


def _split_allow(keys: Sequence[str]) -> dict[str, set[str] | None]:
    """``PUBLIC_CARD_KEYS`` as {key: None (whole value) | set of public sub-keys}."""
    out: dict[str, set[str] | None] = {}
    for k in keys:
        top, _, sub = k.partition(".")
        if not sub:
            out[top] = None
        elif out.get(top, set()) is not None:
            subs = out.setdefault(top, set())
            assert subs is not None
            subs.add(sub)
    return out


def split_card(card: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(public, admin): the allow-listed part of ``card`` and everything else. A key public
    only in some sub-fields is split (e.g. lipschitz.bound public, lipschitz.measured admin).
    :func:`merge_card` (admin over public) gives the card back."""
    allow = _split_allow(PUBLIC_CARD_KEYS)
    pub: dict[str, Any] = {}
    adm: dict[str, Any] = {}
    for k, v in card.items():
        if k not in allow:
            adm[k] = v
        elif allow[k] is None:
            pub[k] = v
        elif isinstance(v, Mapping):
            subs = allow[k] or set()
            p = {s: x for s, x in v.items() if s in subs}
            a = {s: x for s, x in v.items() if s not in subs}
            if p:
                pub[k] = p
            if a:
                adm[k] = a
        else:
            adm[k] = v  # a value not of the allowed shape is not known to be public
    return json.loads(json.dumps(pub)), json.loads(json.dumps(adm))


def _non_public_paths(card: Mapping[str, Any]) -> list[str]:
    """Fields of ``card`` the allow-list does not make public (``key`` or ``key.sub``)."""
    pub, adm = split_card(card)
    out = []
    for k, v in adm.items():
        if k in pub and isinstance(v, Mapping):
            out += [f"{k}.{s}" for s in v]
        else:
            out.append(k)
    return sorted(out)


def public_card_of(card: Mapping[str, Any]) -> dict[str, Any]:
    """The public projection of a (full) card: :func:`split_card`'s first half."""
    return split_card(card)[0]


def merge_card(public: Mapping[str, Any], admin: Mapping[str, Any]) -> dict[str, Any]:
    """The full card from its two files (mappings present in both are merged one level)."""
    out = dict(public)
    for k, v in admin.items():
        if k in out and isinstance(out[k], Mapping) and isinstance(v, Mapping):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


#: Top-level card fields that must equal the accountant's result (card key -> result key).
_RESULT_FIELDS = {
    "mode": "mode",
    "epsilon": "epsilon",
    "delta": "delta",
    "delta_total": "delta_total",
    "holds": "holds",
    "basis": "basis",
    "reason": "reason",
    "sigma": "sigma",
    "beta": "beta",
    "k": "k",
}

FloatArray = npt.NDArray[np.float64]


# ----------------------------------------------------------------------------- the network
def _layers(weights: Mapping[str, np.ndarray]) -> list[tuple[FloatArray, FloatArray]]:
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
    return _forward(_layers(weights), xs)


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


def _grid_arrays(weights: Mapping[str, np.ndarray]) -> tuple[FloatArray, FloatArray]:
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
    """The fqi release's mean function: values (K, m) at the grid, linear in between."""

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


def _kernel_arrays(
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
    """The d-coordinate fqi release's mean function (issue 16): an additive kernel expansion
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
        from qveil.kfqi import additive_mean

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
    layers = _layers(weights)
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


# ----------------------------------------------------------------------------- the card
def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()


def card_digest(card: Mapping[str, Any]) -> str:
    """sha256 of the card's canonical JSON without its own ``card_sha256`` field."""
    return hashlib.sha256(
        _canonical({k: v for k, v in card.items() if k != "card_sha256"})
    ).hexdigest()


def _jsonable(obj: Any) -> Any:
    """Tuples -> lists, numpy scalars -> Python, recursively (what json.loads gives back)."""
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def build_card(
    *,
    env_id: str,
    interval: tuple[float, float] | StateInterval,
    actions: int,
    hyperparameters: Mapping[str, Any],
    privacy_result: Any,
    lipschitz: float,
    seeded: bool,
    env_fingerprint: str = "",
    code_version: str = "",
    network: Mapping[str, Any] | None = None,
    assumptions: Mapping[str, Sequence[str]] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A card from the accountant's result (``qveil.privacy.PrivacyResult``); the privacy
    numbers are copied from it, never typed. ``write_bundle`` adds bundle_id, created_at,
    weights_sha256, the measured Lipschitz constant and card_sha256."""
    pr = _privacy_dict(privacy_result)
    pp = pr["params"]
    iv = interval if isinstance(interval, StateInterval) else StateInterval(*interval)
    q_bound = None
    if pr["mode"] == "output":
        q_bound = pr.get("bound")
        if q_bound is None:
            q_bound = float(pp["reward_bound"]) / (1.0 - float(pp["gamma"]))
    card: dict[str, Any] = {
        "env_id": env_id,
        "state_interval": [iv.lo, iv.hi],
        "actions": int(actions),
        "hyperparameters": _jsonable(dict(hyperparameters)),
        **{ck: pr.get(rk) for ck, rk in _RESULT_FIELDS.items()},
        "J": int(pp["resets"]),
        "privacy": pr,
        "privacy_params": pp,
        "q_bound": q_bound,
        "lipschitz": {
            "bound": float(lipschitz),
            "with_respect_to": "unit state x in [0, 1]",
            "raw_state_bound": float(lipschitz) / iv.width,
        },
        "assumptions": _jsonable(dict(assumptions or {"enforced": [], "assumed": []})),
        "env_fingerprint": env_fingerprint,
        "code_version": code_version,
        "seeded": bool(seeded),
        "neighbour": (
            "reward functions r, r' of one environment with ||r - r'||_inf <= "
            f"{float(pp.get('reward_sensitivity', 1.0)):g}"
        ),
        "network": _jsonable(
            dict(network or {"activation": "relu", "input": "unit state x in [0, 1]"})
        ),
    }
    if extra:
        card.update(_jsonable(dict(extra)))
    return card


def value_scale_warning(card: Mapping[str, Any]) -> str | None:
    """A loud warning when the release noise sigma exceeds the value scale r0 / (1 - gamma)
    (the largest |Q| a reward bound r0 allows): every answer is then mostly noise and a
    greedy policy read from the release is no better than a random one. None otherwise (or
    when the card has no reward bound / gamma)."""
    pp = card.get("privacy_params") or {}
    try:
        sigma, r0, gamma = float(card["sigma"]), float(pp["reward_bound"]), float(pp["gamma"])
    except (KeyError, TypeError, ValueError):
        return None
    if not (0 <= gamma < 1) or r0 <= 0:
        return None
    scale = r0 / (1.0 - gamma)
    if not sigma > scale:
        return None
    return (
        f"WARNING: the release noise sigma = {sigma:.4g} exceeds the value scale "
        f"r0/(1-gamma) = {r0:g}/(1-{gamma:g}) = {scale:.4g} ({sigma / scale:.3g}x): every "
        "released Q value is mostly noise, and actions chosen from this release will be no "
        "better than random. Raise epsilon (or delta), train on more data (more samples or "
        "users), or accept that this release is for demonstration only."
    )


def nonprivate_privacy(params: Mapping[str, Any]) -> dict[str, Any]:
    """The privacy entry of a sigma = 0 bundle (the non-private baseline): no noise, so no
    guarantee; no epsilon is shown. The accountant's ``PrivacyParams`` refuses sigma = 0, so
    ``params`` is the same field set as a plain dict. beta (needed only by a server that
    would add zero noise anyway) comes from the accountant's own formulas: Theorem 5's
    B / (4 alpha (k+1)) in paper/gdp mode, the sensitivity-minimising L / M in output mode.
    """
    from qveil.privacy.accountant import theorem5_beta
    from qveil.privacy.rkhs import optimal_beta

    pp = _jsonable(dict(params))
    if pp.get("sigma") != 0:
        raise InvalidArgument(f"nonprivate_privacy needs sigma = 0, got {pp.get('sigma')!r}")
    if pp["mode"] == "output":
        bound = float(pp["reward_bound"]) / (1.0 - float(pp["gamma"]))
        beta = optimal_beta(sup_bound=2.0 * bound, lip_bound=2.0 * float(pp["lipschitz"]))
    else:
        bound = None
        beta = theorem5_beta(lr=float(pp["lr"]), k=float(pp["k"]), batch_size=int(pp["batch_size"]))
    d: dict[str, Any] = {
        "mode": pp["mode"],
        "epsilon": None,
        "delta": pp["delta"],
        "delta_total": None,
        "holds": False,
        "sigma": 0.0,
        "beta": beta,
        "k": pp["k"],
        "basis": "none: sigma = 0 adds no noise (the non-private baseline)",
        "reason": "sigma = 0: no noise, hence no differential privacy",
        "params": pp,
    }
    if bound is not None:
        d["bound"] = bound
    return d


def _privacy_dict(result: Any) -> dict[str, Any]:
    d: dict[str, Any] = _jsonable(result if isinstance(result, Mapping) else result.to_dict())
    return d


# ----------------------------------------------------------------------------- writing
def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_log(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    fields: list[str] = []
    for row in rows:
        fields += [k for k in row if k not in fields]
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields or ["episode", "return"])
        w.writeheader()
        for row in rows:
            w.writerow(dict(row))


def _plot_curve(path: Path, rows: Sequence[Mapping[str, Any]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ep = np.array([float(r.get("episode", i)) for i, r in enumerate(rows)])
    ret = np.array([float(r.get("return", np.nan)) for r in rows])
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    if len(ret):
        ax.plot(ep, ret, lw=0.8, alpha=0.5, label="episode return")
        w = min(10, len(ret))
        ax.plot(
            ep[w - 1 :],
            np.convolve(ret, np.ones(w) / w, mode="valid"),
            lw=2,
            label=f"mean of last {w}",
        )
        ax.legend(loc="lower right")
    ax.set_xlabel("episode")
    ax.set_ylabel("return")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_bundle(
    path: str | Path,
    *,
    card: Mapping[str, Any],
    weights: Mapping[str, np.ndarray],
    config_toml: str,
    training_log_rows: Sequence[Mapping[str, Any]],
    learning_curve_png: bytes | None = None,
    curve_title: str | None = None,
    lipschitz_grid: int = 20001,
) -> Path:
    """Write a bundle directory at ``path`` atomically and return its path.

    ``path`` must not exist (or be an empty directory). The card is completed with
    ``bundle_id`` and ``created_at`` (when absent), ``weights_sha256``, the Lipschitz bound
    computed from the weights and the one measured on a grid (both must be <= the card's
    ``lipschitz.bound``, else InvalidArgument and nothing is written), and ``card_sha256``.
    ``learning_curve_png`` defaults to a plot of ``training_log_rows`` (episode, return),
    titled ``curve_title`` (default: env id, sigma and mode from the card).
    """
    out = Path(path)
    _check_empty(out)
    layers = _layers(weights)
    arrays = {
        f"{p}{i}": np.ascontiguousarray(a, dtype=np.float64)
        for i, (w, b) in enumerate(layers)
        for p, a in (("W", w), ("b", b))
    }
    c = _jsonable(dict(card))
    if "lipschitz" not in c or "bound" not in c["lipschitz"]:
        raise InvalidArgument("card: lipschitz.bound (the declared L) is required")
    declared = float(c["lipschitz"]["bound"])
    by_weights = lipschitz_bound(arrays)
    measured = measured_lipschitz(arrays, grid=lipschitz_grid)
    tol = 1e-9 * max(1.0, declared)
    if by_weights > declared + tol or measured > declared + tol:
        raise InvalidArgument(
            f"network is not {declared:g}-Lipschitz in x: bound from weights {by_weights:.6g}, "
            f"measured {measured:.6g}"
        )
    actions = int(c.get("actions", layers[-1][0].shape[0]))
    if layers[-1][0].shape[0] != actions:
        raise InvalidArgument(
            f"card says {actions} actions, network has {layers[-1][0].shape[0]} outputs"
        )
    c["lipschitz"] = {
        **c["lipschitz"],
        "bound_from_weights": by_weights,
        "measured": measured,
        "measured_grid": int(lipschitz_grid),
    }
    c.setdefault("network", {})
    c["network"] = {
        "activation": "relu",
        "input": "unit state x in [0, 1]",
        "layout": "W (out, in); h = h @ W.T + b; ReLU between layers",
        **c["network"],
        "layers": [1] + [int(w.shape[0]) for w, _ in layers],
    }

    return _write_dir(
        out,
        arrays,
        c,
        required=CARD_KEYS,
        config_toml=config_toml,
        training_log_rows=training_log_rows,
        learning_curve_png=learning_curve_png,
        curve_title=curve_title,
    )


def _check_empty(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidArgument(f"bundle path {str(out)!r} already exists and is not empty")


def _write_dir(
    out: Path,
    arrays: Mapping[str, np.ndarray],
    c: dict[str, Any],
    *,
    required: Sequence[str],
    config_toml: str,
    training_log_rows: Sequence[Mapping[str, Any]],
    learning_curve_png: bytes | None,
    curve_title: str | None,
) -> Path:
    """Write the model, the completed card and the record into a temporary sibling
    directory, fsync, and rename it into place (atomic: all or nothing). The directory is
    0700 and every file 0600, whatever the process umask: a bundle holds the un-noised
    model, readable by its owner only."""
    c.setdefault("bundle_id", uuid.uuid4().hex)
    c.setdefault("created_at", datetime.now(UTC).isoformat(timespec="seconds"))
    parent = out.parent
    parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(mode=0o700)
    try:
        os.chmod(tmp, 0o700)  # mkdir's mode is masked by the umask; set it exactly
        with (tmp / WEIGHTS_FILE).open("wb") as fh:
            np.savez(fh, **arrays)  # type: ignore[arg-type]
        c["weights_sha256"] = _sha256_file(tmp / WEIGHTS_FILE)
        missing = [k for k in required if k not in c and k != "card_sha256"]
        if missing:
            raise InvalidArgument(f"card: missing keys {missing}")
        c["card_sha256"] = card_digest(c)
        public, admin = split_card(c)
        (tmp / CARD_FILE).write_text(json.dumps(public, indent=2, sort_keys=True) + "\n")
        (tmp / ADMIN_CARD_FILE).write_text(json.dumps(admin, indent=2, sort_keys=True) + "\n")
        (tmp / CONFIG_FILE).write_text(config_toml)
        _write_log(tmp / LOG_FILE, training_log_rows)
        if learning_curve_png is not None:
            (tmp / CURVE_FILE).write_bytes(learning_curve_png)
        else:
            _plot_curve(
                tmp / CURVE_FILE,
                training_log_rows,
                curve_title
                or f"{c.get('env_id', '')}  sigma={c.get('sigma')}  mode={c.get('mode')}",
            )
        for path in tmp.iterdir():
            os.chmod(path, 0o600)
        for name in FILES:
            with (tmp / name).open("rb") as fh:
                os.fsync(fh.fileno())
        if out.exists():
            out.rmdir()  # empty (checked above); rename needs the name free
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _fqi_card_common(
    pr: dict[str, Any],
    hyperparameters: Mapping[str, Any],
    dataset_fingerprint: str,
    *,
    code_version: str,
    seeded: bool,
) -> dict[str, Any]:
    """The card fields every fqi estimator (grid or kernel) shares, copied from the
    accountant's result ``pr`` and its params."""
    pp = pr["params"]
    lo, hi = pp["reward_range"]
    return {
        "actions": int(pp["actions"]),
        "hyperparameters": _jsonable(dict(hyperparameters)),
        # public: the config's values, never the data's (so a client can rerun the estimator)
        "estimator": _jsonable(dict(hyperparameters)),
        **{k: pr.get(k) for k in _FQI_RESULT_FIELDS},
        "users": int(pp["users"]),
        "reward_range": [float(lo), float(hi)],
        "reward_bound": _reward_bound(pp),
        "gamma": float(pp["gamma"]),
        "iterations": int(pp["iterations"]),
        "privacy": pr,
        "privacy_params": pp,
        "dataset_fingerprint": str(dataset_fingerprint),
        "code_version": code_version,
        "seeded": bool(seeded),
    }


def build_fqi_card(
    *,
    env_id: str,
    interval: tuple[float, float] | StateInterval,
    privacy_result: Any,
    dataset_fingerprint: str,
    hyperparameters: Mapping[str, Any],
    seeded: bool,
    code_version: str = "",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The card of an fqi release, its privacy numbers copied from the fqi accountant's
    result (``qveil.privacy.fqi.FQIPrivacyResult``), never typed."""
    pr = _privacy_dict(privacy_result)
    pp = pr["params"]
    iv = interval if isinstance(interval, StateInterval) else StateInterval(*interval)
    card: dict[str, Any] = {
        "env_id": env_id,
        "state_interval": [iv.lo, iv.hi],
        **_fqi_card_common(
            pr, hyperparameters, dataset_fingerprint, code_version=code_version, seeded=seeded
        ),
        "model": {
            "kind": "grid",
            "grid_points": int(pp["grid_points"]),
            "interpolation": "piecewise-linear",
            "input": "unit state x in [0, 1]",
            "smoother_bandwidth": float(pp["smoother_bandwidth"]),
        },
    }
    if extra:
        card.update(_jsonable(dict(extra)))
    return card


def build_kernel_fqi_card(
    *,
    env_id: str,
    state_intervals: Sequence[Sequence[float]],
    privacy_result: Any,
    dataset_fingerprint: str,
    hyperparameters: Mapping[str, Any],
    seeded: bool,
    code_version: str = "",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The card of a d-coordinate fqi release (kernel estimator), its privacy numbers
    copied from the kernel accountant's result (``qveil.privacy.kfqi``), never typed."""
    from qveil.additive import StateBox

    pr = _privacy_dict(privacy_result)
    pp = pr["params"]
    box = StateBox.of([list(iv) for iv in state_intervals])
    if box.dims != int(pp["dims"]):
        raise InvalidArgument(f"{box.dims} state intervals for a d = {pp['dims']} release")
    card: dict[str, Any] = {
        "env_id": env_id,
        "state_interval": None,
        "state_intervals": box.to_list(),
        "dims": int(pp["dims"]),
        "betas": [float(b) for b in pp["betas"]],
        "clipping": (
            "each state coordinate outside its public interval is clipped into it before the "
            "model and the noise see it (public post-processing)"
        ),
        **_fqi_card_common(
            pr, hyperparameters, dataset_fingerprint, code_version=code_version, seeded=seeded
        ),
        "model": {
            "kind": "additive",
            "dims": int(pp["dims"]),
            "inducing_points": int(pp["inducing_points"]),
            "anchor_points": int(pp["anchor_points"]),
            "lam": float(pp["lam"]),
            "input": "unit state x in [0, 1]^d (each coordinate clipped to its interval)",
        },
    }
    if extra:
        card.update(_jsonable(dict(extra)))
    return card


def _reward_bound(pp: Mapping[str, Any]) -> float:
    """r0 of the card: the reward scale D_T is linear in (user: max(hi,0) - min(lo,0);
    reward: hi - lo)."""
    lo, hi = (float(v) for v in pp["reward_range"])
    return max(hi, 0.0) - min(lo, 0.0) if pp["neighbour"] == "user" else hi - lo


def write_grid_bundle(
    path: str | Path,
    *,
    card: Mapping[str, Any],
    values: npt.ArrayLike,
    config_toml: str,
    training_log_rows: Sequence[Mapping[str, Any]],
    learning_curve_png: bytes | None = None,
    curve_title: str | None = None,
) -> Path:
    """Write an fqi bundle: ``values`` (K, m), the released mean function at the card's
    public grid of K points (x_k = k / (K - 1) on the unit state)."""
    out = Path(path)
    _check_empty(out)
    v = np.ascontiguousarray(values, dtype=np.float64)
    c = _jsonable(dict(card))
    k = int(c["model"]["grid_points"])
    arrays = {"grid": np.linspace(0.0, 1.0, k), "values": v}
    _grid_arrays(arrays)
    if v.shape[1] != int(c["actions"]):
        raise InvalidArgument(f"card says {c['actions']} actions, values have {v.shape[1]}")
    return _write_dir(
        out,
        arrays,
        c,
        required=FQI_CARD_KEYS,
        config_toml=config_toml,
        training_log_rows=training_log_rows,
        learning_curve_png=learning_curve_png,
        curve_title=curve_title,
    )


def write_kernel_bundle(
    path: str | Path,
    *,
    card: Mapping[str, Any],
    alpha: npt.ArrayLike,
    centre: float,
    inducing: npt.ArrayLike,
    config_toml: str,
    training_log_rows: Sequence[Mapping[str, Any]],
    learning_curve_png: bytes | None = None,
) -> Path:
    """Write a d-coordinate fqi bundle (an additive model; see the module docstring). The
    model's betas are the card's (the noise kernel's): one source, no second copy to drift."""
    out = Path(path)
    _check_empty(out)
    c = _jsonable(dict(card))
    arrays = {
        "inducing": np.ascontiguousarray(inducing, dtype=np.float64),
        "betas": np.asarray(c["betas"], dtype=np.float64),
        "alpha": np.ascontiguousarray(alpha, dtype=np.float64),
        "centre": np.asarray(float(centre), dtype=np.float64),
    }
    _kernel_arrays(arrays)
    if arrays["alpha"].shape[0] != int(c["actions"]):
        raise InvalidArgument(
            f"card says {c['actions']} actions, alpha has {arrays['alpha'].shape[0]}"
        )
    return _write_dir(
        out,
        arrays,
        c,
        required=FQI_CARD_KEYS + KERNEL_CARD_KEYS,
        config_toml=config_toml,
        training_log_rows=training_log_rows,
        learning_curve_png=learning_curve_png,
        curve_title=None,
    )


def is_kernel_card(card: Mapping[str, Any]) -> bool:
    """True for a d-coordinate (kernel estimator) fqi card."""
    pp = card.get("privacy_params")
    return card.get("mode") == "fqi" and isinstance(pp, Mapping) and pp.get("estimator") == "kernel"


# ----------------------------------------------------------------------------- reading
def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return bool(a == b)
    if isinstance(a, int | float) and isinstance(b, int | float):
        fa, fb = float(a), float(b)
        if math.isnan(fa) or math.isnan(fb):
            return math.isnan(fa) and math.isnan(fb)
        return fa == fb or math.isclose(fa, fb, rel_tol=1e-9, abs_tol=1e-300)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return set(a) == set(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Paths where a and b differ (for error messages)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{prefix}{k}")
            else:
                out += _diff(a[k], b[k], f"{prefix}{k}.")
        return out
    return [] if _same(a, b) else [prefix.rstrip(".") + f" (card {a!r}, recomputed {b!r})"]


def verify_privacy(card: Mapping[str, Any]) -> dict[str, Any]:
    """Recompute the card's privacy numbers with the accountant; raise IntegrityError on any
    difference. Returns the recomputed ``PrivacyResult.to_dict()`` (for a sigma = 0 bundle:
    :func:`nonprivate_privacy`)."""
    from qveil.privacy import PrivacyParams, account

    pp = card.get("privacy_params")
    if not isinstance(pp, Mapping):
        raise IntegrityError("card: privacy_params is not an object")
    if pp.get("mode") == "fqi":
        return _verify_fqi_privacy(card, pp)
    try:
        if pp.get("sigma") == 0:
            fresh = nonprivate_privacy(pp)
        else:
            fresh = _jsonable(account(PrivacyParams.from_dict(pp)).to_dict())
    except (TypeError, ValueError, KeyError) as exc:
        raise IntegrityError(f"card: privacy_params cannot be accounted: {exc}") from None
    bad = _diff(card.get("privacy"), fresh, "privacy.")
    for ck, rk in _RESULT_FIELDS.items():
        if not _same(card.get(ck), fresh.get(rk)):
            bad.append(f"{ck} (card {card.get(ck)!r}, recomputed {fresh.get(rk)!r})")
    if not _same(card.get("J"), card["privacy_params"].get("resets")):
        bad.append(
            f"J (card {card.get('J')!r}, privacy_params.resets "
            f"{card['privacy_params'].get('resets')!r})"
        )
    if fresh.get("mode") == "output":
        want = fresh.get("bound")
        if want is None:
            pp = card["privacy_params"]
            want = float(pp["reward_bound"]) / (1.0 - float(pp["gamma"]))
        if not _same(card.get("q_bound"), want):
            bad.append(f"q_bound (card {card.get('q_bound')!r}, recomputed {want!r})")
    elif card.get("q_bound") is not None:
        bad.append(f"q_bound (card {card.get('q_bound')!r}, must be null outside output mode)")
    if bad:
        raise IntegrityError(
            "privacy card does not match the accountant's recomputation: " + "; ".join(bad)
        )
    return fresh


def _verify_fqi_privacy(card: Mapping[str, Any], pp: Mapping[str, Any]) -> dict[str, Any]:
    """verify_privacy for an fqi card: every number recomputed by the fqi accountant (kappa
    from the map's parameters, D_T from the relation, epsilon from sigma)."""
    from qveil.privacy.fqi import account_params

    kernel = pp.get("estimator") == "kernel"
    try:
        fresh: dict[str, Any] = _jsonable(account_params(pp).to_dict())
    except (TypeError, ValueError, KeyError) as exc:
        raise IntegrityError(f"card: privacy_params cannot be accounted: {exc}") from None
    recorded = card.get("privacy")
    if isinstance(recorded, Mapping):  # calibration's target is a record, not a result
        recorded = {k: v for k, v in recorded.items() if k != "target"}
    bad = _diff(recorded, fresh, "privacy.")
    for key in _FQI_RESULT_FIELDS:
        if not _same(card.get(key), fresh.get(key)):
            bad.append(f"{key} (card {card.get(key)!r}, recomputed {fresh.get(key)!r})")
    for key, want in (
        ("users", pp["users"]),
        ("gamma", pp["gamma"]),
        ("iterations", pp["iterations"]),
        ("actions", pp["actions"]),
        ("reward_range", list(pp["reward_range"])),
        ("reward_bound", _reward_bound(pp)),
    ):
        if not _same(card.get(key), want):
            bad.append(f"{key} (card {card.get(key)!r}, privacy_params {want!r})")
    model = card.get("model")
    if kernel:
        for key, want in (("betas", list(pp["betas"])), ("dims", pp["dims"])):
            if not _same(card.get(key), want):
                bad.append(f"{key} (card {card.get(key)!r}, privacy_params {want!r})")
        si = card.get("state_intervals")
        if not isinstance(si, list) or len(si) != pp["dims"]:
            bad.append("state_intervals (not one [lo, hi] per coordinate)")
        if not isinstance(model, Mapping) or any(
            model.get(k) != pp[k] for k in ("inducing_points", "anchor_points", "lam")
        ):
            bad.append("model (inducing_points, anchor_points or lam differ from privacy_params)")
    elif not isinstance(model, Mapping) or model.get("grid_points") != pp["grid_points"]:
        bad.append("model.grid_points (differs from privacy_params.grid_points)")
    if bad:
        raise IntegrityError(
            "privacy card does not match the accountant's recomputation: " + "; ".join(bad)
        )
    return fresh


@dataclass(frozen=True, eq=False)
class Bundle:
    """A loaded release bundle. ``q_values`` is the bare (clamped) network; the server adds
    the noise g_a(x) with ``sigma`` and ``beta`` on the unit state."""

    path: Path
    card: dict[str, Any]
    weights: dict[str, np.ndarray] = field(repr=False)

    @property
    def bundle_id(self) -> str:
        return str(self.card["bundle_id"])

    @property
    def kernel(self) -> bool:
        """A d-coordinate release (issue 16): ``box``, ``betas``; no 1-D interval or beta."""
        return is_kernel_card(self.card)

    @property
    def dims(self) -> int:
        return int(self.card["dims"]) if self.kernel else 1

    @property
    def interval(self) -> StateInterval:
        if self.kernel:
            raise InvalidArgument(
                f"release {self.card.get('bundle_id')} has {self.dims} state coordinates, "
                "no 1-D interval: use box (state_intervals; issue 16 part 2)"
            )
        lo, hi = self.card["state_interval"]
        return StateInterval(lo, hi)

    @property
    def box(self) -> Any:
        """The public per-coordinate intervals (:class:`qveil.additive.StateBox`)."""
        from qveil.additive import StateBox

        if self.kernel:
            return StateBox.of(self.card["state_intervals"])
        return StateBox((self.interval,))

    @property
    def betas(self) -> tuple[float, ...]:
        """beta_j of the release noise, one per coordinate."""
        if self.kernel:
            return tuple(float(b) for b in self.card["betas"])
        return (self.beta,)

    @property
    def n_actions(self) -> int:
        return int(self.card["actions"])

    @property
    def sigma(self) -> float:
        """sigma of the RELEASE noise (output mode: that mode's sigma)."""
        return float(self.card["sigma"])

    @property
    def beta(self) -> float:
        """beta of the RELEASE noise on [0, 1] (1-D releases; d > 1: :attr:`betas`)."""
        if self.kernel:
            raise InvalidArgument(
                f"release {self.card.get('bundle_id')} has one beta per coordinate (betas)"
            )
        return float(self.card["beta"])

    @property
    def q_bound(self) -> float | None:
        qb = self.card.get("q_bound")
        return None if qb is None else float(qb)

    @property
    def env_id(self) -> str:
        return str(self.card["env_id"])

    @property
    def seeded(self) -> bool:
        return bool(self.card.get("seeded"))

    @functools.cached_property
    def model(self) -> Model:
        """The served model, its arrays checked once (not on every query)."""
        if self.kernel:
            u, b, a, c = _kernel_arrays(self.weights)
            return KernelModel(inducing=u, betas=b, alpha=a, centre=c)
        if self.card.get("mode") == "fqi":
            g, v = _grid_arrays(self.weights)
            return GridModel(grid=g, values=v)
        return MLPModel(layers=_layers(self.weights), q_bound=self.q_bound)

    def q_values_unit(self, xs: npt.ArrayLike) -> FloatArray:
        """Q values (n, m) at unit states (validated in [0, 1]); an MLP is clamped to
        +-q_bound."""
        if self.kernel:
            from qveil.additive import validate_unit_points

            return self.model.q_values_unit(validate_unit_points(xs, self.dims))
        return self.model.q_values_unit(validate_unit_states(xs))

    def q_values(self, states: npt.ArrayLike) -> FloatArray:
        """Q values (n, m) at raw states (validated against the interval: InvalidArgument;
        d > 1: (n, d) states, each coordinate clipped into its public interval)."""
        if self.kernel:
            return self.q_values_unit(self.box.to_unit(states, clip=True))
        return self.q_values_unit(self.interval.to_unit(states))

    def to_unit(self, states: npt.ArrayLike) -> FloatArray:
        """Raw states -> unit states (validated against the interval)."""
        x: FloatArray = self.interval.to_unit(states)
        return x

    def public_card(self) -> dict[str, Any]:
        """What a query client may see: the allow-list :data:`PUBLIC_CARD_KEYS` applied to
        the card (no weights, their hash, measured constants, layout or noise)."""
        return public_card_of(self.card)

    def admin_card(self) -> dict[str, Any]:
        """Everything the public card leaves out (the admin role's view)."""
        return split_card(self.card)[1]


def _read_card(p: Path, name: str) -> dict[str, Any]:
    try:
        card = json.loads((p / name).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"bundle {str(p)!r}: {name} is not valid JSON: {exc}") from None
    if not isinstance(card, dict):
        raise InvalidArgument(f"bundle {str(p)!r}: {name} is not an object")
    return card


# ----------------------------------------------------------------------------- binding
def release_fingerprint(path: str | Path) -> str:
    """sha256 over the bundle's model and card files: ``weights.npz`` and every ``*.json`` of
    the bundle except ``binding.json`` (so a card split into several files is covered too),
    each as ``name NUL sha256(content) LF`` in name order. Two bundles with the same release id
    but any other weights or card have different fingerprints; binding the bundle does not
    change it."""
    p = Path(path)
    names = [WEIGHTS_FILE] + sorted(
        f.name for f in p.glob("*.json") if f.is_file() and f.name != BINDING_FILE
    )
    h = hashlib.sha256(b"qveil.release-fingerprint.v1\n")
    for name in names:
        h.update(f"{name}\0{_sha256_file(p / name)}\n".encode())
    return h.hexdigest()


@dataclass(frozen=True)
class Binding:
    """``binding.json``: the store that holds this release's noise, and the registry that
    records it (one release, one noise lineage: ``qveil.server.registry``). Written by
    ``qveil train`` with the bundle, or by the first bind of a bundle the library wrote;
    rewritten only by a legitimate move (an import). Its ``checksum`` covers every field and
    the release fingerprint, so a copied, edited or deleted binding is refused."""

    release_id: str
    fingerprint: str
    store_id: str
    store: str  # the store URL at binding time, password redacted (for people, not checked)
    bound_at: str
    registry_id: str

    def checksum(self) -> str:
        h = hashlib.sha256(b"qveil.binding.v2\n")
        for k in _BINDING_KEYS:
            h.update(f"{k}\0{getattr(self, k)}\n".encode())
        return h.hexdigest()

    def to_dict(self) -> dict[str, str]:
        return {
            "format": BINDING_FORMAT,
            **{k: getattr(self, k) for k in _BINDING_KEYS},
            "checksum": self.checksum(),
        }


_BINDING_KEYS = ("release_id", "fingerprint", "store_id", "store", "bound_at", "registry_id")


def read_binding(path: str | Path) -> Binding | None:
    """The bundle's binding, or None when it has none (or only a binding of the earlier,
    unchecksummed format, which the registry's record replaces). A present but malformed or
    edited file is an IntegrityError (never silently treated as unbound)."""
    f = Path(path) / BINDING_FILE
    if not f.exists():
        return None
    try:
        d = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IntegrityError(f"bundle {str(path)!r}: {BINDING_FILE} is unreadable: {exc}") from None
    if isinstance(d, dict) and d.get("format") == "qveil.binding.v1":
        return None
    if (
        not isinstance(d, dict)
        or d.get("format") != BINDING_FORMAT
        or not all(isinstance(d.get(k), str) for k in (*_BINDING_KEYS, "checksum"))
    ):
        raise IntegrityError(
            f"bundle {str(path)!r}: {BINDING_FILE} is not a {BINDING_FORMAT} record"
        )
    b = Binding(*(str(d[k]) for k in _BINDING_KEYS))
    if b.checksum() != d["checksum"]:
        raise IntegrityError(
            f"bundle {str(path)!r}: {BINDING_FILE} was edited (its checksum does not match): a "
            "binding is written only by qveil train, the first bind, or qveil admin "
            "import-release"
        )
    return b


def write_binding(path: str | Path, binding: Binding) -> None:
    """Write ``binding.json`` atomically and durably: a unique temporary file, fsync, rename over
    the old name, fsync of the directory. Concurrent writers of the same binding (replicas
    starting together) are harmless: each rename installs a complete file."""
    p = Path(path)
    tmp = p / f".{BINDING_FILE}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with tmp.open("w") as fh:
            fh.write(json.dumps(binding.to_dict(), indent=2, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p / BINDING_FILE)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_bundle(path: str | Path, *, verify: bool = True) -> Bundle:
    """Load a bundle; with ``verify`` check weights, card checksum, Lipschitz bound and the
    privacy numbers (recomputed by the accountant). Raises NotFound, InvalidArgument
    (malformed) or IntegrityError (a mismatch, named)."""
    p = Path(path)
    if not p.is_dir():
        raise NotFound(f"bundle {str(p)!r} does not exist (or is not a directory)")
    for name in (CARD_FILE, WEIGHTS_FILE):
        if not (p / name).is_file():
            raise InvalidArgument(f"bundle {str(p)!r} has no {name}")
    card = _read_card(p, CARD_FILE)
    if (p / ADMIN_CARD_FILE).is_file():
        public = card
        card = merge_card(public, _read_card(p, ADMIN_CARD_FILE))
        leaked = _non_public_paths(public)
        if leaked:
            raise IntegrityError(
                f"bundle {str(p)!r}: card.json holds non-public fields {leaked[:8]} "
                f"(they belong in {ADMIN_CARD_FILE})"
            )
    # else: a bundle written before issue 14 (one card.json holding everything); it loads,
    # and only its public projection is ever served
    fqi = card.get("mode") == "fqi"
    kernel = is_kernel_card(card)
    required = FQI_CARD_KEYS + KERNEL_CARD_KEYS if kernel else FQI_CARD_KEYS if fqi else CARD_KEYS
    missing = [k for k in required if k not in card]
    if missing:
        raise InvalidArgument(f"bundle {str(p)!r}: card lacks {missing}")
    if verify:
        digest = card_digest(card)
        if digest != card["card_sha256"]:
            raise IntegrityError(
                f"bundle {str(p)!r}: card.json or {ADMIN_CARD_FILE} was modified (card_sha256 "
                f"{card['card_sha256']!r}, content hashes to {digest!r})"
            )
        sha = _sha256_file(p / WEIGHTS_FILE)
        if sha != card["weights_sha256"]:
            raise IntegrityError(
                f"bundle {str(p)!r}: weights.npz sha256 {sha} does not match "
                f"the card's weights_sha256 {card['weights_sha256']}"
            )
    try:
        with np.load(p / WEIGHTS_FILE, allow_pickle=False) as npz:
            weights = {k: np.asarray(npz[k], dtype=np.float64) for k in npz.files}
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"bundle {str(p)!r}: weights.npz unreadable: {exc}") from None
    if kernel:
        _, kb, ka, _ = _kernel_arrays(weights)
        outputs = ka.shape[0]
        if verify and not _same(kb.tolist(), card.get("betas")):
            raise IntegrityError(
                f"bundle {str(p)!r}: the model's betas {kb.tolist()} are not the noise's "
                f"{card.get('betas')!r} (the release map must be in the noise kernel's RKHS)"
            )
    elif fqi:
        outputs = _grid_arrays(weights)[1].shape[1]
    else:
        outputs = _layers(weights)[-1][0].shape[0]
    if outputs != int(card["actions"]):
        raise InvalidArgument(
            f"bundle {str(p)!r}: card says {card['actions']} actions, model has {outputs} outputs"
        )
    if kernel:
        from qveil.additive import StateBox

        StateBox.of(card["state_intervals"])
    else:
        StateInterval(*card["state_interval"])
    if verify:
        if not fqi:
            declared = float(card["privacy_params"]["lipschitz"])
            bound = lipschitz_bound(weights)
            if bound > declared * (1 + 1e-9):
                raise IntegrityError(
                    f"bundle {str(p)!r}: network Lipschitz bound {bound:.6g} "
                    f"exceeds the L={declared:g} the privacy rests on"
                )
        verify_privacy(card)
    return Bundle(path=p, card=card, weights=weights)
