"""``qveil experiments multid``: the kernel fqi release for states with d coordinates
(issue 16), in process: CartPole-v1 (d = 4, 2 actions) and Acrobot-v1 (d = 6, 3 actions).

For each environment, number of users N and seed: collect N users with one uniformly random
episode each (qveil.trainer.collect), fit the kernel FQI + subspace KRR once
(:mod:`qveil.kfqi`, public config configs/<env>-private.toml), then score on fresh episodes

* the non-private estimator (the released mean, no noise): the ceiling;
* the private release at each epsilon (delta 1e-5): mean + additive noise g_a, one seeded
  :class:`qveil.additive.AdditiveSamplePath` per action with the accountant's sigma,
  queried lazily at the visited states (actions: argmax_a of f_a(x) + g_a(x)); averaged
  over ``draws`` independent releases (noise draws), since one draw's return varies a lot;
* the uniformly random policy: the floor.

"Fraction" = (private - random) / (ceiling - random). Part 2 re-measures the release
through the server (GetBestActions). Seeds are for experiments only.
"""

from __future__ import annotations

import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ENVS", "load_config", "run", "run_point"]

ROOT = Path(__file__).resolve().parents[1]
ENVS = {
    "CartPole-v1": ROOT / "configs" / "cartpole-private.toml",
    "Acrobot-v1": ROOT / "configs" / "acrobot-private.toml",
}
EPSILONS = (0.5, 1.0, 2.0, 4.0)
DELTA = 1e-5


def load_config(env_id: str, **changes: Any) -> dict[str, Any]:
    with ENVS[env_id].open("rb") as fh:
        cfg = tomllib.load(fh)
    cfg.update(changes)
    return cfg


def _spec(cfg: dict[str, Any]) -> Any:
    from qveil.kfqi import KernelFQISpec

    return KernelFQISpec(
        gamma=cfg["gamma"],
        iterations=cfg["iterations"],
        betas=tuple(cfg["betas"]),
        anchor_points=cfg["anchor_points"],
        bandwidth=cfg["bandwidth"],
        kernel_radius=cfg["kernel_radius"],
        inducing_points=cfg["inducing_points"],
        lam=cfg["lam"],
        neighbour=cfg["neighbour"],
        default=cfg.get("default_value"),
    )


def privacy(cfg: dict[str, Any], *, users: int, actions: int, epsilon: float) -> Any:
    """The kernel accountant's calibration for this config (public quantities only)."""
    from qveil.privacy.kfqi import KernelFQIPrivacyParams, calibrate_kernel_fqi

    p = KernelFQIPrivacyParams(
        neighbour=cfg["neighbour"],
        users=users,
        reward_range=tuple(cfg["reward_range"]),
        gamma=cfg["gamma"],
        iterations=cfg["iterations"],
        actions=actions,
        dims=len(cfg["betas"]),
        betas=tuple(cfg["betas"]),
        lam=cfg["lam"],
        anchor_points=cfg["anchor_points"],
        inducing_points=cfg["inducing_points"],
        delta=DELTA,
    )
    return calibrate_kernel_fqi(p, epsilon=epsilon)


def _episodes(env_id: str, policy: Any, *, episodes: int, seed: int) -> float:
    import gymnasium as gym

    env = gym.make(env_id)
    total = 0.0
    try:
        for e in range(episodes):
            obs, _ = env.reset(seed=seed + e)
            while True:
                obs, r, term, trunc, _ = env.step(policy(np.asarray(obs, dtype=np.float64)))
                total += float(r)
                if term or trunc:
                    break
    finally:
        env.close()
    return total / episodes


