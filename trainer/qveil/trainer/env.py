"""LineWalk: the paper's environment (Wang & Hegde 2019, Appendix E.1) as a Gymnasium env.

S = [0, 1]; s0 ~ U[0, 1]; actions {0: left, 1: right}; each moves the agent by U[0, 0.25]
in that direction, clipped to [0, 1]; the reward 0.5 - |s' - 0.5| is paid on the state
*after* the move (as in the authors' dpql.py); an episode ends (truncation, a time limit) at
its 50th step. Registered as ``qveil/LineWalk-v0`` when :mod:`qveil.trainer` is imported.
"""

from __future__ import annotations

from typing import Any, TypeAlias  # Any: GymEnv

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from qveil.errors import InvalidArgument, echo

__all__ = [
    "ENV_ID",
    "REACH_ID",
    "GymEnv",
    "LineWalkEnv",
    "ReachEnv",
    "action_count",
    "register_envs",
    "towards_middle_policy",
]

ENV_ID = "qveil/LineWalk-v0"
REACH_ID = "qveil/Reach16-v0"

#: An env of any id, as ``gymnasium.make`` returns it.
GymEnv: TypeAlias = gym.Env[Any, Any]  # gymnasium types its obs. and actions Any (id-dependent)

#: Largest single move (E.1: "a random amount sampled uniformly from [0, 0.25]").
MAX_MOVE = 0.25


class LineWalkEnv(gym.Env[np.ndarray, int]):
    """The 1-D walk of Appendix E.1; reward range [0, 0.5]."""

    metadata: dict[str, object] = {"render_modes": []}
    #: Declared reward range; the trainer clips to the configured range anyway.
    reward_bounds = (0.0, 0.5)

    def __init__(self, *, episode_length: int = 50, max_move: float = MAX_MOVE) -> None:
        if int(episode_length) < 1:
            raise ValueError(f"episode_length must be >= 1, got {episode_length!r}")
        if not 0.0 < float(max_move) <= 1.0:
            raise ValueError(f"max_move must be in (0, 1], got {max_move!r}")
        self.episode_length = int(episode_length)
        self.max_move = float(max_move)
        self.observation_space = spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float64)
        # Gymnasium types Discrete as a space of np.int64; its envs take plain int actions
        self.action_space = spaces.Discrete(2)  # type: ignore[assignment]
        self._state = 0.0
        self._t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, object] | None = None
    ) -> tuple[np.ndarray, dict[str, object]]:
        super().reset(seed=seed)
        self._state = float(self.np_random.uniform(0.0, 1.0))
        self._t = 0
        return np.array([self._state], dtype=np.float64), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, object]]:
        if not self.action_space.contains(action):
            raise ValueError(f"invalid action {action!r}; LineWalk has actions 0 (left), 1 (right)")
        move = float(self.np_random.uniform(0.0, self.max_move))
        s = self._state + move if int(action) == 1 else self._state - move
        self._state = min(1.0, max(0.0, s))
        self._t += 1
        reward = 0.5 - abs(self._state - 0.5)
        truncated = self._t >= self.episode_length
        return np.array([self._state], dtype=np.float64), float(reward), False, truncated, {}


def towards_middle_policy(state: float) -> int:
    """The hand-written reference policy: move towards 0.5 (right below it, left above)."""
    return 1 if float(state) < 0.5 else 0


class ReachEnv(gym.Env[np.ndarray, int]):
    """A d-coordinate reach task for scale tests (``qveil/Reach16-v0``: d = 16, 2 actions).

    S = [0, 1]^d, s0 ~ U[0, 1]^d. Action 1 moves every coordinate a random step of U[0, 0.1]
    towards the target 0.5, action 0 the same step away; the state is clipped to the box.
    The reward is 1 - 2 * mean_j |s'_j - 0.5| in [0, 1], paid after the move; an episode ends
    (truncation) at its 20th step. Action 1 is always the better one, so the Q-function's
    action gap is known; the env exists to measure time and memory against d."""

    metadata: dict[str, object] = {"render_modes": []}
    reward_bounds = (0.0, 1.0)

    def __init__(self, *, dims: int = 16, episode_length: int = 20) -> None:
        if int(dims) < 1 or int(episode_length) < 1:
            raise ValueError(f"dims and episode_length must be >= 1, got {dims}, {episode_length}")
        self.dims = int(dims)
        self.episode_length = int(episode_length)
        self.observation_space = spaces.Box(0.0, 1.0, shape=(self.dims,), dtype=np.float64)
        # Gymnasium types Discrete as a space of np.int64; its envs take plain int actions
        self.action_space = spaces.Discrete(2)  # type: ignore[assignment]
        self._state = np.zeros(self.dims)
        self._t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, object] | None = None
    ) -> tuple[np.ndarray, dict[str, object]]:
        super().reset(seed=seed)
        self._state = self.np_random.uniform(0.0, 1.0, self.dims)
        self._t = 0
        return self._state.copy(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, object]]:
        if not self.action_space.contains(action):
            raise ValueError(f"invalid action {action!r}; Reach has actions 0 (away), 1 (towards)")
        step = self.np_random.uniform(0.0, 0.1, self.dims)
        towards = np.sign(0.5 - self._state)
        sign = 1.0 if int(action) == 1 else -1.0
        self._state = np.clip(self._state + sign * towards * step, 0.0, 1.0)
        self._t += 1
        reward = float(1.0 - 2.0 * np.abs(self._state - 0.5).mean())
        truncated = self._t >= self.episode_length
        return self._state.copy(), reward, False, truncated, {}


def action_count(env_id: str) -> int:
    """m, the number of actions of a registered environment with a Discrete action space
    (public: the env's specification); an unknown env or another action space is
    InvalidArgument."""
    register_envs()
    try:
        env = gym.make(env_id)
    except gym.error.Error as exc:
        raise InvalidArgument(f"cannot make env {echo(env_id)}: {exc}") from None
    try:
        space = env.action_space
    finally:
        env.close()
    if not isinstance(space, spaces.Discrete):
        raise InvalidArgument(f"env {echo(env_id)} has no discrete action space ({space})")
    return int(space.n)


def register_envs() -> None:
    """Register qveil's environments with Gymnasium (idempotent)."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point="qveil.trainer.env:LineWalkEnv")
    if REACH_ID not in gym.registry:
        gym.register(id=REACH_ID, entry_point="qveil.trainer.env:ReachEnv")
