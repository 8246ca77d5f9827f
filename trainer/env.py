"""LineWalk: the paper's environment (Wang & Hegde 2019, Appendix E.1) as a Gymnasium env.

S = [0, 1]; s0 ~ U[0, 1]; actions {0: left, 1: right}; each moves the agent by U[0, 0.25]
in that direction, clipped to [0, 1]; the reward 0.5 - |s' - 0.5| is paid on the state
*after* the move (as in the authors' dpql.py); an episode ends (truncation, a time limit) at
its 50th step. Registered as ``qveil/LineWalk-v0`` when :mod:`qveil.trainer` is imported.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["ENV_ID", "LineWalkEnv", "register_envs", "towards_middle_policy"]

ENV_ID = "qveil/LineWalk-v0"

#: Largest single move (E.1: "a random amount sampled uniformly from [0, 0.25]").
MAX_MOVE = 0.25


class LineWalkEnv(gym.Env[np.ndarray, int]):
    """The 1-D walk of Appendix E.1; reward range [0, 0.5]."""

    metadata: dict[str, Any] = {"render_modes": []}
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
        self.action_space = spaces.Discrete(2)
        self._state = 0.0
        self._t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._state = float(self.np_random.uniform(0.0, 1.0))
        self._t = 0
        return np.array([self._state], dtype=np.float64), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
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


def register_envs() -> None:
    """Register qveil's environments with Gymnasium (idempotent)."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point="qveil.trainer.env:LineWalkEnv")
