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
    "ServerStats",
    "StatisticalReport",
    "Values",
]


@dataclass(frozen=True, slots=True)
class Release:
    """The public card of a release (what ``GetRelease`` answers); no weights, no noise."""

    release_id: str
    mode: str
    epsilon: float
    delta: float
    delta_total: float
    holds: bool
    basis: str
    reason: str | None
    sigma: float
    beta: float
    state_interval: tuple[float, float]
    n_actions: int
    created_at: datetime | None
    status: str  # "staged" | "active" | "retired" | ""
    seeded: bool
    env_id: str
    q_bound: float | None
    value_grid: float
    card: JSONObject = field(default_factory=dict)
    #: state coordinates: 1 for a 1-D release; for d > 1, ``state_intervals`` and
    #: ``betas`` hold one entry per coordinate (``state_interval``, ``beta``: the first one's)
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
