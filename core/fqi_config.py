"""The public configuration of an `fqi` release and its privacy plan, computed from public
quantities only, before any data is touched (``qveil privacy --mode fqi`` and
``qveil train --mode fqi`` share it). No torch, no gymnasium: the client's CLI imports it.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from qveil.errors import InvalidArgument
from qveil.privacy.fqi import FQIPrivacyParams, account_fqi, calibrate_fqi
from qveil.release_map import best_beta

C = TypeVar("C")

__all__ = [
    "REFUSE_RATIO",
    "WARN_RATIO",
    "FQIConfig",
    "config_toml",
    "plan",
    "ratio_message",
    "read_toml",
    "toml_value",
]

#: sigma / (r0 / (1 - gamma)) above this: a warning (the noise is a large part of the values).
WARN_RATIO = 0.5
#: ... above this: refused unless forced (expected worse than a random policy).
REFUSE_RATIO = 1.0


def read_toml(path: str | Path) -> dict[str, Any]:
    """A config file's table; a missing or malformed file is InvalidArgument."""
    try:
        with Path(path).open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise InvalidArgument(f"config {str(path)[:80]!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"config {str(path)[:80]!r} is not valid TOML: {exc}") from None


@dataclass(frozen=True, kw_only=True)
class FQIConfig:
    """The public configuration of an fqi release (configs/linewalk-private.toml)."""

    env_id: str | None = None
    """Environment id recorded on the card; default: the dataset's own."""
    state_interval: tuple[float, float] | None = None
    """Public state interval [lo, hi]; default: the environment's observation bounds."""
    reward_range: tuple[float, float] | None = None
    """Declared reward range [lo, hi]; default: the dataset's declared range."""
    gamma: float = 0.3
    iterations: int = 10
    """T: FQI iterations."""
    grid_points: int = 101
    """K: points of the public grid on the unit state interval."""
    bandwidth: float = 0.05
    """h: Nadaraya-Watson bandwidth (unit coordinates)."""
    kernel_radius: float = 3.0
    """The NW kernel is cut off beyond this many bandwidths."""
    smoother_bandwidth: float = 0.2
    """Gaussian grid smoother of the release map (unit coordinates; 0: none)."""
    beta: float | None = None
    """Noise kernel rate on [0, 1]; None: the beta that minimises kappa (public)."""
    neighbour: str = "user"
    """``user`` (one user's whole data replaced) or ``reward`` (one user's reward function)."""
    epsilon: float | None = 1.0
    delta: float = 1e-5
    sigma: float | None = None
    """Give sigma instead of epsilon to account for a fixed noise scale."""

    def __post_init__(self) -> None:
        for name in ("state_interval", "reward_range"):
            v = getattr(self, name)
            if v is not None:
                if not isinstance(v, list | tuple) or len(v) != 2:
                    raise InvalidArgument(f"{name} must be [lo, hi], got {v!r:.80}")
                object.__setattr__(self, name, (float(v[0]), float(v[1])))
        if self.neighbour not in ("user", "reward"):
            raise InvalidArgument(f"neighbour must be user or reward, got {self.neighbour!r:.80}")
        if self.epsilon is not None and self.sigma is not None:
            raise InvalidArgument("give epsilon or sigma, not both")

    @classmethod
    def from_toml(cls, path: str | Path) -> FQIConfig:
        return cls.from_dict(read_toml(path))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FQIConfig:
        return config_from_dict(cls, d, "fqi")

    def replace(self, **changes: Any) -> FQIConfig:
        return dataclasses.replace(self, **changes)

    def to_toml(self) -> str:
        return config_toml(self, "qveil fqi configuration (effective values of this run)")


def config_from_dict(cls: type[C], d: Mapping[str, Any], what: str) -> C:
    """A config dataclass from a mapping of its fields (and ``mode = "fqi"``): an unknown key
    or another mode is InvalidArgument. ``what`` names the config kind in the message."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(d) - names - {"mode"})
    if unknown:
        raise InvalidArgument(f"unknown {what} config key(s): {', '.join(unknown)[:80]}")
    if d.get("mode", "fqi") != "fqi":
        raise InvalidArgument(f"this config is for mode {d['mode']!r:.80}, not fqi")
    return cls(**{k: v for k, v in d.items() if k != "mode"})


def toml_value(v: Any) -> str:
    """A config value as TOML: strings quoted, tuples and lists (nested) as arrays."""
    if isinstance(v, tuple | list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return repr(float(v))  # numpy floats too (their repr is not TOML)


def config_toml(cfg: Any, header: str) -> str:
    """Every set field of a config dataclass as TOML (round-trips through its from_toml)."""
    lines = [f"# {header}", 'mode = "fqi"']
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if v is not None:
            lines.append(f"{f.name} = {toml_value(v)}")
    return "\n".join(lines) + "\n"


def _beta(cfg: FQIConfig) -> float:
    return (
        float(cfg.beta)
        if cfg.beta is not None
        else best_beta(cfg.grid_points, cfg.smoother_bandwidth)
    )


def plan(cfg: FQIConfig, *, users: int, actions: int, reward_range: tuple[float, float]) -> Any:
    """The release's privacy accounting from public quantities only (before training):
    an ``FQIPrivacyResult`` with sigma, D_T, kappa, beta, Delta and the noise-to-value
    ratio sigma / (r0 / (1 - gamma))."""
    p = FQIPrivacyParams(
        neighbour=cfg.neighbour,
        users=users,
        reward_range=reward_range,
        gamma=cfg.gamma,
        iterations=cfg.iterations,
        actions=actions,
        grid_points=cfg.grid_points,
        smoother_bandwidth=cfg.smoother_bandwidth,
        beta=_beta(cfg),
        delta=cfg.delta,
        sigma=cfg.sigma,
    )
    if cfg.sigma is not None:
        return account_fqi(p)
    if cfg.epsilon is None:
        raise InvalidArgument("give epsilon (or sigma) for an fqi release")
    return calibrate_fqi(p, epsilon=cfg.epsilon)


def ratio_message(result: Any) -> str | None:
    """The warning for a noise-to-value ratio above :data:`WARN_RATIO` (None below it)."""
    r = float(result.noise_to_value)
    if r <= WARN_RATIO:
        return None
    scale = result.sigma / r
    return (
        f"sigma = {result.sigma:.4g} is {r:.2f} x the value scale r0/(1-gamma) = {scale:.4g}: "
        + (
            "the release is expected to be WORSE THAN A RANDOM POLICY"
            if r > REFUSE_RATIO
            else "the noise is a large part of the values; expect a poor policy"
        )
        + " (more users, a larger epsilon, or a smaller gamma would help)"
    )
