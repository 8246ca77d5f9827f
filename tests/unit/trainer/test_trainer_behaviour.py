"""The public behaviour policies (qveil.trainer.behaviour) and collection under them: the
named heuristics, epsilon-greedy mixing, MODULE:CALLABLE, refusals, and the default random
policy giving the same data as before the option existed."""

from __future__ import annotations

import numpy as np
import pytest

from qveil.errors import InvalidArgument
from qveil.trainer.behaviour import (
    HEURISTICS,
    cartpole_balance,
    mountaincar_energy,
    resolve_behaviour,
)
from qveil.trainer.collect import collect

#: Fingerprints of collections made before behaviour policies existed (uniform actions):
#: the default must keep giving these bits.
RANDOM_FINGERPRINTS = {
    (
        "CartPole-v1",
        5,
        3,
    ): "sha256:930eaed5c84dc187e42a557da2d6702f5959111ee7b850c2f5d1eaaf1f343b43",
    (
        "MountainCar-v0",
        2,
        3,
    ): "sha256:87587c74115333024fc57011c38889654141f1908979760cb50569b0ea412a6e",
}
RANGES = {"CartPole-v1": (0.0, 1.0), "MountainCar-v0": (-1.0, 0.0)}


def test_the_heuristics_push_where_their_rule_says() -> None:
    rng = np.random.default_rng(0)
    assert mountaincar_energy(np.array([-0.5, 0.01]), rng) == 2
    assert mountaincar_energy(np.array([-0.5, -0.01]), rng) == 0
    assert mountaincar_energy(np.array([-0.5, 0.0]), rng) == 2  # at rest: right
    assert cartpole_balance(np.array([0.0, 0.0, 0.05, -0.01]), rng) == 1
    assert cartpole_balance(np.array([0.0, 0.0, 0.05, -0.2]), rng) == 0
    assert set(HEURISTICS) == {"mountaincar-energy", "cartpole-balance"}


def test_epsilon_mixes_uniform_actions_in_the_stated_share() -> None:
    obs = np.array([-0.5, 0.01])  # the heuristic says 2
    greedy = resolve_behaviour("mountaincar-energy", 0.0)
    rng = np.random.default_rng(1)
    assert {greedy.act(obs, rng, 3) for _ in range(50)} == {2}
    mixed = resolve_behaviour("mountaincar-energy", 0.3)
    acts = np.array([mixed.act(obs, rng, 3) for _ in range(6000)])
    # P(not 2) = 0.3 * 2/3 = 0.2; 6000 draws: sd 0.005, the band is 8 sd wide
    assert abs(float((acts != 2).mean()) - 0.2) < 0.04
    assert set(acts.tolist()) == {0, 1, 2}
    assert mixed.describe() == "mountaincar-energy (epsilon 0.3)"
    assert resolve_behaviour().describe() == "random" and resolve_behaviour().uniform


def returns_a_float(obs: np.ndarray, rng: np.random.Generator) -> float:
    return 0.5


def test_module_callable_is_imported_and_checked() -> None:
    b = resolve_behaviour("qveil.trainer.behaviour:cartpole_balance", 0.1)
    assert b.policy is cartpole_balance and b.describe().startswith("qveil.trainer.behaviour:")
    obs, rng = np.array([0.2, 0.3]), np.random.default_rng(0)
    with pytest.raises(InvalidArgument, match="not an action"):
        resolve_behaviour(f"{__name__}:returns_a_float").act(obs, rng, 3)
    with pytest.raises(InvalidArgument, match="failed: TypeError"):
        resolve_behaviour("numpy:sum").act(obs, rng, 3)  # sum(obs, rng): rng is no axis
    with pytest.raises(InvalidArgument, match="cannot import"):
        resolve_behaviour("no_such_module_qveil:f")
    with pytest.raises(InvalidArgument, match="not callable"):
        resolve_behaviour("math:pi")


@pytest.mark.parametrize(
    ("name", "epsilon", "match"),
    [
        ("greedy", 0.0, "unknown behaviour policy 'greedy'"),
        ("", 0.0, "must be a name"),
        ("random", 1.5, r"in \[0, 1\]"),
        ("mountaincar-energy", -0.1, r"in \[0, 1\]"),
        ("mountaincar-energy", float("nan"), r"in \[0, 1\]"),
        ("mountaincar-energy", True, "a number"),
    ],
)
def test_bad_names_and_epsilons_are_refused(name: str, epsilon: float, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        resolve_behaviour(name, epsilon)


def test_random_collection_keeps_its_bits() -> None:
    for (env, users, seed), fp in RANDOM_FINGERPRINTS.items():
        ds = collect(env, users, seed, reward_range=RANGES[env])
        assert ds.fingerprint() == fp and ds.behaviour == "random"
        explicit = collect(
            env, users, seed, reward_range=RANGES[env], behaviour=resolve_behaviour()
        )
        assert explicit.fingerprint() == fp


def test_a_heuristic_collection_is_seeded_recorded_and_reaches_the_goal() -> None:
    beh = resolve_behaviour("mountaincar-energy", 0.0)
    ds = collect("MountainCar-v0", 3, 5, reward_range=(-1.0, 0.0), behaviour=beh)
    assert ds.behaviour == "mountaincar-energy (epsilon 0)"
    assert int(ds.terminal.sum()) == 3  # every episode reaches the goal
    assert ds.summary()["behaviour"] == "mountaincar-energy (epsilon 0)"
    mixed = resolve_behaviour("mountaincar-energy", 0.3)
    a = collect("MountainCar-v0", 3, 5, reward_range=(-1.0, 0.0), behaviour=mixed)
    b = collect("MountainCar-v0", 3, 5, reward_range=(-1.0, 0.0), behaviour=mixed)
    assert a.fingerprint() == b.fingerprint() != ds.fingerprint()
    # one user's data depends on (seed, user) only, as for the random policy
    one = collect("MountainCar-v0", 1, 5, reward_range=(-1.0, 0.0), behaviour=mixed)
    assert np.array_equal(one.a, a.a[a.user == 0])


def test_a_heuristic_for_another_env_shape_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="is for 4 coordinates and 2 actions"):
        collect(
            "MountainCar-v0",
            1,
            0,
            reward_range=(-1.0, 0.0),
            behaviour=resolve_behaviour("cartpole-balance", 0.1),
        )
