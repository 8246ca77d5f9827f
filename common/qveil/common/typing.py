"""The API's types: frozen dataclasses that both the server and the SDK speak (the SDK never
hands out generated protobuf classes, and the server builds its answers from these).
``qveil.common.serde`` maps each to its protobuf message and back."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import numpy.typing as npt

from qveil.json_types import JSONObject

__all__ = [
    "ActionIntegrity",
    "ActionNormality",
    "BestActions",
    "IntegrityResult",
    "NoisePoint",
    "Release",
    "ReleaseHeader",
    "ServerStats",
    "StatisticalReport",
    "Values",
]


@dataclass(frozen=True, slots=True)
class ReleaseHeader:
    """What every view of a release starts with: its id, its status, its noise parameters
    (``sigma``; ``beta``, the first coordinate's OU rate), the first coordinate's public
    ``interval`` and its action count. The store's record, the public card, the admin listing
    and the audit each build on this one type."""

    release_id: str
    status: str  # "staged" | "active" | "retired" ("" when no store knows the release)
    sigma: float
    beta: float
    interval: tuple[float, float]
    n_actions: int

    def header(self) -> ReleaseHeader:
        """The header alone (of a record or card that extends it)."""
        return ReleaseHeader(
            self.release_id, self.status, self.sigma, self.beta, self.interval, self.n_actions
        )

    def to_dict(self) -> JSONObject:
        """The header as JSON values, in field order (``interval`` a list)."""
        return {
            "release_id": self.release_id,
            "status": self.status,
            "sigma": self.sigma,
            "beta": self.beta,
            "interval": list(self.interval),
            "n_actions": self.n_actions,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Release(ReleaseHeader):
    """The public card of a release (what ``GetRelease`` answers); no weights, no noise."""

    mode: str
    epsilon: float
    delta: float
    delta_total: float
    holds: bool
    basis: str
    reason: str | None
    created_at: datetime | None
    seeded: bool
    env_id: str
    q_bound: float | None
    value_grid: float
    card: JSONObject = field(default_factory=dict)
    #: state coordinates: 1 for a 1-D release; for d > 1, ``state_intervals`` and
    #: ``betas`` hold one entry per coordinate (``interval``, ``beta``: the first one's)
    dims: int = 1
    state_intervals: tuple[tuple[float, float], ...] = ()
    betas: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class Values:
    """Released values: ``values[i, j]`` is state ``i``, action ``actions[j]``."""

    release_id: str
    actions: tuple[int, ...]
    values: npt.NDArray[np.float64]
    value_grid: float


@dataclass(frozen=True, slots=True)
class BestActions:
    """Argmax action and its released value per state."""

    release_id: str
    actions: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    value_grid: float


@dataclass(frozen=True, slots=True)
class NoisePoint:
    """One stored noise value (auditor role only)."""

    seq: int
    x: float
    state: float
    g: float
    created_at: datetime | None
    hash: str


@dataclass(frozen=True, slots=True)
class ActionIntegrity:
    action: int
    ok: bool
    count: int
    high_water_mark: int
    first_broken_seq: int | None
    gaps: tuple[int, ...]
    message: str


@dataclass(frozen=True, slots=True)
class IntegrityResult:
    release_id: str
    ok: bool
    actions: tuple[ActionIntegrity, ...]
    report: JSONObject


@dataclass(frozen=True, slots=True)
class ActionNormality:
    action: int
    n: int
    ks_p: float
    chi2_p: float
    mean: float
    var: float
    passed: bool


@dataclass(frozen=True, slots=True)
class StatisticalReport:
    release_id: str
    passed: bool
    actions: tuple[ActionNormality, ...]
    report: JSONObject


@dataclass(frozen=True, slots=True)
class ServerStats:
    active_release_id: str
    uptime_seconds: float
    requests_by_code: dict[str, int]
    states_answered: int
    new_points: int
    in_flight: int
    max_in_flight: int
    stored_points: dict[int, int]
    max_batch: int
