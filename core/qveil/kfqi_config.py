"""The public configuration of an `fqi` release (the kernel estimator, states of d >= 1
coordinates) and its privacy plan, from public quantities only, before any data is touched.

A config file says ``estimator = "kernel"`` (configs/cartpole-private.toml). A file that
says ``estimator = "grid"``, or names no estimator (the 1-D form: ``state_interval``,
``grid_points``, ``beta``), is read as the same estimator with
d = 1 by :func:`grid_config`: the G anchors of one coordinate, the OU kernel
exp(-beta |x - y|), and the 1-D defaults of :data:`GRID_DEFAULTS`. So
``qveil train --mode fqi --config FILE`` and ``qveil privacy --mode fqi --config FILE``
take both forms, and :func:`default_config` is ``--mode fqi`` without a file. No torch, no
gymnasium.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from qveil.errors import InvalidArgument
from qveil.fqi_config import TOMLTable, config_from_dict, config_toml, read_toml
from qveil.kfqi import KernelFQISpec
from qveil.kfqi_anchors import AnchorSet, read_anchors
from qveil.privacy.fqi import FQIPrivacyResult
from qveil.privacy.kfqi import KernelFQIPrivacyParams, account_kernel_fqi, calibrate_kernel_fqi
from qveil.privacy.record import FieldValue

__all__ = [
    "DEFAULT_BETA",
    "GRID_DEFAULTS",
    "KernelFQIConfig",
    "default_config",
    "grid_config",
    "load_fqi_config",
    "plan_kernel",
    "read_fqi_toml",
]

#: beta_j when a config gives none: a public default on unit coordinates (the noise's
#: correlation length 1/2 of a coordinate's interval; kappa does not depend on it).
DEFAULT_BETA = 2.0


@dataclass(frozen=True, kw_only=True)
class KernelFQIConfig:
    """The public configuration of a kernel fqi release (d >= 1 coordinates)."""

    estimator: str = "kernel"
    env_id: str | None = None
    state_intervals: tuple[tuple[float, float], ...] | None = None
    """One public [lo, hi] per coordinate; states outside are clipped. Default: the
    environment's observation bounds (refused when a bound is infinite)."""
    reward_range: tuple[float, float] | None = None
    gamma: float = 0.8
    iterations: int = 20
    anchor_points: int = 6
    anchors: str = "grid"
    """``grid`` (anchor_points^d), ``sobol`` (anchor_count points, k = neighbours) or
    ``file`` (the public points of ``anchor_file``, k = neighbours):
    :class:`qveil.kfqi.KernelFQISpec`."""
    anchor_count: int = 4096
    neighbours: int = 16
    anchor_file: str | None = None
    """The public anchor file of ``anchors = "file"`` (:mod:`qveil.kfqi_anchors`, e.g. where
    simulated public episodes go); in a config file a relative path is relative to the file.
    The card records its sha256 and origin."""
    bandwidth: float = 0.2
    kernel_radius: float = 2.0
    inducing_points: int = 11
    lam: float = 0.05
    betas: tuple[float, ...] | None = None
    """beta_j per coordinate (noise and release map); default DEFAULT_BETA each."""
    neighbour: str = "user"
    actions: int | None = None
    """m, the number of actions (the accountant's Delta grows as sqrt(m)). None: the env's
    action count where the config names a known env (``qveil privacy``), the dataset's at
    training; when set, a dataset with another count is refused."""
    default_value: float | None = None
    """The public value of a user whose samples do not reach an anchor (unless ``prior``
    gives one), and the KRR centre; in the Q range; None: its midpoint."""
    prior: str | None = None
    """A public prior file (:mod:`qveil.kfqi_prior`, written by ``qveil train --mode fqi
    --write-prior``): a user whose samples do not reach anchor z with action a votes the
    prior's value p(z, a) instead of ``default_value`` (which stays the KRR centre). In a
    config file a relative path is relative to the file. D_T does not change
    (docs/privacy.md 2.6); the card records the prior's sha256 and origin."""
    behaviour_policy: str = "random"
    """The public behaviour policy of the data (``qveil dataset collect --policy``): what
    ``qveil privacy --forecast`` simulates (:mod:`qveil.trainer.behaviour`). Not part of the
    release: the fit reads the data as it is."""
    behaviour_epsilon: float = 0.0
    """The epsilon-greedy mixing of ``behaviour_policy`` with uniform actions, in [0, 1]."""
    epsilon: float | None = 1.0
    delta: float = 1e-5
    sigma: float | None = None

    def __post_init__(self) -> None:
        if self.estimator != "kernel":
            raise InvalidArgument(f"estimator must be kernel, got {self.estimator!r:.80}")
        if self.state_intervals is not None:
            v = self.state_intervals
            if not isinstance(v, list | tuple) or not all(
                isinstance(p, list | tuple) and len(p) == 2 for p in v
            ):
                raise InvalidArgument(f"state_intervals must be [[lo, hi], ...], got {v!r:.80}")
            object.__setattr__(
                self, "state_intervals", tuple((float(p[0]), float(p[1])) for p in v)
            )
        if self.reward_range is not None:
            rr = self.reward_range
            if not isinstance(rr, list | tuple) or len(rr) != 2:
                raise InvalidArgument(f"reward_range must be [lo, hi], got {rr!r:.80}")
            object.__setattr__(self, "reward_range", (float(rr[0]), float(rr[1])))
        if self.betas is not None:
            object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        if self.actions is not None and (
            isinstance(self.actions, bool) or not isinstance(self.actions, int) or self.actions < 1
        ):
            raise InvalidArgument(f"actions must be an integer >= 1, got {self.actions!r:.80}")
        if self.neighbour not in ("user", "reward"):
            raise InvalidArgument(f"neighbour must be user or reward, got {self.neighbour!r:.80}")
        if self.epsilon is not None and self.sigma is not None:
            raise InvalidArgument("give epsilon or sigma, not both")
        if self.prior is not None and (not isinstance(self.prior, str) or not self.prior):
            raise InvalidArgument(f"prior must be a file path, got {self.prior!r:.80}")
        if self.anchor_file is not None and (
            not isinstance(self.anchor_file, str) or not self.anchor_file
        ):
            raise InvalidArgument(f"anchor_file must be a file path, got {self.anchor_file!r:.80}")
        if not isinstance(self.behaviour_policy, str) or not self.behaviour_policy:
            raise InvalidArgument(
                f"behaviour_policy must be a name, got {self.behaviour_policy!r:.80}"
            )
        be = self.behaviour_epsilon
        if isinstance(be, bool) or not isinstance(be, int | float) or not 0.0 <= be <= 1.0:
            raise InvalidArgument(f"behaviour_epsilon must be in [0, 1], got {be!r:.80}")
        object.__setattr__(self, "behaviour_epsilon", float(be))
        if (self.anchors == "file") != (self.anchor_file is not None):
            raise InvalidArgument('give anchor_file with anchors = "file", and only then')

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> KernelFQIConfig:
        return config_from_dict(cls, d, "kernel fqi")

    def replace(self, **changes: FieldValue) -> KernelFQIConfig:  # replace checks them
        return dataclasses.replace(self, **changes)

    def betas_for(self, dims: int) -> tuple[float, ...]:
        b = self.betas if self.betas is not None else (DEFAULT_BETA,) * dims
        if len(b) != dims:
            raise InvalidArgument(f"the config gives {len(b)} betas for {dims} coordinates")
        return b

    def anchor_set(self) -> AnchorSet | None:
        """The ``anchor_file``'s public anchors (read now), or None for the other layouts."""
        return None if self.anchor_file is None else read_anchors(self.anchor_file)

    def spec(self, dims: int, *, anchors: AnchorSet | None = None) -> KernelFQISpec:
        """The estimator's :class:`qveil.kfqi.KernelFQISpec` (``anchors``: the
        ``anchor_file`` already read; else it is read here)."""
        if anchors is None:
            anchors = self.anchor_set()
        return KernelFQISpec(
            anchor_set=None if anchors is None else anchors.points,
            gamma=self.gamma,
            iterations=self.iterations,
            betas=self.betas_for(dims),
            anchor_points=self.anchor_points,
            anchors=self.anchors,
            anchor_count=self.anchor_count,
            neighbours=self.neighbours,
            bandwidth=self.bandwidth,
            kernel_radius=self.kernel_radius,
            inducing_points=self.inducing_points,
            lam=self.lam,
            neighbour=self.neighbour,
            default=self.default_value,
        )

    def to_toml(self) -> str:
        return config_toml(self, "qveil fqi configuration, kernel estimator (effective values)")


