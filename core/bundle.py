"""Release bundles: the trained network, its privacy card and its training record.

A bundle is a directory written once, atomically (a temporary sibling directory renamed into
place), by the trainer, and read by the server. It holds

* ``weights.npz``: ``W0, b0, W1, b1, ...`` of an MLP on the UNIT state x in [0, 1] (input
  shape (1,)) with m outputs; each W has shape (out, in), a layer is ``h @ W.T + b`` and
  ReLU sits between layers (``card["network"]["activation"]``);
* ``card.json``: what was released and under which guarantee (see :data:`CARD_KEYS`);
* ``config.toml`` (the training configuration), ``training_log.csv`` (per-episode return)
  and ``learning_curve.png``.

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
from typing import Any

import numpy as np
import numpy.typing as npt

from qveil.errors import IntegrityError, InvalidArgument, NotFound
from qveil.noise import StateInterval, validate_unit_states

__all__ = [
    "CARD_KEYS",
    "PUBLIC_CARD_KEYS",
    "Bundle",
    "build_card",
    "card_digest",
    "lipschitz_bound",
    "load_bundle",
    "measured_lipschitz",
    "mlp_forward",
    "nonprivate_privacy",
    "verify_privacy",
    "write_bundle",
]

WEIGHTS_FILE = "weights.npz"
CARD_FILE = "card.json"
CONFIG_FILE = "config.toml"
LOG_FILE = "training_log.csv"
CURVE_FILE = "learning_curve.png"
FILES = (WEIGHTS_FILE, CARD_FILE, CONFIG_FILE, LOG_FILE, CURVE_FILE)

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

#: What ordinary clients may see: no weights (nor their hash), no noise values.
PUBLIC_CARD_KEYS = (
    "bundle_id",
    "env_id",
    "state_interval",
    "actions",
    "mode",
    "epsilon",
    "delta",
    "delta_total",
    "holds",
    "basis",
    "reason",
    "sigma",
    "beta",
    "k",
    "J",
    "q_bound",
    "lipschitz",
    "assumptions",
    "privacy",
    "privacy_params",
    "hyperparameters",
    "env_fingerprint",
    "created_at",
    "code_version",
    "seeded",
)

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
        "network": _jsonable(
            dict(network or {"activation": "relu", "input": "unit state x in [0, 1]"})
        ),
    }
    if extra:
        card.update(_jsonable(dict(extra)))
    return card


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
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidArgument(f"bundle path {str(out)!r} already exists and is not empty")
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
    c.setdefault("bundle_id", uuid.uuid4().hex)
    c.setdefault("created_at", datetime.now(UTC).isoformat(timespec="seconds"))
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

    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        with (tmp / WEIGHTS_FILE).open("wb") as fh:
            np.savez(fh, **arrays)  # type: ignore[arg-type]
        c["weights_sha256"] = _sha256_file(tmp / WEIGHTS_FILE)
        missing = [k for k in CARD_KEYS if k not in c and k != "card_sha256"]
        if missing:
            raise InvalidArgument(f"card: missing keys {missing}")
        c["card_sha256"] = card_digest(c)
        (tmp / CARD_FILE).write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")
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
    def interval(self) -> StateInterval:
        lo, hi = self.card["state_interval"]
        return StateInterval(lo, hi)

    @property
    def n_actions(self) -> int:
        return int(self.card["actions"])

    @property
    def sigma(self) -> float:
        """sigma of the RELEASE noise (output mode: that mode's sigma)."""
        return float(self.card["sigma"])

    @property
    def beta(self) -> float:
        """beta of the RELEASE noise on [0, 1]."""
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
    def _checked_layers(self) -> list[tuple[FloatArray, FloatArray]]:
        """The weights checked once (shapes, finiteness), not on every query."""
        return _layers(self.weights)

    def q_values_unit(self, xs: npt.ArrayLike) -> FloatArray:
        """Q values (n, m) at unit states (validated in [0, 1]), clamped to +-q_bound."""
        x = validate_unit_states(xs)
        q = _forward(self._checked_layers, x)
        qb = self.q_bound
        if qb is not None:
            np.clip(q, -qb, qb, out=q)
        return q

    def q_values(self, states: npt.ArrayLike) -> FloatArray:
        """Q values (n, m) at raw states (validated against the interval: InvalidArgument)."""
        return self.q_values_unit(self.interval.to_unit(states))

    def to_unit(self, states: npt.ArrayLike) -> FloatArray:
        """Raw states -> unit states (validated against the interval)."""
        x: FloatArray = self.interval.to_unit(states)
        return x

    def public_card(self) -> dict[str, Any]:
        """The card without weights, their hash, or noise: a fixed whitelist of keys."""
        pub: dict[str, Any] = json.loads(
            json.dumps({k: self.card[k] for k in PUBLIC_CARD_KEYS if k in self.card})
        )
        return pub


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
    try:
        card = json.loads((p / CARD_FILE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"bundle {str(p)!r}: card.json is not valid JSON: {exc}") from None
    if not isinstance(card, dict):
        raise InvalidArgument(f"bundle {str(p)!r}: card.json is not an object")
    missing = [k for k in CARD_KEYS if k not in card]
    if missing:
        raise InvalidArgument(f"bundle {str(p)!r}: card lacks {missing}")
    if verify:
        digest = card_digest(card)
        if digest != card["card_sha256"]:
            raise IntegrityError(
                f"bundle {str(p)!r}: card.json was modified (card_sha256 "
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
    layers = _layers(weights)
    if layers[-1][0].shape[0] != int(card["actions"]):
        raise InvalidArgument(
            f"bundle {str(p)!r}: card says {card['actions']} actions, "
            f"network has {layers[-1][0].shape[0]} outputs"
        )
    StateInterval(*card["state_interval"])
    if verify:
        declared = float(card["privacy_params"]["lipschitz"])
        bound = lipschitz_bound(weights)
        if bound > declared * (1 + 1e-9):
            raise IntegrityError(
                f"bundle {str(p)!r}: network Lipschitz bound {bound:.6g} "
                f"exceeds the L={declared:g} the privacy rests on"
            )
        verify_privacy(card)
    return Bundle(path=p, card=card, weights=weights)
