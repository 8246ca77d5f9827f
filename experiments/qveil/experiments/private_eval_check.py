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

import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["run"]

REPO = Path(__file__).resolve().parents[3]
PLAN = [
    ("qveil/LineWalk-v0", "linewalk-private.toml", 300),
    ("CartPole-v1", "cartpole-private.toml", 10_000),
]


def _true_value(env_id: str, act: Any, gamma: float, episodes: int, seed: int) -> float:
    """Monte Carlo discounted value of ``act`` from the env's start distribution."""
    import gymnasium as gym

    from qveil.trainer import register_envs

    register_envs()
    env = gym.make(env_id)
    total = 0.0
    for e in range(episodes):
        obs, _ = env.reset(seed=seed * 100_000 + e)
        g, disc, done = 0.0, 1.0, False
        while not done and disc > 1e-6:
            a = int(act(np.asarray(obs, dtype=np.float64).reshape(1, -1))[0])
            obs, r, term, trunc, _ = env.step(a)
            g += disc * float(r)
            disc *= gamma
            done = term or trunc
        total += g
    env.close()
    return total / episodes


def run(*, out: Path, quick: bool = False, seeds: int | None = None, **_: Any) -> dict[str, Path]:
    import tempfile

    from qveil.additive import AdditiveSamplePath
    from qveil.bundle import load_bundle
    from qveil.experiments._util import write_table_and_plot
    from qveil.kfqi_config import load_fqi_config
    from qveil.ope import policy_value
    from qveil.privacy.ope import OPEPrivacyParams, calibrate_ope
    from qveil.trainer.collect import collect
    from qveil.trainer.estimators import create_estimator
    from qveil.trainer.private_eval import Z95, estimator_of

    out.mkdir(parents=True, exist_ok=True)
    plan = [(e, c, 100) for e, c, _ in PLAN[:1]] if quick else PLAN
    n_seeds = seeds or (2 if quick else 10)
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for env_id, config, users in plan:
        cfg = load_fqi_config(REPO / "configs" / config)
        rr = getattr(cfg, "reward_range", None)
        rr = None if rr is None else (float(rr[0]), float(rr[1]))
        for seed in range(n_seeds):
            train = collect(env_id, users, 1000 + seed, reward_range=rr)
            held = collect(env_id, users, 2000 + seed, reward_range=rr)
            with tempfile.TemporaryDirectory() as tmp:
                b = load_bundle(
                    create_estimator(cfg)
                    .train(train, Path(tmp) / "b", force=True, allow_clipping=True)
                    .path
                )
            m = b.n_actions
            rng = np.random.default_rng([seed, 5])
            paths = [AdditiveSamplePath(betas=b.betas, sigma=b.sigma, rng=rng) for _ in range(m)]

            def act(x: np.ndarray, b: Any = b, paths: list[Any] = paths) -> np.ndarray:
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
                held.s, held.a, held.r, held.s2, held.terminal, held.user,
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
            truth = _true_value(env_id, act, spec.gamma, 200 if not quick else 40, seed)
            half = Z95 * res.sigma
            rows.append(
                {
                    "env": env_id, "users": users, "seed": seed, "estimate": est,
                    "non_private_estimate": j, "sigma": res.sigma, "true_value": truth,
                    "covered": abs(est - truth) <= half, "bias": j - truth,
                }
            )  # fmt: skip
            print(
                f"private-eval [{time.perf_counter() - t0:.0f} s] {env_id} seed {seed}: "
                f"estimate {est:.4g} +- {half:.3g}, true {truth:.4g}", flush=True
            )  # fmt: skip
    return write_table_and_plot(out, "private_eval", rows, _plot)


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    from qveil.experiments.plotting import env_panels, save

    fig, panels = env_panels(rows)
    for ax, env, rs in panels:
        x = np.arange(len(rs))
        ax.errorbar(x, [r["estimate"] for r in rs], yerr=[1.96 * r["sigma"] for r in rs],
                    fmt="o", capsize=3, label="private estimate (95%)")  # fmt: skip
        ax.plot(x, [r["true_value"] for r in rs], "kx", label="true value (simulator)")
        ax.set_title(f"{env}: N = {rs[0]['users']}, eps 1")
        ax.set_xlabel("seed")
        ax.set_ylabel("discounted value from the start distribution")
        ax.legend(loc="best")
    save(fig, path)
