"""A bundle's files: writing a bundle directory atomically (owner-only), and reading one back
into a :class:`Bundle` (verified by :mod:`qveil.bundle.verify` unless asked not to)."""

from __future__ import annotations

import csv
import functools
import json
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt

from qveil.additive import StateBox, validate_unit_points
from qveil.bundle.card import (
    CARD_KEYS,
    FQI_CARD_KEYS,
    KERNEL_CARD_KEYS,
    card_betas,
    card_box,
    card_digest,
    is_kernel_card,
    jsonable,
    merge_card,
    non_public_paths,
    public_card_of,
    split_card,
)
from qveil.bundle.layout import (
    ADMIN_CARD_FILE,
    CARD_FILE,
    CONFIG_FILE,
    CURVE_FILE,
    FILES,
    KEY_FILE,
    LOG_FILE,
    WEIGHTS_FILE,
    sha256_bytes,
    sha256_file,
)
from qveil.bundle.models import (
    FloatArray,
    GridModel,
    KernelModel,
    MLPModel,
    Model,
    grid_arrays,
    kernel_arrays,
    layers_of,
    lipschitz_bound,
    measured_lipschitz,
)
from qveil.bundle.verify import check_digests, check_model
from qveil.errors import FailedPrecondition, IntegrityError, InvalidArgument, NotFound
from qveil.json_types import JSONMapping, JSONObject
from qveil.keyed import GRID_LEVELS, KEY_BYTES, KeyedPaths, new_key
from qveil.noise import StateInterval

__all__ = [
    "NOISE_PATH_CARD",
    "Bundle",
    "load_bundle",
    "plot_curve",
    "write_bundle",
    "write_kernel_bundle",
]


#: the public card's description of how the noise is evaluated (docs/privacy.md section 10)
NOISE_PATH_CARD: JSONObject = {
    "construction": "keyed midpoint (Levy) construction of each Ornstein-Uhlenbeck path",
    "grid_levels": GRID_LEVELS,
    "grid": f"each unit coordinate snapped to the nearest i 2^-{GRID_LEVELS}; the mean is "
    "evaluated at the snapped state too: the Gaussian-process mechanism at grid points",
    "prf": "AES-256 on counter blocks, 53-bit uniforms through the inverse normal CDF",
    "key": "one key per release, drawn once from OS entropy at train (computational "
    "guarantee: the PRF)",
}


def _write_log(path: Path, rows: Sequence[JSONMapping]) -> None:
    fields: list[str] = []
    for row in rows:
        fields += [k for k in row if k not in fields]
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields or ["episode", "return"])
        w.writeheader()
        for row in rows:
            w.writerow(dict(row))


def plot_curve(path: Path, rows: Sequence[JSONMapping], title: str) -> None:
    # matplotlib loads only when a plot is drawn (a heavy import)
    import matplotlib

    matplotlib.use("Agg")
    # pyplot after matplotlib.use('Agg') above: no display is needed
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
    card: JSONMapping,
    weights: Mapping[str, np.ndarray],
    config_toml: str,
    training_log_rows: Sequence[JSONMapping],
    learning_curve_png: bytes | None = None,
    curve_title: str | None = None,
    lipschitz_grid: int = 20001,
    noise_key: bytes | None = None,
) -> Path:
    """Write a bundle directory at ``path`` atomically and return its path.

    ``path`` must not exist (or be an empty directory). The card is completed with
    ``bundle_id`` and ``created_at`` (when absent), ``weights_sha256``, the Lipschitz bound
    computed from the weights and the one measured on a grid (both must be <= the card's
    ``lipschitz.bound``, else InvalidArgument and nothing is written), and ``card_sha256``.
    ``learning_curve_png`` defaults to a plot of ``training_log_rows`` (episode, return),
    titled ``curve_title`` (default: env id, sigma and mode from the card). ``noise_key``:
    the release's noise key (None: drawn here from OS entropy, the release default; a
    seeded key is for tests and experiments, whose card says ``seeded``).
    """
    out = Path(path)
    _check_empty(out)
    layers = layers_of(weights)
    arrays = {
        f"{p}{i}": np.ascontiguousarray(a, dtype=np.float64)
        for i, (w, b) in enumerate(layers)
        for p, a in (("W", w), ("b", b))
    }
    c = jsonable(dict(card))
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
        noise_key=noise_key,
    )


