"""Public behaviour policies for simulated collection: who chooses the actions of the
episodes ``qveil dataset collect`` records and the forecast simulates.

A behaviour policy is a pure function ``(obs, rng) -> action`` (:class:`BehaviourPolicy`):
the observation as a flat float vector and the episode's own generator (drawn from the
collection seed, user and episode), so a seed gives the same episodes every time. It must
use no other state and read no private data: it is public, like the simulator.

:func:`resolve_behaviour` turns a name and an epsilon into a :class:`Behaviour`:

- ``random`` (the default): uniformly random actions (epsilon has no effect);
- a name of :data:`HEURISTICS` (``mountaincar-energy``, ``cartpole-balance``): a public
  heuristic, mixed epsilon-greedy with uniform random actions (with probability epsilon
  a step's action is uniform, else the heuristic's);
- ``MODULE:CALLABLE``: any importable callable of that signature, mixed the same way.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from qveil.errors import InvalidArgument, echo

__all__ = [
    "HEURISTICS",
    "RANDOM",
    "Behaviour",
    "BehaviourPolicy",
    "Heuristic",
    "resolve_behaviour",
]

FloatArray = npt.NDArray[np.float64]

#: The name of the uniformly random behaviour policy.
RANDOM = "random"


class BehaviourPolicy(Protocol):
    """A public behaviour policy: the action (0 .. n - 1) for a flat observation, drawing
    any randomness from ``rng`` only."""

    def __call__(self, obs: FloatArray, rng: np.random.Generator, /) -> int: ...


def mountaincar_energy(obs: FloatArray, rng: np.random.Generator, /) -> int:
    """MountainCar-v0: push in the direction of the velocity (right when at rest), which
    pumps energy into the swing until the car climbs the right hill."""
    return 2 if obs[1] >= 0.0 else 0


def cartpole_balance(obs: FloatArray, rng: np.random.Generator, /) -> int:
    """CartPole-v1: push toward the side the pole falls (sign of angle + angular
    velocity)."""
    return 1 if obs[2] + obs[3] > 0.0 else 0


@dataclass(frozen=True)
class Heuristic:
    """A named public heuristic and the env shape it is written for (d coordinates, m
    actions): a collection of another shape is refused."""

    policy: BehaviourPolicy
    dims: int
    actions: int
    about: str


#: The named public heuristics.
HEURISTICS: dict[str, Heuristic] = {
    "mountaincar-energy": Heuristic(
        mountaincar_energy, 2, 3, "MountainCar-v0: push in the direction of the velocity"
    ),
    "cartpole-balance": Heuristic(
        cartpole_balance, 4, 2, "CartPole-v1: push toward the side the pole falls"
    ),
}


@dataclass(frozen=True)
class Behaviour:
    """A resolved behaviour policy: its ``name``, ``epsilon`` and ``policy`` (None: uniform
    random actions). ``dims``/``actions``: the env shape it needs (None: any)."""

    name: str
    epsilon: float
    policy: BehaviourPolicy | None
    dims: int | None = None
    actions: int | None = None

    @property
    def uniform(self) -> bool:
        """The ``random`` policy: every action uniformly random."""
        return self.policy is None

    def describe(self) -> str:
        """``random``, or ``NAME (epsilon E)``: what a dataset records."""
        return RANDOM if self.policy is None else f"{self.name} (epsilon {self.epsilon:g})"

    def check_env(self, env_id: str, dims: int, actions: int) -> None:
        """Refuse an env of another shape than the heuristic's (InvalidArgument)."""
        if (self.dims is not None and dims != self.dims) or (
            self.actions is not None and actions != self.actions
        ):
            raise InvalidArgument(
                f"behaviour policy {echo(self.name)} is for {self.dims} coordinates and "
                f"{self.actions} actions; env {echo(env_id)} has {dims} and {actions}"
            )

    def act(self, obs: FloatArray, rng: np.random.Generator, n_actions: int) -> int:
        """One step's action: uniform with probability epsilon, else the policy's."""
        if self.policy is None or rng.random() < self.epsilon:
            return int(rng.integers(n_actions))
        try:
            a = self.policy(obs, rng)
        except Exception as exc:  # a MODULE:CALLABLE's own error: said plainly, no traceback
            raise InvalidArgument(
                f"behaviour policy {echo(self.name)} failed: {type(exc).__name__}: {str(exc)[:80]}"
            ) from None
        if isinstance(a, bool) or not isinstance(a, int | np.integer) or not 0 <= a < n_actions:
            raise InvalidArgument(
                f"behaviour policy {echo(self.name)} returned {a!r:.40}, not an action "
                f"0 .. {n_actions - 1}"
            )
        return int(a)


def _import(name: str) -> BehaviourPolicy:
    module, _, attr = name.partition(":")
    if not module or not attr:
        raise InvalidArgument(f"behaviour policy {echo(name)}: give MODULE:CALLABLE")
    try:
        obj: object = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise InvalidArgument(
            f"cannot import behaviour policy {echo(name)}: {type(exc).__name__}"
        ) from None
    if not callable(obj):
        raise InvalidArgument(f"behaviour policy {echo(name)} is not callable")
    policy: Callable[[FloatArray, np.random.Generator], int] = obj
    return policy


def resolve_behaviour(name: str = RANDOM, epsilon: float = 0.0) -> Behaviour:
    """The behaviour policy ``name`` (``random``, a name of :data:`HEURISTICS`, or
    ``MODULE:CALLABLE``) mixed epsilon-greedy with uniform actions; epsilon in [0, 1]
    (InvalidArgument otherwise, or for an unknown name)."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float):
        raise InvalidArgument(f"behaviour epsilon must be a number in [0, 1], got {epsilon!r:.40}")
    eps = float(epsilon)
    if not (math.isfinite(eps) and 0.0 <= eps <= 1.0):
        raise InvalidArgument(f"behaviour epsilon must be in [0, 1], got {epsilon!r:.40}")
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"behaviour policy must be a name, got {name!r:.40}")
    if name == RANDOM:
        return Behaviour(RANDOM, eps, None)
    if name in HEURISTICS:
        h = HEURISTICS[name]
        return Behaviour(name, eps, h.policy, h.dims, h.actions)
    if ":" in name:
        return Behaviour(name, eps, _import(name))
    known = ", ".join([RANDOM, *HEURISTICS, "MODULE:CALLABLE"])
    raise InvalidArgument(f"unknown behaviour policy {echo(name)} (known: {known})")
