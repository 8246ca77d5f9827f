"""Evaluate a release bundle: average return of greedy policies on the bundle's environment.

* ``released``: argmax_a of the release's answers, computed in process from its key exactly
  as the server answers them (:func:`qveil.answer.released_values`);
* ``bare network``: argmax_a Q(s, a) without noise (what the privacy costs is the gap);
* ``random`` and, on LineWalk, the hand-written ``towards 0.5`` policy as references.

Torch-free: it uses :class:`qveil.bundle.Bundle`'s numpy forward pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from qveil.answer import released_values
from qveil.bundle import Bundle
from qveil.errors import InvalidArgument
from qveil.trainer import register_envs
from qveil.trainer.env import ENV_ID, GymEnv, towards_middle_policy

__all__ = [
    "PolicyScore",
    "evaluate_bundle",
    "format_table",
    "plot_scores",
    "run_policy",
    "summary_line",
]


@dataclass(frozen=True)
class PolicyScore:
    """Mean, standard deviation and standard error of the episode return of one policy."""

    policy: str
    mean: float
    std: float
    sem: float
    episodes: int


def run_policy(
    env: GymEnv,
    policy: Callable[[float], int],
    *,
    episodes: int,
    seed: int | None = None,
) -> list[float]:
    """Undiscounted returns of ``policy`` (raw state -> action) over ``episodes`` episodes."""
    returns = []
    obs, _ = env.reset(seed=seed)
    for _ in range(int(episodes)):
        total = 0.0
        while True:
            obs, r, term, trunc, _ = env.step(policy(float(np.asarray(obs).reshape(-1)[0])))
            total += float(r)
            if term or trunc:
                break
        returns.append(total)
        obs, _ = env.reset()
    return returns


def _score(name: str, rets: list[float]) -> PolicyScore:
    a = np.asarray(rets, dtype=float)
    std = float(a.std(ddof=1)) if len(a) > 1 else 0.0
    return PolicyScore(name, float(a.mean()), std, std / max(1.0, np.sqrt(len(a))), len(a))


def evaluate_bundle(
    bundle: Bundle,
    *,
    episodes: int = 100,
    seed: int | None = None,
) -> list[PolicyScore]:
    """Score the released (noisy), bare, random and reference policies on the bundle's env.

    The released policy is the release's own: its answers computed in process from its key,
    exactly as the server answers them (:func:`qveil.answer.released_values`). Every policy
    sees the same sequence of environment seeds when ``seed`` is given.
    """
    register_envs()
    if episodes < 1:
        raise InvalidArgument(f"episodes must be >= 1, got {episodes!r}")
    kwargs = dict(bundle.card.get("hyperparameters", {}).get("env_kwargs", {}))
    env = gym.make(bundle.env_id, **kwargs)
    m = bundle.n_actions
    act_rng = np.random.default_rng(seed)

    def released(s: float) -> int:
        x = bundle.box.to_unit([s])  # clipped into the interval, as the server does
        return int(np.argmax(released_values(bundle, x)[0]))

    def bare(s: float) -> int:
        return int(np.argmax(bundle.q_values([s])[0]))

    def random_policy(_s: float) -> int:
        return int(act_rng.integers(m))

    policies: list[tuple[str, Callable[[float], int]]] = [
        (f"released (Q + g, the release's key, sigma={bundle.sigma:.4g})", released),
        ("bare network (Q, no noise)", bare),
        ("random", random_policy),
    ]
    if bundle.env_id == ENV_ID:
        policies.append(("towards 0.5 (hand-written)", towards_middle_policy))
    try:
        return [
            _score(name, run_policy(env, pol, episodes=episodes, seed=seed))
            for name, pol in policies
        ]
    finally:
        env.close()


def format_table(scores: list[PolicyScore]) -> str:
    """A plain-text table: policy, mean return, std, standard error, episodes."""
    w = max(len(s.policy) for s in scores)
    lines = [
        f"{'policy':<{w}}  {'mean return':>11}  {'std':>7}  {'s.e.':>6}  episodes",
        "-" * (w + 42),
    ]
    lines += [
        f"{s.policy:<{w}}  {s.mean:>11.3f}  {s.std:>7.3f}  {s.sem:>6.3f}  {s.episodes:>8}"
        for s in scores
    ]
    return "\n".join(lines)


def summary_line(scores: list[PolicyScore]) -> str:
    """One line of the mean returns, each policy by its name without the parenthesis:
    ``served release 20.7, random 11.3, non-private FQI 20.7 (mean return over 100
    episodes)``."""
    parts = ", ".join(f"{s.policy.split(' (')[0]} {s.mean:.1f}" for s in scores)
    counts = sorted({s.episodes for s in scores})
    episodes = " or ".join(str(n) for n in counts)
    return f"{parts} (mean return over {episodes} episodes)"


def plot_scores(scores: list[PolicyScore], path: str, *, title: str = "") -> None:
    """A bar chart of the mean returns with +-1 standard error (PNG)."""
    # matplotlib loads only when a plot is drawn (a heavy import)
    import matplotlib

    matplotlib.use("Agg")
    # pyplot after matplotlib.use('Agg') above: no display is needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=100)
    names = [s.policy for s in scores]
    ax.barh(names, [s.mean for s in scores], xerr=[s.sem for s in scores], color="tab:blue")
    ax.invert_yaxis()
    ax.set_xlabel(f"mean return over {scores[0].episodes} episodes (+-1 s.e.)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