def _check_empty(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidArgument(f"bundle path {str(out)!r} already exists and is not empty")


def _write_dir(
    out: Path,
    arrays: Mapping[str, np.ndarray],
    c: JSONObject,
    *,
    required: Sequence[str],
    config_toml: str,
    training_log_rows: Sequence[JSONMapping],
    learning_curve_png: bytes | None,
    curve_title: str | None,
    noise_key: bytes | None,
) -> Path:
    """Write the model, the noise key, the completed card and the record into a temporary
    sibling directory, fsync, and rename it into place (atomic: all or nothing). The
    directory is 0700 and every file 0600, whatever the process umask: a bundle holds the
    un-noised model and the noise key, readable by their owner only."""
    key = new_key() if noise_key is None else noise_key
    if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        raise InvalidArgument(f"a noise key is {KEY_BYTES} bytes")
    c.setdefault("bundle_id", uuid.uuid4().hex)
    c["noise_path"] = NOISE_PATH_CARD
    c.setdefault("created_at", datetime.now(UTC).isoformat(timespec="seconds"))
    parent = out.parent
    parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(mode=0o700)
    try:
        os.chmod(tmp, 0o700)  # mkdir's mode is masked by the umask; set it exactly
        with (tmp / WEIGHTS_FILE).open("wb") as fh:
            np.savez(fh, **arrays)  # type: ignore[arg-type]
        c["weights_sha256"] = sha256_file(tmp / WEIGHTS_FILE)
        fd = os.open(tmp / KEY_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(key)
        c["key_sha256"] = sha256_bytes(key)
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
            plot_curve(
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


def write_kernel_bundle(
    path: str | Path,
    *,
    card: JSONMapping,
    alpha: npt.ArrayLike,
    centre: float,
    inducing: npt.ArrayLike,
    config_toml: str,
    training_log_rows: Sequence[JSONMapping],
    learning_curve_png: bytes | None = None,
    noise_key: bytes | None = None,
) -> Path:
    """Write a d-coordinate fqi bundle (an additive model; see the module docstring). The
    model's betas are the card's (the noise kernel's): one source, no second copy to drift.
    ``noise_key`` as in :func:`write_bundle`."""
    out = Path(path)
    _check_empty(out)
    c = jsonable(dict(card))
    arrays = {
        "inducing": np.ascontiguousarray(inducing, dtype=np.float64),
        "betas": np.asarray(c["betas"], dtype=np.float64),
        "alpha": np.ascontiguousarray(alpha, dtype=np.float64),
        "centre": np.asarray(float(centre), dtype=np.float64),
    }
    kernel_arrays(arrays)
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
        noise_key=noise_key,
    )


@dataclass(frozen=True, eq=False)
class Bundle:
    """A loaded release bundle. ``q_values`` is the bare (clamped) mean at [n, d] states; the
    server adds the noise sum_j g_{a,j}(x_j) with ``sigma`` and ``betas`` on the unit state."""

    path: Path
    card: JSONObject
    weights: dict[str, np.ndarray] = field(repr=False)
    #: the release's noise key (secret, like the weights)
    noise_key: bytes = field(repr=False, default=b"")

    @property
    def bundle_id(self) -> str:
        return str(self.card["bundle_id"])

    @property
    def kernel(self) -> bool:
        """An additive (fqi) model: ``model`` carries the betas of every coordinate."""
        return is_kernel_card(self.card)

    @property
    def dims(self) -> int:
        """d, the state's coordinates (1 for a card that names one ``state_interval``)."""
        return self.box.dims

    @functools.cached_property
    def box(self) -> StateBox:
        """The public per-coordinate intervals (:class:`qveil.additive.StateBox`): states
        outside are clipped into them, for every release (d = 1 is a box of one interval)."""
        return card_box(self.card)

    @property
    def interval(self) -> StateInterval:
        """The one interval of a d = 1 release (InvalidArgument for d > 1: use :attr:`box`)."""
        if self.dims != 1:
            raise InvalidArgument(
                f"release {self.card.get('bundle_id')} has {self.dims} state coordinates, "
                "no 1-D interval: use box (state_intervals)"
            )
        iv: StateInterval = self.box.intervals[0]
        return iv

    @property
    def betas(self) -> tuple[float, ...]:
        """beta_j of the release noise, one per coordinate."""
        return card_betas(self.card)

    @property
    def n_actions(self) -> int:
        return int(self.card["actions"])

    @property
    def sigma(self) -> float:
        """sigma of the RELEASE noise (output mode: that mode's sigma)."""
        return float(self.card["sigma"])

    @property
    def beta(self) -> float:
        """beta of the RELEASE noise on [0, 1] of a d = 1 release (d > 1: :attr:`betas`)."""
        if self.dims != 1:
            raise InvalidArgument(
                f"release {self.card.get('bundle_id')} has one beta per coordinate (betas)"
            )
        return self.betas[0]

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
            u, b, a, c = kernel_arrays(self.weights)
            return KernelModel(inducing=u, betas=b, alpha=a, centre=c)
        if self.card.get("mode") == "fqi":
            g, v = grid_arrays(self.weights)
            return GridModel(grid=g, values=v)
        return MLPModel(layers=layers_of(self.weights), q_bound=self.q_bound)

    @functools.cached_property
    def noise_paths(self) -> KeyedPaths:
        """Every noise path of the release, a pure function of its key (path a * d + j)."""
        return KeyedPaths(
            key=self.noise_key, betas=self.betas, sigma=self.sigma, n_actions=self.n_actions
        )

    def q_values_unit(self, xs: npt.ArrayLike) -> FloatArray:
        """Q values (n, m) at unit states (n, d) (validated in [0, 1]; with d = 1 a flat list
        is n states); an MLP is clamped to +-q_bound."""
        return self.model.q_values_unit(validate_unit_points(xs, self.dims))

    def q_values(self, states: npt.ArrayLike) -> FloatArray:
        """Q values (n, m) at raw states (n, d), each coordinate clipped into its public
        interval (the one out-of-interval rule of every release)."""
        return self.q_values_unit(self.box.to_unit(states, clip=True))

    def public_card(self) -> JSONObject:
        """What a query client may see: the allow-list :data:`PUBLIC_CARD_KEYS` applied to
        the card (no weights, their hash, measured constants, layout or noise)."""
        return public_card_of(self.card)

    def admin_card(self) -> JSONObject:
        """Everything the public card leaves out (the admin role's view)."""
        return split_card(self.card)[1]


def _read_card(p: Path, name: str) -> JSONObject:
    try:
        card = json.loads((p / name).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"bundle {str(p)!r}: {name} is not valid JSON: {exc}") from None
    if not isinstance(card, dict):
        raise InvalidArgument(f"bundle {str(p)!r}: {name} is not an object")
    return card


def _read_key(p: Path, where: str) -> bytes:
    """The bundle's noise key; a bundle without one was written before keyed noise."""
    f = p / KEY_FILE
    if not f.is_file():
        raise FailedPrecondition(
            f"{where} has no {KEY_FILE}: it was written before releases carried their noise "
            "key and cannot be served; train a new release with `qveil train`"
        )
    key = f.read_bytes()
    if len(key) != KEY_BYTES:
        raise IntegrityError(f"{where}: {KEY_FILE} is not a {KEY_BYTES}-byte key")
    return key


def load_bundle(path: str | Path, *, verify: bool = True) -> Bundle:
    """Load a bundle; with ``verify`` check weights, card checksum, Lipschitz bound and the
    privacy numbers (recomputed by the accountant: :mod:`qveil.bundle.verify`). Raises
    NotFound, InvalidArgument (malformed) or IntegrityError (a mismatch, named)."""
    p = Path(path)
    where = f"bundle {str(p)!r}"
    if not p.is_dir():
        raise NotFound(f"{where} does not exist (or is not a directory)")
    for name in (CARD_FILE, WEIGHTS_FILE):
        if not (p / name).is_file():
            raise InvalidArgument(f"{where} has no {name}")
    key = _read_key(p, where)
    card = _read_card(p, CARD_FILE)
    if (p / ADMIN_CARD_FILE).is_file():
        public = card
        card = merge_card(public, _read_card(p, ADMIN_CARD_FILE))
        leaked = non_public_paths(public)
        if leaked:
            raise IntegrityError(
                f"{where}: card.json holds non-public fields {leaked[:8]} "
                f"(they belong in {ADMIN_CARD_FILE})"
            )
    # else: a bundle with one card.json holding everything (the earliest layout); it loads,
    # and only its public projection is ever served
    fqi = card.get("mode") == "fqi"
    kernel = is_kernel_card(card)
    required = FQI_CARD_KEYS + KERNEL_CARD_KEYS if kernel else FQI_CARD_KEYS if fqi else CARD_KEYS
    missing = [k for k in required if k not in card]
    if missing:
        raise InvalidArgument(f"{where}: card lacks {missing}")
    if verify:
        check_digests(card, sha256_file(p / WEIGHTS_FILE), where=where)
        if sha256_bytes(key) != card["key_sha256"]:
            raise IntegrityError(
                f"{where}: {KEY_FILE} is not the key the release was written with (its sha256 "
                "does not match the card's key_sha256): a release has one key, for good"
            )
    try:
        with np.load(p / WEIGHTS_FILE, allow_pickle=False) as npz:
            weights = {k: np.asarray(npz[k], dtype=np.float64) for k in npz.files}
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"{where}: weights.npz unreadable: {exc}") from None
    if kernel:
        outputs = kernel_arrays(weights)[2].shape[0]
    elif fqi:
        outputs = grid_arrays(weights)[1].shape[1]
    else:
        outputs = layers_of(weights)[-1][0].shape[0]
    if outputs != int(card["actions"]):
        raise InvalidArgument(
            f"{where}: card says {card['actions']} actions, model has {outputs} outputs"
        )
    card_box(card)  # the public intervals parse (InvalidArgument otherwise)
    if verify:
        check_model(card, weights, where=where)
    return Bundle(path=p, card=card, weights=weights, noise_key=key)
