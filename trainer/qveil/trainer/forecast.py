"""A utility forecast from public information only: what a release of this config, N users
and epsilon is expected to be worth, before any private data is read.

The forecast runs the same estimator (:mod:`qveil.trainer.estimators`) on **public data of
the same shape**: N simulated users of the environment's public simulator under the
config's public behaviour policy (``behaviour_policy`` and ``behaviour_epsilon``, uniformly
random actions by default; one episode per user: what ``qveil dataset collect --policy``
records), or a public dataset the user names. It writes a
throw-away release bundle of that simulated data (never served, never bound, never
recorded), then plays, on common episode seeds, the non-private mean (the ceiling), the
uniformly random policy (the floor) and ``releases`` simulated private releases (the mean plus
a seeded draw of the release's own GP noise at the accountant's sigma for N and epsilon), and
reports the fraction of the way from random to non-private with a bootstrap interval over
releases and episodes.

It spends no privacy: nothing in it is computed from the private dataset (the accountant's
sigma is a function of N, epsilon and the public config; the data are simulated). Its error
is the gap between the simulator and the real users, which docs/results.md measures for
CartPole and LineWalk against served releases.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from qveil.additive import AdditiveSamplePath
from qveil.bundle import Bundle, load_bundle
from qveil.errors import InvalidArgument
from qveil.json_types import JSONObject
from qveil.kfqi_config import KernelFQIConfig
from qveil.trainer import register_envs
from qveil.trainer.behaviour import resolve_behaviour
from qveil.trainer.collect import collect
from qveil.trainer.estimators import create_estimator
from qveil.training_data import TrainingData

__all__ = ["MEASURED_ERROR", "NEAR_RANDOM", "Forecast", "forecast", "lockstep"]

#: A forecast whose interval's upper end is below this fraction warns: near random.
NEAR_RANDOM = 0.2

#: The forecast's own error, measured: per environment, the largest |forecast - served|
#: fraction over the sizes N where both were measured at epsilon 1, and how many sizes
#: (docs/results.md section 10, ``qveil experiments forecast``). The forecast's interval
#: covers its simulated noise and episodes only; this is the gap to real served releases.
MEASURED_ERROR: dict[str, tuple[float, int]] = {
    "qveil/LineWalk-v0": (0.02, 2),
    "CartPole-v1": (0.0, 1),
    # 2.04 and 0.63 with configs/lunarlander-sobol.toml (2000, 1e4 users), 0.02 with
    # configs/lunarlander-private.toml (3e4 users): the largest
    "LunarLander-v3": (2.04, 3),
    "qveil/Reach16-v0": (0.68, 2),
    "MountainCar-v0": (0.02, 1),
}

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Forecast:
    """The expected fraction of the way from random to non-private, with its 95% interval,
    and whether the non-private fit itself beats random (``gain_lo``: the lower end of the
    95% interval of its mean return minus random's, paired episodes)."""

    env_id: str
    users: int
    epsilon: float
    sigma: float
    fraction: float
    fraction_lo: float
    fraction_hi: float
    private: float
    non_private: float
    random: float
    releases: int
    episodes: int
    source: str
    gain_lo: float

    @property
    def random_level(self) -> bool:
        """The non-private fit is not measurably better than random (its gain's interval
        reaches 0): the data cannot support a better policy, whatever N and epsilon; the
        fraction of the way is then meaningless."""
        return not self.gain_lo > 0.0

    @property
    def worse_than_random(self) -> bool:
        """The release is expected to return less than a random policy (fraction < 0)."""
        return not self.random_level and self.fraction < 0.0

    @property
    def near_random(self) -> bool:
        return not self.fraction_hi >= NEAR_RANDOM

    @property
    def refusal(self) -> str | None:
        """Why ``qveil train --forecast`` refuses this release unless forced (None: it
        does not)."""
        if self.random_level:
            return (
                "the forecast says the data cannot support any policy better than random "
                "(the non-private fit is random-level)"
            )
        if self.worse_than_random:
            return "the forecast says the release would be WORSE THAN A RANDOM POLICY"
        return None

    @property
    def measured_error(self) -> tuple[float, int] | None:
        """(largest |forecast - served| measured for this env, over how many sizes N), or
        None where no served release of the env was measured."""
        return MEASURED_ERROR.get(self.env_id)

    def error_text(self) -> str:
        """The forecast's own error in words: what its interval covers and what was
        measured against served releases."""
        covers = (
            "its 95% interval covers the simulated noise and episodes only, not the gap "
            "between the public simulator's users (its behaviour policy) and your users"
        )
        err = self.measured_error
        if err is None:
            measured = ", ".join(sorted(MEASURED_ERROR))
            return (
                f"the forecast's own error: not measured for {self.env_id} (measured for "
                f"{measured}: docs/results.md section 10); {covers}"
            )
        return (
            f"the forecast's own error: against releases of {self.env_id} served at "
            f"{err[1]} size{'s' if err[1] != 1 else ''} N, it was off by at most "
            f"{err[0]:.2f} of the way (docs/results.md section 10); {covers}"
        )

    def to_dict(self) -> JSONObject:
        out = {k: _finite(getattr(self, k)) for k in self.__dataclass_fields__}
        err = self.measured_error
        return out | {
            "near_random": self.near_random,
            "random_level": self.random_level,
            "worse_than_random": self.worse_than_random,
            "measured_error": None if err is None else {"max_abs": err[0], "sizes": err[1]},
        }

    def text(self) -> str:
        head = (
            f"forecast ({self.source}; public simulation, no privacy spent): at N = "
            f"{self.users} users and epsilon {self.epsilon:g} (sigma {self.sigma:.4g})"
        )
        runs = f"({self.releases} simulated releases x {self.episodes} episodes)"
        if self.random_level:
            return "\n".join(
                [
                    f"{head} the non-private fit returns {self.non_private:.4g} against "
                    f"{self.random:.4g} for a random policy, and the release "
                    f"{self.private:.4g} {runs}",
                    "WARNING: the data CANNOT SUPPORT ANY POLICY BETTER THAN RANDOM: the "
                    "non-private fit of these users is not measurably better than a random "
                    "policy, so no epsilon can make the release useful; more users help only "
                    "if they make the non-private fit itself better, otherwise the config "
                    "(reward range, gamma, default_value, anchors) or the behaviour policy "
                    "that collects the data must change (docs/results.md)",
                    self.error_text(),
                ]
            )
        lines = [
            f"{head} the release "
            f"is expected to reach {self.fraction:.2f} (95% interval {self.fraction_lo:.2f} to "
            f"{self.fraction_hi:.2f}) of the way from random ({self.random:.4g}) to non-private "
            f"({self.non_private:.4g}): return {self.private:.4g} {runs}",
            self.error_text(),
        ]
        if self.worse_than_random:
            lines.append(
                "WARNING: the release is expected to be WORSE THAN A RANDOM POLICY (the noise "
                "swamps what the non-private fit learns): more users, a larger epsilon, or "
                "another config (docs/results.md) would be needed"
            )
        elif self.near_random:
            lines.append(
                "WARNING: the release is expected to be NEAR RANDOM: more users, a larger "
                "epsilon, or another config (docs/results.md) would be needed to make it useful"
            )
        return "\n".join(lines)


def _finite(v: object) -> object:
    """A float that JSON can carry: nan and infinities as None."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


def lockstep(
    env_id: str, policy: Callable[[FloatArray], npt.NDArray[np.int64]], seeds: Sequence[int]
) -> FloatArray:
    """Returns of one episode per seed, run side by side (one batched policy call a step)."""
    # gymnasium loads only when episodes are run
    import gymnasium as gym

    register_envs()
    envs = [gym.make(env_id) for _ in seeds]
    try:
        obs = np.stack(
            [
                np.asarray(e.reset(seed=int(s))[0], dtype=np.float64).reshape(-1)
                for e, s in zip(envs, seeds, strict=True)
            ]
        )
        total = np.zeros(len(envs))
        live = np.ones(len(envs), dtype=bool)
        while live.any():
            idx = np.flatnonzero(live)
            acts = policy(obs[idx])
            for i, a in zip(idx, acts, strict=True):
                o, r, term, trunc, _ = envs[i].step(int(a))
                obs[i] = np.asarray(o, dtype=np.float64).reshape(-1)
                total[i] += float(r)
                if term or trunc:
                    live[i] = False
        return total
    finally:
        for e in envs:
            e.close()


def _bootstrap(
    ceiling: FloatArray, floor: FloatArray, private: FloatArray, *, draws: int = 2000
) -> tuple[float, float, float, float]:
    """The fraction and its 95% percentile interval, resampling releases and (paired)
    episodes; and the lower end of the 95% interval of the non-private fit's gain over
    random (ceiling - floor, paired episodes)."""
    rng = np.random.default_rng(0)
    r, e = private.shape
    ri = rng.integers(r, size=(draws, r))
    ei = rng.integers(e, size=(draws, e))
    priv = np.array([private[ri[b]][:, ei[b]].mean() for b in range(draws)])
    top, low = ceiling[ei].mean(axis=1), floor[ei].mean(axis=1)
    gain_lo = float(np.percentile(top - low, 2.5))
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = (priv - low) / (top - low)
    c, f, p = float(ceiling.mean()), float(floor.mean()), float(private.mean())
    point = (p - f) / (c - f) if c != f else math.nan
    if not np.isfinite(frac).any():
        return point, math.nan, math.nan, gain_lo
    lo, hi = np.nanpercentile(frac, [2.5, 97.5])
    return point, float(lo), float(hi), gain_lo


def forecast(
    config: KernelFQIConfig,
    *,
    users: int,
    epsilon: float,
    dataset: TrainingData | None = None,
    releases: int = 8,
    episodes: int = 20,
    seed: int = 1,
) -> Forecast:
    """The forecast of ``config`` (an fqi config) for N = ``users`` and ``epsilon`` (see the
    module docstring). ``dataset``: a public dataset of the same shape (default: N users of
    the config's environment simulated with the config's behaviour policy, ``seed``)."""
    if int(users) < 1 or not (math.isfinite(epsilon) and epsilon > 0):
        raise InvalidArgument(
            f"a forecast needs users >= 1 and epsilon > 0, got {users}, {epsilon}"
        )
    est = create_estimator(config.replace(epsilon=float(epsilon), sigma=None))
    if not est.needs_dataset:
        raise InvalidArgument("forecasts are for the fqi estimators (a config with mode fqi)")
    env_id = getattr(config, "env_id", None) or getattr(dataset, "env_id", None)
    if not env_id:
        raise InvalidArgument("the config names no env_id: the forecast needs its simulator")
    if dataset is None:
        rr = getattr(config, "reward_range", None)
        behaviour = resolve_behaviour(config.behaviour_policy, config.behaviour_epsilon)
        dataset = collect(
            env_id,
            int(users),
            int(seed),
            reward_range=None if rr is None else (float(rr[0]), float(rr[1])),
            # the config's range is the release's public reward definition: what a
            # collection for it records (`qveil dataset collect --clip-rewards`)
            clip_rewards=rr is not None,
            behaviour=behaviour,
        )
        source = (
            f"{env_id}, {users} simulated users of behaviour policy {behaviour.describe()} "
            f"(seed {seed})"
        )
    else:
        # the public data is fitted as it is, and released with the noise of N = ``users``
        # users (the private release's), not of the public dataset's own user count
        plan = est.plan(
            users=int(users),
            actions=int(dataset.n_actions),
            dims=int(dataset.d),
            reward_range=tuple(getattr(config, "reward_range", None) or dataset.reward_range),
        )
        est = create_estimator(config.replace(epsilon=None, sigma=float(plan.sigma)))
        source = (
            f"the public dataset of {env_id} ({dataset.users} users), released with the "
            f"noise of {users} users"
        )
    with tempfile.TemporaryDirectory(prefix="qveil-forecast-") as tmp:
        out = est.train(dataset, Path(tmp) / "bundle", force=True, allow_clipping=True)
        b = load_bundle(out.path)
    sigma, m = float(b.sigma), int(b.n_actions)
    seeds = [10_000 + 1000 * int(seed) + e for e in range(int(episodes))]
    ceiling = lockstep(env_id, lambda o: np.argmax(b.q_values(_raw(o, b)), axis=1), seeds)
    rng = np.random.default_rng([int(seed), 7])
    floor = lockstep(env_id, lambda o: rng.integers(m, size=len(o)), seeds)
    private = _private_returns(b, env_id, seeds, releases=int(releases), seed=int(seed))
    frac, lo, hi, gain_lo = _bootstrap(ceiling, floor, private)
    return Forecast(
        env_id=str(env_id),
        users=int(users),
        epsilon=float(epsilon),
        sigma=sigma,
        fraction=frac,
        fraction_lo=lo,
        fraction_hi=hi,
        private=float(private.mean()),
        non_private=float(ceiling.mean()),
        random=float(floor.mean()),
        releases=int(releases),
        episodes=len(seeds),
        source=source,
        gain_lo=gain_lo,
    )


def _private_returns(
    b: Bundle, env_id: str, seeds: list[int], *, releases: int, seed: int
) -> FloatArray:
    """(releases, episodes): the returns of the greedy policy of ``releases`` simulated
    releases of bundle ``b``, each with fresh seeded noise paths (a forecast spends no
    privacy: the noise here is simulated, never stored)."""
    sigma, m = float(b.sigma), int(b.n_actions)
    private = np.zeros((releases, len(seeds)))
    for r in range(releases):
        paths = [
            AdditiveSamplePath(betas=b.betas, sigma=sigma, rng=np.random.default_rng([seed, r, a]))
            for a in range(m)
        ]

        def noisy(o: FloatArray, paths: list[AdditiveSamplePath] = paths) -> npt.NDArray[np.int64]:
            x = _raw(o, b)
            unit = b.box.to_unit(x, clip=True)
            g = np.stack([p.sample(unit) for p in paths], axis=1)
            best: npt.NDArray[np.int64] = np.argmax(b.q_values(x) + g, axis=1)
            return best

        private[r] = lockstep(env_id, noisy, seeds)
    return private


def _raw(obs: FloatArray, bundle: Bundle) -> FloatArray:
    """Observations as the bundle's states (n, d), d >= 1."""
    return obs.reshape(len(obs), bundle.dims)
