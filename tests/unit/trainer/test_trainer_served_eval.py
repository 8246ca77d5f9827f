"""Returns of a served release (qveil.trainer.served_eval): episodes in lockstep (one batched
call per step, the same returns as playing each episode alone), the served policy's actions
from a real server's GetBestActions (LocalServer: gRPC on 127.0.0.1, port 0), and the
refusals (no episodes, an env that is not installed, a reference the card cannot refit)."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from dataset_helpers import LW, small_dataset
from server_helpers import charge, served_values, small_network_bundle

import qveil.trainer  # noqa: F401  (registers qveil/LineWalk-v0)
from qveil.bundle import load_bundle
from qveil.errors import InvalidArgument
from qveil.server.local import LocalServer
from qveil.trainer.served_eval import evaluate_served, lockstep_returns, nonprivate_policy


def _toward_the_middle(states: np.ndarray) -> np.ndarray:
    return (states[:, 0] < 0.5).astype(np.int64)


def _alone(env_id: str, seed: int) -> float:
    env = gym.make(env_id)
    try:
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            a = int(_toward_the_middle(np.asarray(obs, dtype=np.float64).reshape(1, -1))[0])
            obs, r, term, trunc, _ = env.step(a)
            total += float(r)
            done = term or trunc
        return total
    finally:
        env.close()


def test_lockstep_returns_are_each_episode_played_alone() -> None:
    calls: list[int] = []

    def policy(states: np.ndarray) -> np.ndarray:
        calls.append(len(states))
        return _toward_the_middle(states)

    rets = lockstep_returns(LW, policy, episodes=4, seed=10, env_kwargs={})
    assert rets == [_alone(LW, 10 + i) for i in range(4)]
    assert calls[0] == 4 and all(b <= a for a, b in zip(calls, calls[1:], strict=False))


def test_an_env_that_is_not_registered_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="cannot play the release's environment 'No/Env-v9'"):
        lockstep_returns("No/Env-v9", _toward_the_middle, episodes=1, seed=0, env_kwargs={})


def test_the_reference_needs_a_kernel_card() -> None:
    with pytest.raises(InvalidArgument, match=r"this release \('output'\) does not record one"):
        nonprivate_policy({"mode": "output", "privacy_params": {}}, small_dataset())


def test_no_episodes_is_refused_before_dialling() -> None:
    with pytest.raises(InvalidArgument, match="episodes must be >= 1, got 0"):
        evaluate_served("127.0.0.1:9", episodes=0)


@pytest.fixture
def served_linewalk(tmp_path: Path) -> Path:
    bundle = small_network_bundle(
        tmp_path / "b", weights_seed=0, sigma=0.5, interval=(0.0, 1.0), env_id=LW
    )
    charge(bundle)
    return bundle


def test_the_served_policy_is_the_servers_best_actions(
    served_linewalk: Path, tmp_path: Path
) -> None:
    b = load_bundle(served_linewalk)

    def greedy_on_the_released_values(states: np.ndarray) -> np.ndarray:
        return np.argmax(served_values(b, states), axis=1).astype(np.int64)

    with LocalServer(served_linewalk, f"sqlite:///{tmp_path / 'store.sqlite'}") as srv:
        card, scores = evaluate_served(srv.target, episodes=3, seed=5)
    assert card == b.public_card()
    served, rnd = scores
    assert served.policy == "served release (GetBestActions)" and served.episodes == 3
    want = lockstep_returns(LW, greedy_on_the_released_values, episodes=3, seed=5, env_kwargs={})
    assert served.mean == pytest.approx(float(np.mean(want)), abs=0.0)
    act_rng = np.random.default_rng(5)  # the random row's own seeded actions

    def uniform(states: np.ndarray) -> np.ndarray:
        return act_rng.integers(0, 2, size=len(states)).astype(np.int64)

    assert rnd.policy == "random"
    assert rnd.mean == float(np.mean(lockstep_returns(LW, uniform, episodes=3, seed=5,
                                                      env_kwargs={})))  # fmt: skip
