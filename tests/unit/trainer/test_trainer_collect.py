"""Simulated collection (qveil.trainer.collect): seeded (a smaller run is a prefix), any Box
observation and Discrete action env, terminal only on termination (never on truncation), the
env's reward range or a declared one, refusals, and its progress bar. Real Gymnasium envs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from dataset_helpers import LW

import qveil.trainer  # noqa: F401  (registers qveil/LineWalk-v0)
from qveil.errors import InvalidArgument, NotFound
from qveil.trainer.collect import collect


def test_collect_is_deterministic_by_seed() -> None:
    a, b, c = collect(LW, 40, seed=7), collect(LW, 40, seed=7), collect(LW, 40, seed=8)
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    # each user's data depends on (seed, user) only: a smaller run is a prefix
    small = collect(LW, 10, seed=7)
    assert small.n == 500
    np.testing.assert_array_equal(small.s, a.s[:500])
    np.testing.assert_array_equal(small.a, a.a[:500])


def test_collect_linewalk_shape() -> None:
    ds = collect(LW, 25, seed=3, episodes_per_user=2)
    assert (ds.users, ds.n, ds.d, ds.n_actions) == (25, 25 * 2 * 50, 1, 2)
    assert ds.reward_range == (0.0, 0.5) and ds.env_id == LW
    assert not ds.terminal.any()  # LineWalk only truncates (a time limit), never terminates
    np.testing.assert_array_equal(np.bincount(ds.user), np.full(25, 100))
    # within an episode the chain is consistent, and the policy is roughly uniform
    same_ep = np.ones(ds.n - 1, bool)
    same_ep[49::50] = False
    np.testing.assert_array_equal(ds.s[1:][same_ep], ds.s2[:-1][same_ep])
    assert abs(ds.a.mean() - 0.5) < 0.05  # 2500 fair coins: 5 standard deviations


def test_collect_cartpole_d4_terminal_only_on_termination() -> None:
    ds = collect("CartPole-v1", 30, seed=11, reward_range=(0.0, 1.0))
    assert ds.d == 4 and ds.users == 30 and np.all(ds.r == 1.0)
    # a random policy drops the pole long before the 500-step limit: every episode terminates,
    # exactly once, on its last row
    ends = np.flatnonzero(np.diff(ds.user))
    assert ds.terminal.sum() == 30 and ds.terminal[-1] and ds.terminal[ends].all()


def test_collect_truncation_is_not_terminal() -> None:
    """CartPole under a 5-step time limit: episodes that reach it are truncated, not terminal."""
    import gymnasium as gym

    if "qveil-test/CartPole5-v0" not in gym.registry:
        gym.register(
            id="qveil-test/CartPole5-v0",
            entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
            max_episode_steps=5,
        )
    ds = collect("qveil-test/CartPole5-v0", 20, seed=0, reward_range=(0.0, 1.0))
    assert ds.n == 100 and not ds.terminal.any()


def test_collect_refusals() -> None:
    with pytest.raises(InvalidArgument, match="declares no reward range"):
        collect("CartPole-v1", 3, seed=0)
    with pytest.raises(InvalidArgument, match=r"r\[0\] = 1 is outside the declared reward range"):
        collect("CartPole-v1", 3, seed=0, reward_range=(0.0, 0.5))
    with pytest.raises(InvalidArgument, match="need Discrete actions"):
        collect("Pendulum-v1", 2, seed=0, reward_range=(-17.0, 0.0))
    with pytest.raises(InvalidArgument, match="need a Box"):
        collect("FrozenLake-v1", 2, seed=0, reward_range=(0.0, 1.0))
    with pytest.raises(NotFound, match="cannot make env"):
        collect("qveil/NoSuchEnv-v0", 2, seed=0)
    for kwargs in ({"users": 0}, {"seed": -1}, {"episodes_per_user": 0}, {"users": 2.5}):
        args: dict[str, Any] = {"users": 2, "seed": 0, **kwargs}
        with pytest.raises(InvalidArgument):
            collect(LW, **args)


def test_collect_progress_bar(capsys: pytest.CaptureFixture[str]) -> None:
    collect(LW, 5, seed=0, progress=True)
    err = capsys.readouterr().err
    assert "collect" in err and "5/5" in err and "user" in err
    collect(LW, 5, seed=0)
    assert capsys.readouterr().err == ""