#: The defaults of a 1-D (``grid``) config, chosen on simulated LineWalk users (public):
#: 101 anchors, a narrow NW kernel, gamma 0.3 and T = 10 (docs/results.md section 7).
GRID_DEFAULTS: dict[str, float] = {
    "gamma": 0.3,
    "iterations": 10,
    "anchor_points": 101,
    "bandwidth": 0.05,
    "kernel_radius": 3.0,
    "inducing_points": 11,
    "lam": 0.2,
}
#: 1-D keys of a ``grid`` config and their kernel names (``beta``, ``state_interval``: one).
_GRID_RENAMES = {"grid_points": "anchor_points"}
#: Keys of the retired grid release map (a smoother), accepted and without effect: the
#: release map is the subspace KRR, whose ``lam`` sets the smoothing.
_GRID_RETIRED = ("smoother_bandwidth",)


def grid_config(d: Mapping[str, object]) -> KernelFQIConfig:
    """The kernel config (d = 1) of a 1-D ``grid`` config table: ``state_interval`` [lo, hi]
    is the one interval, ``beta`` the one beta, ``grid_points`` the anchors; an unset key
    takes :data:`GRID_DEFAULTS` (then the kernel defaults); an unknown key is refused."""
    t: dict[str, object] = {**GRID_DEFAULTS}
    for k, v in d.items():
        if k in ("estimator", *_GRID_RETIRED):
            continue
        if k == "state_interval":
            t["state_intervals"] = None if v is None else [v]
        elif k == "beta":
            t["betas"] = None if v is None else [v]
        else:
            t[_GRID_RENAMES.get(k, k)] = v
    return KernelFQIConfig.from_dict(t)