def run_point(
    env_id: str,
    users: int,
    seed: int,
    *,
    episodes: int,
    draws: int = 1,
    epsilons: tuple[float, ...] = EPSILONS,
    **changes: Any,
) -> list[dict[str, Any]]:
    """One (env, N, seed): fit once, score ceiling, each epsilon and random."""
    from qveil.additive import AdditiveSamplePath, StateBox
    from qveil.kfqi import additive_mean, kernel_fqi
    from qveil.trainer.collect import collect

    cfg = load_config(env_id, **changes)
    rr = (float(cfg["reward_range"][0]), float(cfg["reward_range"][1]))
    t0 = time.perf_counter()
    ds = collect(env_id, users, seed, reward_range=rr)
    t_collect = time.perf_counter() - t0
    box = StateBox.of(cfg["state_intervals"])
    spec = _spec(cfg)
    m = int(ds.n_actions)
    t0 = time.perf_counter()
    fit = kernel_fqi(
        ds.s,
        ds.a,
        ds.r,
        ds.s2,
        ds.terminal,
        ds.user,
        n_actions=m,
        reward_range=rr,
        box=box,
        spec=spec,
    )
    t_fit = time.perf_counter() - t0

    def mean(o: np.ndarray) -> np.ndarray:
        out: np.ndarray = additive_mean(
            box.to_unit(o[None]),
            alpha=fit.alpha,
            centre=fit.centre,
            inducing=fit.inducing,
            betas=fit.betas,
        )[0]
        return out

    eval_seed = 10_000 + 1000 * seed
    base = {
        "env": env_id,
        "users": users,
        "seed": seed,
        "samples": int(ds.n),
        "collect_s": round(t_collect, 2),
        "fit_s": round(t_fit, 2),
    }
    rows = [
        {
            **base,
            "policy": "non-private",
            "epsilon": float("inf"),
            "sigma": 0.0,
            "return": _episodes(
                env_id, lambda o: int(np.argmax(mean(o))), episodes=episodes, seed=eval_seed
            ),
        }
    ]
    rng = np.random.default_rng([seed, 7])
    rows.append(
        {
            **base,
            "policy": "random",
            "epsilon": float("nan"),
            "sigma": float("nan"),
            "return": _episodes(
                env_id, lambda o: int(rng.integers(m)), episodes=episodes, seed=eval_seed
            ),
        }
    )
    for k, eps in enumerate(epsilons):
        res = privacy(cfg, users=int(ds.users), actions=m, epsilon=eps)
        returns = []
        for draw in range(draws):  # independent releases (noise draws) at this epsilon
            paths = [
                AdditiveSamplePath(
                    betas=spec.betas, sigma=res.sigma, rng=np.random.default_rng([seed, k, draw, a])
                )
                for a in range(m)
            ]

            def noisy(o: np.ndarray, paths: list[AdditiveSamplePath] = paths) -> int:
                x = box.to_unit(o[None])
                g = np.array([p.sample(x)[0] for p in paths])
                return int(np.argmax(mean(o) + g))

            returns.append(
                _episodes(
                    env_id, noisy, episodes=max(1, episodes // draws), seed=eval_seed + 100 * draw
                )
            )
        rows.append(
            {
                **base,
                "policy": "private",
                "epsilon": eps,
                "sigma": res.sigma,
                "noise_to_value": res.noise_to_value,
                "return": float(np.mean(returns)),
                "draws": draws,
                "draw_min": float(np.min(returns)),
                "draw_max": float(np.max(returns)),
            }
        )
    return rows


def _fraction(rows: list[dict[str, Any]]) -> None:
    by = {}
    for r in rows:
        by.setdefault((r["env"], r["users"], r["seed"]), {})[r["policy"], r["epsilon"]] = r
    for r in rows:
        g = by[(r["env"], r["users"], r["seed"])]
        top = next(v["return"] for (p, _), v in g.items() if p == "non-private")
        low = next(v["return"] for (p, _), v in g.items() if p == "random")
        r["fraction"] = (r["return"] - low) / (top - low) if top != low else float("nan")


def _plot(rows: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from qveil.experiments.plotting import save

    envs = sorted({r["env"] for r in rows})
    fig, axes = plt.subplots(1, len(envs), figsize=(5.2 * len(envs), 3.8), dpi=100, squeeze=False)
    for ax, env in zip(axes[0], envs, strict=True):
        er = [r for r in rows if r["env"] == env]
        ns = sorted({r["users"] for r in er})

        def line(pred: Any, er: list[dict[str, Any]] = er, ns: list[int] = ns) -> list[float]:
            return [
                float(np.mean([r["return"] for r in er if r["users"] == n and pred(r)])) for n in ns
            ]

        ax.plot(ns, line(lambda r: r["policy"] == "non-private"), "k-", lw=2, label="non-private")
        for eps in EPSILONS:
            ax.plot(
                ns,
                line(lambda r, e=eps: r["policy"] == "private" and r["epsilon"] == e),
                marker="o",
                label=f"eps {eps:g}",
            )
        ax.plot(ns, line(lambda r: r["policy"] == "random"), "k:", label="random")
        ax.set_xscale("log")
        ax.set_xlabel("users N (one random episode each)")
        ax.set_ylabel("return")
        ax.set_title(f"{env}: kernel fqi, delta 1e-5", fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save(fig, path)


def run(
    *, out: Path, quick: bool = False, seeds: int | None = None, workers: int = 1, **_: Any
) -> dict[str, Path]:
    from qveil.experiments._util import write_csv

    out.mkdir(parents=True, exist_ok=True)
    if quick:
        plan = [("CartPole-v1", [300, 1000]), ("Acrobot-v1", [30])]
        episodes, draws, n_seeds = 3, 1, seeds or 1
    else:
        plan = [("CartPole-v1", [1000, 3000, 10_000, 30_000, 100_000]), ("Acrobot-v1", [300, 1000])]
        episodes, draws, n_seeds = 20, 5, seeds or 1
    rows: list[dict[str, Any]] = []
    for env_id, ns in plan:
        for n in ns:
            for s in range(n_seeds):
                t0 = time.perf_counter()
                got = run_point(env_id, n, s, episodes=episodes, draws=draws)
                rows += got
                summ = " ".join(
                    f"{r['policy'][:4]}{'' if r['policy'] != 'private' else r['epsilon']}="
                    f"{r['return']:.0f}"
                    for r in got
                )
                print(
                    f"multid {env_id} N={n} seed={s}: {summ} ({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
    _fraction(rows)
    csv_path = write_csv(out / "multid.csv", rows)
    png = _plot(rows, out / "multid.png")
    return {"csv": csv_path, "png": png}
