"""The private off-policy evaluation (qveil.ope, qveil.privacy.ope) against the simulator's
true value, over seeds.

Per seed and env: a release trained on N users (the fqi estimator of the env's config, at
epsilon 1), its greedy policy with one seeded draw of its release noise (what a server would
answer), the private estimate at epsilon 1 from N held-out users, and the policy's true
discounted value from the same start distribution by Monte Carlo in the simulator (episodes
from fresh random starts, discount gamma of the config). Reports how often the estimate's 95%
interval covers the true value, and the estimate's bias.

Writes private_eval.csv and private_eval.png under ``out``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from qveil.additive import AdditiveSamplePath
from qveil.bundle import Bundle, load_bundle
from qveil.experiments._util import write_table_and_plot
from qveil.experiments.plotting import env_panels, legend_below, save
from qveil.json_types import JSONObject
from qveil.kfqi_config import load_fqi_config
from qveil.ope import policy_value
from qveil.privacy.ope import OPEPrivacyParams, calibrate_ope

__all__ = ["run"]

REPO = Path(__file__).resolve().parents[3]
#: (env, its public config, held-out users N, seeds): every environment with an fqi config
#: in configs/; fewer seeds where one seed costs minutes (Acrobot's 500-step episodes,
#: LunarLander's collection)
PLAN = [
    ("qveil/LineWalk-v0", "linewalk-private.toml", 300, 10),
    ("CartPole-v1", "cartpole-private.toml", 10_000, 10),
    ("Acrobot-v1", "acrobot-private.toml", 1000, 3),
    ("LunarLander-v3", "lunarlander-sobol.toml", 2000, 3),
    ("LunarLander-v3", "lunarlander-private.toml", 2000, 3),
    ("qveil/Reach16-v0", "reach16-private.toml", 1000, 5),
    ("MountainCar-v0", "mountaincar-private.toml", 1000, 3),
]


def _true_value(
    env_id: str,
    act: Callable[[np.ndarray], np.ndarray],
    gamma: float,
    episodes: int,
    seed: int,
) -> tuple[float, float]:
    """Monte Carlo from the env's start distribution: the discounted value of ``act`` (what
    the private evaluation estimates) and its mean episode return (what serving it scores),
    over the same whole episodes."""
    # gymnasium loads only when episodes are run (importing qveil.trainer registers its envs)
    import gymnasium as gym

    from qveil.trainer import register_envs

    register_envs()
    env = gym.make(env_id)
    value = ret = 0.0
    for e in range(episodes):
        obs, _ = env.reset(seed=seed * 100_000 + e)
        disc, done = 1.0, False
        while not done:
            a = int(act(np.asarray(obs, dtype=np.float64).reshape(1, -1))[0])
            obs, r, term, trunc, _ = env.step(a)
            value += disc * float(r)
            ret += float(r)
            disc *= gamma
            done = term or trunc
    env.close()
    return value / episodes, ret / episodes


def run(
    *,
    out: Path,
    quick: bool = False,
    seeds: int | None = None,
    plan: list[tuple[str, str, int, int]] | None = None,
    **_: object,
) -> dict[str, Path]:

    # the trainer's modules load gymnasium: only when this runs
    from qveil.trainer.behaviour import resolve_behaviour
    from qveil.trainer.collect import collect
    from qveil.trainer.estimators import create_estimator
    from qveil.trainer.private_eval import Z95, estimator_of

    out.mkdir(parents=True, exist_ok=True)
    if plan is None:
        plan = [(e, c, 100, 2) for e, c, _, _ in PLAN[:1]] if quick else PLAN
    rows: list[JSONObject] = []
    t0 = time.perf_counter()
    for env_id, config, users, env_seeds in plan:
        n_seeds = seeds or env_seeds
        cfg = load_fqi_config(REPO / "configs" / config)
        rr = getattr(cfg, "reward_range", None)
        rr = None if rr is None else (float(rr[0]), float(rr[1]))
        for seed in range(n_seeds):
            # rewards clipped into the config's public range (LunarLander); the users act
            # under the config's public behaviour policy (MountainCar: the heuristic)
            clip, beh = (
                rr is not None,
                resolve_behaviour(cfg.behaviour_policy, cfg.behaviour_epsilon),
            )
            train = collect(
                env_id, users, 1000 + seed, reward_range=rr, clip_rewards=clip, behaviour=beh
            )
            held = collect(
                env_id, users, 2000 + seed, reward_range=rr, clip_rewards=clip, behaviour=beh
            )
            with tempfile.TemporaryDirectory() as tmp:
                b = load_bundle(
                    create_estimator(cfg)
                    .train(train, Path(tmp) / "b", force=True, allow_clipping=True)
                    .path
                )
            m = b.n_actions
            rng = np.random.default_rng([seed, 5])
            paths = [AdditiveSamplePath(betas=b.betas, sigma=b.sigma, rng=rng) for _ in range(m)]

            def act(
                x: np.ndarray, b: Bundle = b, paths: list[AdditiveSamplePath] = paths
            ) -> np.ndarray:
                raw = x.reshape(len(x), b.dims)
                unit = b.box.to_unit(raw, clip=True)
                g = np.stack([p.sample(unit) for p in paths], axis=1)
                return np.asarray(np.argmax(b.q_values(raw) + g, axis=1))

            spec, box, _env, rr_eval = estimator_of(cfg, held)
            lo = np.array([iv.lo for iv in box.intervals])
            hi = np.array([iv.hi for iv in box.intervals])

            def policy(u: np.ndarray, lo: np.ndarray = lo, hi: np.ndarray = hi) -> np.ndarray:
                return act(lo + u * (hi - lo))

            j, _per_user = policy_value(
                held.transitions,
                policy=policy,
                n_actions=m, reward_range=rr_eval,
                box=box, spec=spec,
            )  # fmt: skip
            res = calibrate_ope(
                OPEPrivacyParams(users=held.users, reward_range=rr_eval, gamma=spec.gamma,
                                 iterations=spec.iterations, delta=1e-5),
                epsilon=1.0,
            )  # fmt: skip
            est = j + res.sigma * float(np.random.default_rng([seed, 9]).standard_normal())
            truth, served_return = _true_value(
                env_id, act, spec.gamma, 100 if not quick else 20, seed
            )
            half = Z95 * res.sigma
            rows.append(
                {
                    "env": env_id, "users": users, "seed": seed, "estimate": est,
                    "non_private_estimate": j, "sigma": res.sigma, "true_value": truth,
                    "served_return": served_return,
                    "covered": abs(est - truth) <= half, "bias": j - truth,
                }
            )  # fmt: skip
            print(
                f"private-eval [{time.perf_counter() - t0:.0f} s] {env_id} seed {seed}: "
                f"estimate {est:.4g} +- {half:.3g}, true {truth:.4g} (episode return "
                f"{served_return:.4g})", flush=True
            )  # fmt: skip
    return write_table_and_plot(out, "private_eval", rows, _plot)


def _plot(rows: list[JSONObject], path: Path) -> None:

    fig, panels = env_panels(rows)
    for ax, env, rs in panels:
        x = np.arange(len(rs))
        ax.errorbar(x, [r["estimate"] for r in rs], yerr=[1.96 * r["sigma"] for r in rs],
                    fmt="o", capsize=3, label="private estimate (95%)")  # fmt: skip
        ax.plot(x, [r["true_value"] for r in rs], "kx", label="true value (simulator)")
        ax.set_title(f"{env}: N = {rs[0]['users']}, eps 1")
        ax.set_xticks(x, [str(r["seed"]) for r in rs])
        ax.set_xlabel("seed")
        ax.set_ylabel("discounted value from the start distribution")
    legend_below(fig, [ax for ax, _, _ in panels])
    save(fig, path)
