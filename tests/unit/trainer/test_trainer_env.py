"""LineWalk matches the paper's Appendix E.1 and passes Gymnasium's env checker."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from scipy import stats

import qveil.trainer  # noqa: F401  (registers qveil/LineWalk-v0)
from qveil.trainer.env import ENV_ID, LineWalkEnv, towards_middle_policy


def test_registered_and_passes_env_checker() -> None:
    env = gym.make(ENV_ID)
    assert isinstance(env.unwrapped, LineWalkEnv)
    check_env(env.unwrapped, skip_render_check=True)
    assert env.observation_space == gym.spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float64)
    assert env.action_space == gym.spaces.Discrete(2)


def test_initial_state_uniform_on_unit_interval() -> None:
    """s0 ~ U[0, 1]: KS test on 4000 resets (a s0 fixed at 0.5, or U[0, 0.5], gives p ~ 0)."""
    env = LineWalkEnv()
    env.reset(seed=7)
    s0 = np.array([env.reset()[0][0] for _ in range(4000)])
    assert stats.kstest(s0, "uniform").pvalue > 1e-3
    assert stats.kstest(s0 / 2, "uniform").pvalue < 1e-6  # the test has power


def test_moves_are_uniform_in_0_quarter_and_reward_is_paid_on_the_new_state() -> None:
    """E.1: action 1 moves right, 0 left, by U[0, 0.25], clipped to [0, 1]; reward
    0.5 - |s' - 0.5| on the state after the move."""
    env = LineWalkEnv(episode_length=10**9)
    env.reset(seed=3)
    rights, lefts = [], []
    for i in range(6000):
        env._state = 0.5  # away from the walls: the move is not clipped
        a = i % 2
        obs, r, term, trunc, _ = env.step(a)
        s = float(obs[0])
        assert r == pytest.approx(0.5 - abs(s - 0.5), abs=0)
        assert not term and not trunc
        (rights if a == 1 else lefts).append(s - 0.5)
    rights_a, lefts_a = np.array(rights), -np.array(lefts)
    assert rights_a.min() >= 0 and lefts_a.min() >= 0
    for moves in (rights_a, lefts_a):
        assert moves.max() <= 0.25
        assert stats.kstest(moves / 0.25, "uniform").pvalue > 1e-3


def test_clipped_at_walls_and_truncated_at_50() -> None:
    env = LineWalkEnv()
    env.reset(seed=1)
    env._state = 0.01
    for _ in range(5):
        obs, r, *_ = env.step(0)
    assert obs[0] == 0.0 and r == 0.0
    env._state = 0.99
    for _ in range(5):
        obs, r, *_ = env.step(1)
    assert obs[0] == 1.0 and r == 0.0
    env.reset()
    flags = [env.step(1)[3] for _ in range(50)]
    assert flags == [False] * 49 + [True]


def test_invalid_action_refused() -> None:
    env = LineWalkEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="invalid action"):
        env.step(2)


def test_reference_policy_moves_towards_middle() -> None:
    assert towards_middle_policy(0.2) == 1 and towards_middle_policy(0.8) == 0


def test_reach16_is_a_bounded_16_coordinate_task_where_action_1_is_better() -> None:
    """qveil/Reach16-v0 (the estimator's scale test): states in [0, 1]^16, rewards in its
    declared [0, 1], 20 steps; moving towards the centre (action 1) earns more than away."""
    import gymnasium as gym

    from qveil.trainer.env import REACH_ID

    env = gym.make(REACH_ID)
    assert env.observation_space.shape == (16,) and env.unwrapped.reward_bounds == (0.0, 1.0)
    totals = []
    for action in (0, 1):
        obs, _ = env.reset(seed=3)
        total, steps, done = 0.0, 0, False
        while not done:
            obs, r, term, trunc, _ = env.step(action)
            assert 0.0 <= r <= 1.0 and ((obs >= 0) & (obs <= 1)).all()
            total, steps, done = total + r, steps + 1, term or trunc
        assert steps == 20
        totals.append(total)
    assert totals[1] > totals[0]
