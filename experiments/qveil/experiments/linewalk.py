"""One LineWalk run of any method, trained with qveil.trainer and scored as released.

A *spec* (a plain dict, so it can cross process boundaries) names the method and its noise;
:func:`run_spec` trains, then evaluates the RELEASED function on fresh episodes:

* Algorithm 1 (``alg1``, any sigma including 0 = the non-private DQN): ``train_q`` with the
  training noise (sigma, beta); the release is Q + g with a fresh path per action at the
  release (sigma, beta) and, in output mode, Q clamped to |Q| <= r0 / (1 - gamma).
* ``dpsgd`` and ``input``: :mod:`qveil.experiments.baselines`; the release is Q itself.

Learning curves are the returns of the training episodes (what the agent collected while
learning, with its noisy greedy actions), as in the paper's figures; the headline number is
the mean return of the released function over ``eval_episodes`` fresh episodes.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from qveil.errors import InvalidArgument, echo
from qveil.json_types import JSONObject
from qveil.noise import OUSamplePath
from qveil.trainer.config import TrainConfig

__all__ = ["load_cfg", "privacy_row", "reference_returns", "run_spec"]

DEFAULT_CONFIG = Path(__file__).resolve().parents[3] / "configs" / "linewalk.toml"


def load_cfg(path: str | Path | None = None, **changes: object) -> TrainConfig:
    """The training config (default: configs/linewalk.toml, the paper's settings);
    ``changes``: any of its fields' values."""
    cfg = TrainConfig.from_toml(path or DEFAULT_CONFIG)
    return cfg.replace(**changes) if changes else cfg


def privacy_row(cfg: TrainConfig, *, n_actions: int = 2) -> tuple[JSONObject, TrainConfig]:
    """qveil.privacy's result for cfg (its sigma or its target epsilon) as a dict, and the
    effective config (calibration may choose k)."""
    # here, not at the top: loads gymnasium only when this runs
    from qveil.trainer.train import privacy_for

    res, eff = privacy_for(cfg, n_actions=n_actions)
    return (res if isinstance(res, dict) else res.to_dict()), eff


def _forward(weights: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    n = len([k for k in weights if k.startswith("W")])
    h = np.asarray(x, dtype=np.float64).reshape(-1, 1)
    for i in range(n):
        h = h @ weights[f"W{i}"].T + weights[f"b{i}"]
        if i < n - 1:
            h = np.maximum(h, 0.0)
    return h


def evaluate_release(
    cfg: TrainConfig,
    weights: dict[str, np.ndarray],
    *,
    sigma: float,
    beta: float,
    q_bound: float | None,
    episodes: int,
    seed: int,
) -> list[float]:
    """Returns of argmax_a [clamp(Q)(x, a) + g_a(x)] over fresh episodes (one fresh path per
    action for the whole evaluation: one release is one function)."""
    # here, not at the top: loads gymnasium only when this runs
    from qveil.trainer.evaluate import run_policy

    # here, not at the top: loads gymnasium only when this runs
    from qveil.trainer.train import make_env

    info = make_env(cfg)
    m = info.n_actions
    paths = None
    if sigma > 0:
        paths = [
            OUSamplePath(beta=beta, sigma=sigma, rng=np.random.default_rng([7, seed, a]))
            for a in range(m)
        ]

    def policy(s: float) -> int:
        x = info.interval.to_unit([s])
        q = _forward(weights, x)[0]
        if q_bound is not None:
            q = np.clip(q, -q_bound, q_bound)
        if paths is not None:
            q = q + np.array([p.sample(x)[0] for p in paths])
        return int(np.argmax(q))

    try:
        return run_policy(info.env, policy, episodes=episodes, seed=10_000 + seed)
    finally:
        info.env.close()


def reference_returns(cfg: TrainConfig, *, episodes: int = 200, seed: int = 0) -> dict[str, float]:
    """Mean returns of the random policy and the hand-written 'towards 0.5' policy."""
    # here, not at the top: loads gymnasium only when this runs
    from qveil.trainer.env import towards_middle_policy

    # here, not at the top: loads gymnasium only when this runs
    from qveil.trainer.evaluate import run_policy

    # here, not at the top: loads gymnasium only when this runs
    from qveil.trainer.train import make_env

    info = make_env(cfg)
    rng = np.random.default_rng(seed)
    try:
        rnd = run_policy(
            info.env, lambda _s: int(rng.integers(info.n_actions)), episodes=episodes, seed=seed
        )
        mid = run_policy(info.env, towards_middle_policy, episodes=episodes, seed=seed)
    finally:
        info.env.close()
    return {"random": float(np.mean(rnd)), "towards 0.5": float(np.mean(mid))}


#: the learners a spec may name: Algorithm 1, DP-SGD, input perturbation
METHODS = ("alg1", "dpsgd", "input")


def run_spec(spec: JSONObject) -> JSONObject:
    """Train and evaluate one spec. Keys: method (alg1|dpsgd|input), config (path),
    config_changes (dict), seed, eval_episodes; alg1: train_sigma, train_beta, release_sigma,
    release_beta, q_bound; dpsgd: clip, noise_std; input: noise_std. Returns the spec plus
    ``curve`` (training-episode returns), ``release_return`` (mean), ``seconds``. An unknown
    method is refused (InvalidArgument) before anything is loaded."""
    method = spec.get("method")
    if method not in METHODS:
        raise InvalidArgument(f"method must be one of {', '.join(METHODS)}, got {echo(method)}")
    # torch loads only for the runs that train a network (a heavy import)
    import torch

    torch.set_num_threads(1)
    # here, not at the top: loads gymnasium only when this runs
    from qveil.experiments.baselines import train_dpsgd, train_input_perturbation

    # here, not at the top: loads gymnasium, torch only when this runs
    from qveil.trainer.algorithm import train_q

    # here, not at the top: loads gymnasium only when this runs
    from qveil.trainer.train import make_env

    cfg = load_cfg(spec.get("config"), **spec.get("config_changes", {}))
    seed = int(spec["seed"])
    t0 = time.perf_counter()
    release_sigma, release_beta, q_bound = 0.0, 1.0, None
    if method == "alg1":
        info = make_env(cfg)
        try:
            res = train_q(
                cfg,
                info.env,
                interval=info.interval,
                sigma=float(spec["train_sigma"]),
                beta=float(spec["train_beta"]),
                seed=seed,
            )
        finally:
            info.env.close()
        net, rows = res.network, res.log_rows
        release_sigma = float(spec["release_sigma" if "release_sigma" in spec else "train_sigma"])
        release_beta = float(spec["release_beta" if "release_beta" in spec else "train_beta"])
        q_bound = spec.get("q_bound")
    elif method == "dpsgd":
        baseline = train_dpsgd(
            cfg, clip=float(spec["clip"]), noise_std=float(spec["noise_std"]), seed=seed
        )
        net, rows = baseline.network, baseline.log_rows
    else:  # "input"
        perturbed = train_input_perturbation(cfg, noise_std=float(spec["noise_std"]), seed=seed)
        net, rows = perturbed.network, perturbed.log_rows
    weights = net.export()
    rets = evaluate_release(
        cfg,
        weights,
        sigma=release_sigma,
        beta=release_beta,
        q_bound=q_bound,
        episodes=int(spec.get("eval_episodes", 20)),
        seed=seed,
    )
    curve = [(int(r["steps"]), float(r["return"])) for r in rows]
    out = dict(spec)
    out.update(
        curve=curve,
        release_return=float(np.mean(rets)),
        release_return_sd=float(np.std(rets)),
        seconds=time.perf_counter() - t0,
        final_train_return=float(np.mean([c[1] for c in curve[-10:]])) if curve else math.nan,
    )
    return out
