"""Collect an offline dataset from any Gymnasium env under a public behaviour policy.

``collect(env_id, users, seed)`` runs ``episodes_per_user`` episodes for each of ``users``
users and returns a validated :class:`qveil.dataset.Dataset`. The env needs a ``Box``
observation space (flattened to d coordinates) and a ``Discrete`` action space (stored as
``action - start``, so actions are always ``0 .. n - 1``). The behaviour policy is
uniformly random unless ``behaviour`` names another (:mod:`qveil.trainer.behaviour`: a
public heuristic mixed epsilon-greedy with uniform actions); the dataset records it.

Randomness: user u's episode k draws its env seed and its actions from
``SeedSequence(seed, spawn_key=(u, k))``, so a seed gives the same dataset every time, and
each user's data depends on (seed, u) only: the first 100 users of a 1000-user collection are
the 100-user collection. This is data generation for experiments, never release noise.

``terminal`` is True only when the env says *terminated*; a time-limit truncation leaves it
False (the state s2 still has a future, so fitted-Q bootstraps from it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from qveil.dataset import Dataset
from qveil.errors import InvalidArgument, NotFound, echo
from qveil.json_types import JSONMapping
from qveil.trainer.behaviour import Behaviour, resolve_behaviour
from qveil.trainer.env import GymEnv
from qveil.trainer.progress import progress as show_progress

__all__ = ["collect", "env_reward_range"]

#: An episode longer than this is refused (an env without a time limit would never end).
MAX_EPISODE_STEPS = 1_000_000

#: Actions are drawn in blocks of this many (one generator call per block, not per step).
_ACTION_BLOCK = 256


def env_reward_range(env: GymEnv) -> tuple[float, float] | None:
    """The range an env declares for its rewards, or None.

    Looks for ``reward_bounds`` (qveil's envs, e.g. LineWalk's (0.0, 0.5)) and then the
    pre-1.0 Gymnasium ``reward_range`` attribute, on the unwrapped env; an infinite range is
    no declaration (the privacy guarantee needs a finite public bound).
    """
    base = env.unwrapped
    for attr in ("reward_bounds", "reward_range"):
        value = getattr(base, attr, None)
        if value is None:
            continue
        try:
            lo, hi = (float(v) for v in value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(lo) and math.isfinite(hi) and lo < hi:
            return (lo, hi)
    return None


def _make(
    env_id: str,
    env_kwargs: JSONMapping | None = None,
    env_attrs: Mapping[str, float] | None = None,
) -> GymEnv:
    if not isinstance(env_id, str) or not env_id:
        raise InvalidArgument(f"env id must be a non-empty string, got {env_id!r}"[:120])
    try:
        env = gym.make(env_id, **dict(env_kwargs or {}))
    except gym.error.Error as exc:  # unknown id, missing dependency, deprecated version
        # Gymnasium's message repeats the id: echo it once, clipped, not again in full
        reason = str(exc).replace(env_id, "<id>")[:160]
        raise NotFound(f"cannot make env {echo(env_id)}: {reason}") from None
    for name, value in (env_attrs or {}).items():
        if not hasattr(env.unwrapped, name):
            env.close()
            raise InvalidArgument(f"env {echo(env_id)} has no attribute {echo(name)}")
        setattr(env.unwrapped, name, value)
    return env


def _flat(obs: object, d: int) -> np.ndarray:
    """The observation as a [d] vector (a 1-D float array passes through without a copy;
    the row assignment in :meth:`_Rows.add` casts it to float64)."""
    if type(obs) is np.ndarray and obs.ndim == 1:
        return obs
    return np.asarray(obs, dtype=np.float64).reshape(d)


class _Rows:
    """Growing column buffers (amortised doubling), so 1e5 users need no Python lists."""

    def __init__(self, d: int, capacity: int) -> None:
        self.n = 0
        self.user = np.empty(capacity, np.int64)
        self.s = np.empty((capacity, d), np.float64)
        self.a = np.empty(capacity, np.int64)
        self.r = np.empty(capacity, np.float64)
        self.s2 = np.empty((capacity, d), np.float64)
        self.terminal = np.empty(capacity, np.bool_)

    def _grow(self) -> None:
        for name in ("user", "s", "a", "r", "s2", "terminal"):
            old = getattr(self, name)
            new = np.empty((2 * old.shape[0],) + old.shape[1:], old.dtype)
            new[: self.n] = old[: self.n]
            setattr(self, name, new)

    def add(
        self, u: int, s: np.ndarray, a: np.int64, r: SupportsFloat, s2: np.ndarray, term: bool
    ) -> None:
        if self.n == self.a.shape[0]:
            self._grow()
        i = self.n
        self.user[i] = u
        self.s[i] = s
        self.a[i] = a
        self.r[i] = r
        self.s2[i] = s2
        self.terminal[i] = term
        self.n = i + 1


def collect(
    env_id: str,
    users: int,
    seed: int,
    episodes_per_user: int = 1,
    progress: bool = False,
    *,
    reward_range: tuple[float, float] | None = None,
    clip_rewards: bool = False,
    first_user: int = 0,
    env_kwargs: JSONMapping | None = None,
    env_attrs: Mapping[str, float] | None = None,
    behaviour: Behaviour | None = None,
) -> Dataset:
    """Collect ``episodes_per_user`` episodes for each of ``users`` users.

    ``reward_range`` declares the public reward range when the env declares none (CartPole
    pays 1 per step: ``(0, 1)``); given, it replaces the env's declaration. Neither available
    is an error, raised before any step. Rewards outside the range, NaN observations, and the
    like are refused with the array and row (nothing is returned), unless ``clip_rewards``:
    then every reward is clipped into the range (the public reward definition of the release,
    for envs such as LunarLander whose rewards have no hard bound).

    ``first_user``: collect users ``first_user .. first_user + users - 1`` (ids and seeds as
    in the full collection: a shard of users of a larger collection, for
    :mod:`qveil.trainer.distributed`).

    ``env_kwargs`` go to ``gym.make`` (LunarLander's ``gravity``); ``env_attrs`` are set on
    the unwrapped env after it is made (CartPole's ``length`` and ``polemass_length``): a
    simulator of other, public dynamics, e.g. for a public prior (:mod:`qveil.kfqi_prior`).

    ``behaviour``: the behaviour policy (default uniformly random; its actions draw from the
    same per-episode generator, so ``random`` gives the same data as before it existed).
    """
    _check_counts(users, episodes_per_user, seed, first_user)
    beh = behaviour if behaviour is not None else resolve_behaviour()
    env = _make(env_id, env_kwargs, env_attrs)
    try:
        act_space, obs_space = _check_spaces(env, env_id)
        n_actions = int(act_space.n)
        start = int(act_space.start)
        d = max(1, int(np.prod(obs_space.shape)))
        beh.check_env(env_id, d, n_actions)
        rr = reward_range if reward_range is not None else env_reward_range(env)
        if rr is None:
            raise InvalidArgument(
                f"env {echo(env_id)} declares no reward range; give one "
                "(--reward-range LO,HI; CartPole: 0,1): the guarantee needs a public bound"
            )
        steps_guess = (env.spec.max_episode_steps if env.spec else None) or 64
        rows = _Rows(d, max(16, min(users * episodes_per_user * steps_guess, 1 << 16)))
        root = int(seed)
        with show_progress(int(users), desc="collect", unit="user", enabled=progress) as bar:
            for u in range(int(first_user), int(first_user) + int(users)):
                for k in range(int(episodes_per_user)):
                    env_ss, act_ss = np.random.SeedSequence(root, spawn_key=(u, k)).spawn(2)
                    rng = np.random.default_rng(act_ss)
                    actions = (
                        _uniform_actions(rng, n_actions)
                        if beh.uniform
                        else _policy_actions(beh, rng, n_actions)
                    )
                    _episode(env, rows, u, env_ss, actions, start, d)
                bar.update(1)
    finally:
        env.close()
    n = rows.n
    r = np.clip(rows.r[:n], rr[0], rr[1]) if clip_rewards else rows.r[:n]
    return Dataset(
        user=rows.user[:n],
        s=rows.s[:n],
        a=rows.a[:n],
        r=r,
        s2=rows.s2[:n],
        terminal=rows.terminal[:n],
        n_actions=n_actions,
        reward_range=rr,
        env_id=env_id,
        behaviour=beh.describe(),
    )


def _check_counts(
    users: object, episodes_per_user: object, seed: object, first_user: object
) -> None:
    """The collection's counts are whole numbers in range (InvalidArgument naming the first
    bad one)."""
    for name, value, low in (("users", users, 1), ("episodes_per_user", episodes_per_user, 1)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
            raise InvalidArgument(f"{name} must be an integer >= {low}, got {value!r}"[:120])
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise InvalidArgument(f"seed must be an integer >= 0, got {seed!r}"[:120])
    if isinstance(first_user, bool) or not isinstance(first_user, int | np.integer):
        raise InvalidArgument(f"first_user must be an integer >= 0, got {first_user!r}"[:120])
    if first_user < 0:
        raise InvalidArgument(f"first_user must be an integer >= 0, got {first_user!r}"[:120])


def _check_spaces(env: GymEnv, env_id: str) -> tuple[spaces.Discrete, spaces.Box]:
    """qveil datasets need Discrete actions and Box observations: the two spaces."""
    if not isinstance(env.action_space, spaces.Discrete):
        raise InvalidArgument(
            f"env {echo(env_id)} has action space {type(env.action_space).__name__}; "
            "qveil datasets need Discrete actions"
        )
    if not isinstance(env.observation_space, spaces.Box):
        raise InvalidArgument(
            f"env {echo(env_id)} has observation space "
            f"{type(env.observation_space).__name__}; qveil datasets need a Box"
        )
    return env.action_space, env.observation_space


def _uniform_actions(rng: np.random.Generator, n_actions: int) -> Callable[[np.ndarray], np.int64]:
    """The uniform random policy: actions drawn in blocks of :data:`_ACTION_BLOCK` (one
    generator call per block), as numpy integers (what ``Discrete.sample`` returns;
    Gymnasium's ``contains`` checks them without the per-call ``iinfo`` Python ints need)."""
    block = rng.integers(0, n_actions, size=_ACTION_BLOCK)
    t = 0

    def next_action(_s: np.ndarray) -> np.int64:
        nonlocal block, t
        if t == _ACTION_BLOCK:
            block = rng.integers(0, n_actions, size=_ACTION_BLOCK)
            t = 0
        t += 1
        return np.int64(block[t - 1])

    return next_action


def _policy_actions(
    behaviour: Behaviour, rng: np.random.Generator, n_actions: int
) -> Callable[[np.ndarray], np.int64]:
    """``behaviour``'s actions, one :meth:`Behaviour.act` per step on the float64 state."""
    return lambda s: np.int64(behaviour.act(np.asarray(s, dtype=np.float64), rng, n_actions))


def _episode(
    env: GymEnv,
    rows: _Rows,
    user: int,
    env_ss: np.random.SeedSequence,
    next_action: Callable[[np.ndarray], np.int64],
    start: int,
    d: int,
) -> None:
    """One episode, its actions from ``next_action(state)``, appended to ``rows``."""
    obs, _ = env.reset(seed=int(env_ss.generate_state(1, np.uint64)[0]))
    s = _flat(obs, d)
    for _ in range(MAX_EPISODE_STEPS):
        a = next_action(s)
        obs, reward, terminated, truncated, _ = env.step(a + start if start else a)
        s2 = _flat(obs, d)
        rows.add(user, s, a, reward, s2, terminated)
        if terminated or truncated:
            return
        s = s2
    raise InvalidArgument(
        f"an episode ran {MAX_EPISODE_STEPS} steps without ending; wrap the env in a time limit"
    )