def default_config() -> KernelFQIConfig:
    """``--mode fqi`` without a config file: the 1-D defaults (:data:`GRID_DEFAULTS`)."""
    return grid_config({})


def read_fqi_toml(path: str | Path) -> TOMLTable:
    """An fqi config file's keys as a dict, with a relative ``prior`` or ``anchor_file``
    path taken relative to the file's directory (what every reader of a config needs)."""
    d = read_toml(path)
    for key in ("prior", "anchor_file"):
        v = d.get(key)
        if isinstance(v, str) and v and not Path(v).is_absolute():
            d[key] = str(Path(path).resolve().parent / v)
    return d


def load_fqi_config(path: str | Path) -> KernelFQIConfig:
    """An fqi config file: ``estimator = "kernel"``, or a 1-D ``grid`` one (no estimator
    key, or ``estimator = "grid"``) read by :func:`grid_config`. A relative ``prior`` or
    ``anchor_file`` path is taken relative to the file's directory (:func:`read_fqi_toml`)."""
    d = read_fqi_toml(path)
    name = d.get("estimator", "grid")
    if name == "kernel":
        return KernelFQIConfig.from_dict(d)
    if name != "grid":
        raise InvalidArgument(f"estimator must be grid or kernel, got {name!r:.80}")
    return grid_config(d)


def plan_kernel(
    cfg: KernelFQIConfig,
    *,
    users: int,
    actions: int,
    dims: int,
    reward_range: tuple[float, float],
    prior_sha256: str | None = None,
) -> FQIPrivacyResult:
    """The release's privacy accounting from public quantities only (before training).
    ``actions``: the data's (or the env's) m; a config that names another is refused.
    ``prior_sha256``: the public prior's hash, recorded in the params and the basis."""
    if cfg.actions is not None and cfg.actions != actions:
        raise InvalidArgument(
            f"the config says actions = {cfg.actions}, but the data has {actions} actions: "
            "the privacy plan would not be the release's"
        )
    p = KernelFQIPrivacyParams(
        neighbour=cfg.neighbour,
        users=users,
        reward_range=reward_range,
        gamma=cfg.gamma,
        iterations=cfg.iterations,
        actions=actions,
        dims=dims,
        betas=cfg.betas_for(dims),
        lam=cfg.lam,
        anchor_points=cfg.anchor_points,
        inducing_points=cfg.inducing_points,
        delta=cfg.delta,
        sigma=cfg.sigma,
        prior_sha256=prior_sha256,
    )
    if cfg.sigma is not None:
        return account_kernel_fqi(p)
    if cfg.epsilon is None:
        raise InvalidArgument("give epsilon (or sigma) for an fqi release")
    return calibrate_kernel_fqi(p, epsilon=cfg.epsilon)
