"""`qveil train --mode fqi`: a private release of fitted-Q iteration on an offline dataset.

The pipeline of the fqi mode (docs/privacy.md section 2.5):

1. averager FQI on the public grid (:mod:`qveil.fqi`; per-user averaging for the user
   relation);
2. the fixed public map L (smoother + piecewise-linear interpolation) into the RKHS of the
   noise kernel, with a certified kappa (:mod:`qveil.release_map`);
3. sigma from the fqi accountant (:mod:`qveil.privacy.fqi`) for (epsilon, delta); the noise
   itself is drawn by the server's store, from OS entropy, when states are first asked.

Every parameter comes from :class:`FQIConfig` (a TOML file) or from public quantities (the
number of users, the declared reward range, the state interval, the number of actions):
nothing is tuned on the data. The privacy plan (:func:`plan`) is computed before the data
is touched, and a release whose noise is expected to swamp the values is refused unless
forced.
"""

from __future__ import annotations

import io
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qveil.errors import FailedPrecondition, InvalidArgument
from qveil.fqi_config import REFUSE_RATIO, FQIConfig, plan, ratio_message

__all__ = ["FQIConfig", "FQIOutcome", "check_reward_relation", "plan", "summary", "train_fqi"]


@dataclass(frozen=True)
class FQIOutcome:
    path: Path
    card: dict[str, Any]
    seconds: float
    warning: str | None


def observation_bounds(env_id: str) -> tuple[np.ndarray, np.ndarray]:
    """The flattened (low, high) of an environment's Box observation space (public)."""
    import gymnasium as gym

    import qveil.trainer  # noqa: F401 - registers qveil's environments

    env = gym.make(env_id)
    try:
        lo = np.asarray(env.observation_space.low, dtype=np.float64).reshape(-1)  # type: ignore[attr-defined]
        hi = np.asarray(env.observation_space.high, dtype=np.float64).reshape(-1)  # type: ignore[attr-defined]
    finally:
        env.close()
    return lo, hi


def _state_interval(cfg: FQIConfig, env_id: str | None) -> tuple[float, float]:
    if cfg.state_interval is not None:
        return cfg.state_interval
    if env_id:
        lo, hi = observation_bounds(env_id)
        if lo.size == 1 and np.isfinite(lo[0]) and np.isfinite(hi[0]):
            return float(lo[0]), float(hi[0])
    raise InvalidArgument(
        "the fqi mode needs a bounded 1-D state interval: set state_interval = [lo, hi] in "
        "the config (the environment's observation space does not give one)"
    )


def _plot(values: np.ndarray, interval: tuple[float, float], deltas: list[float]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = np.linspace(interval[0], interval[1], values.shape[0])
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3.2), dpi=100)
    for a in range(values.shape[1]):
        a1.plot(xs, values[:, a], label=f"action {a}")
    a1.set_xlabel("state")
    a1.set_ylabel("released mean L(Q_T)")
    a1.legend(fontsize=8)
    a1.set_title("un-noised mean (admin only)", fontsize=9)
    a2.semilogy(range(1, len(deltas) + 1), np.maximum(deltas, 1e-300), marker="o")
    a2.set_xlabel("iteration t")
    a2.set_ylabel("sup |Q_t - Q_{t-1}|")
    a2.set_title("FQI convergence", fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def check_reward_relation(neighbour: str, dataset: Any) -> None:
    """Refuse (InvalidArgument) the ``reward`` neighbour relation on a dataset that does not
    declare ``rewards_are_population_averages``. The relation's bound, D_T = (hi - lo)
    (1 - gamma^T) / (N (1 - gamma)), assumes each sample's reward is already the mean of the
    N users' private reward functions, so that one user moves every reward by at most
    (hi - lo)/N; on rows that each carry one user's own reward, one user moves their rewards
    by up to hi - lo and the bound does not hold."""
    if neighbour != "reward" or getattr(dataset, "rewards_are_population_averages", False):
        return
    raise InvalidArgument(
        "the reward neighbour relation assumes each sample's reward is already the mean of "
        "the N users' private reward functions, so one user moves every reward by at most "
        "(hi - lo)/N; this dataset does not declare rewards_are_population_averages, and on "
        "rows holding one user's own reward the bound does not hold. Use --neighbour user, "
        "or declare the field (qveil dataset collect --rewards-are-population-averages, or "
        "rewards_are_population_averages in the file) when the rewards really are "
        "population averages"
    )


def train_fqi(
    cfg: Any,
    dataset: Any,
    out: str | Path,
    *,
    force: bool = False,
    engine: Any = None,
) -> FQIOutcome:
    """Fit, account and write the fqi release bundle at ``out`` (which must not exist).

    ``dataset``: a :class:`qveil.dataset.Dataset` (1-D states with an ``FQIConfig``; any d
    with a :class:`qveil.kfqi_config.KernelFQIConfig`, see :mod:`qveil.trainer.kfqi`).
    Raises FailedPrecondition when the noise-to-value ratio is above :data:`REFUSE_RATIO`
    and ``force`` is False; InvalidArgument for bad input, and for the ``reward`` relation on
    a dataset that does not declare its rewards population averages
    (:func:`check_reward_relation`). Nothing is written on any error."""
    from qveil.kfqi_config import KernelFQIConfig

    check_reward_relation(cfg.neighbour, dataset)

    if isinstance(cfg, KernelFQIConfig):  # d coordinates
        from qveil.trainer.kfqi import train_kernel_fqi

        outcome: FQIOutcome = train_kernel_fqi(cfg, dataset, out, force=force, engine=engine)
        return outcome
    if engine is not None and not engine.local:
        raise InvalidArgument(
            "the grid estimator (1-D states) fits in one process: --workers and --cluster "
            'are for estimator = "kernel"'
        )
    return _train_grid(cfg, dataset, Path(out), force=force)


def _train_grid(cfg: Any, dataset: Any, out: Path, *, force: bool) -> FQIOutcome:
    """The 1-D grid estimator: plan, fit, smooth, write and reload the bundle."""
    from qveil.bundle import load_bundle, write_grid_bundle
    from qveil.fqi import fitted_q
    from qveil.noise import StateInterval
    from qveil.release_map import smoother

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidArgument(f"output {str(out)[:80]!r} already exists and is not empty")
    s = np.asarray(dataset.s, dtype=np.float64)
    if s.ndim == 2 and s.shape[1] != 1:
        raise InvalidArgument(
            f"the 1-D fqi mode needs states with one coordinate; this dataset has "
            f'{s.shape[1]}: use a config with estimator = "kernel" '
            "(configs/cartpole-private.toml)"
        )
    env_id = cfg.env_id or getattr(dataset, "env_id", None) or ""
    rr = cfg.reward_range or tuple(dataset.reward_range)
    users = int(len(np.unique(dataset.user)))
    actions = int(dataset.n_actions)
    result = plan(cfg, users=users, actions=actions, reward_range=rr)  # before touching data
    warning = ratio_message(result)
    if result.noise_to_value > REFUSE_RATIO and not force:
        raise FailedPrecondition(f"refusing: {warning}; pass --force to release anyway")
    iv = StateInterval(*_state_interval(cfg, env_id or None))
    spec = cfg.spec()
    t0 = time.perf_counter()
    deltas: list[float] = []
    q = fitted_q(
        s.reshape(-1),
        dataset.a,
        dataset.r,
        np.asarray(dataset.s2, dtype=np.float64).reshape(-1),
        dataset.terminal,
        dataset.user,
        n_actions=actions,
        reward_range=rr,
        interval=iv,
        spec=spec,
        on_iteration=deltas.append,
    )
    values = smoother(cfg.grid_points, cfg.smoother_bandwidth) @ q
    seconds = time.perf_counter() - t0
    card = _grid_card(cfg, dataset, env_id=env_id, interval=iv, result=result, seconds=seconds)
    path = write_grid_bundle(
        out,
        card=card,
        values=values,
        config_toml=cfg.replace(beta=result.beta).to_toml(),
        training_log_rows=[{"iteration": t + 1, "sup_change": d} for t, d in enumerate(deltas)],
        learning_curve_png=_plot(values, (iv.lo, iv.hi), deltas),
    )
    written = load_bundle(path, verify=True)
    return FQIOutcome(path=path, card=written.card, seconds=seconds, warning=warning)


def _grid_card(
    cfg: Any, dataset: Any, *, env_id: str, interval: Any, result: Any, seconds: float
) -> dict[str, Any]:
    """The grid release's card: its privacy numbers copied from the accountant's ``result``."""
    from qveil.bundle import build_fqi_card
    from qveil.trainer.train import code_version

    fingerprint = dataset.fingerprint() if callable(getattr(dataset, "fingerprint", None)) else ""
    return build_fqi_card(
        env_id=env_id,
        interval=interval,
        privacy_result=result,
        dataset_fingerprint=fingerprint,
        hyperparameters={
            "gamma": cfg.gamma,
            "iterations": cfg.iterations,
            "grid_points": cfg.grid_points,
            "bandwidth": cfg.bandwidth,
            "kernel_radius": cfg.kernel_radius,
            "smoother_bandwidth": cfg.smoother_bandwidth,
            "beta": result.beta,
            "neighbour": cfg.neighbour,
        },
        seeded=False,
        code_version=code_version(),
        extra={
            "release_noise": {"sigma": result.sigma, "beta": result.beta, "source": "OS entropy"},
            "training": {"samples": int(len(dataset.a)), "seconds": round(seconds, 3)},
        },
    )


def summary(outcome: FQIOutcome) -> str:
    """A few lines for the CLI."""
    c = outcome.card
    if c.get("dims") is not None:
        return "\n".join(
            [
                f"bundle {c['bundle_id']} written to {outcome.path}",
                f"  mode=fqi estimator=kernel d={c['dims']} neighbour={c['neighbour']} "
                f"users={c['users']} gamma={c['gamma']:g} T={c['iterations']} "
                f"anchors={c['model']['anchor_points']}^{c['dims']} lam={c['model']['lam']:g}",
                f"  D_T={c['sup_sensitivity']:.4g} kappa={c['kappa']:.4g} "
                f"betas={c['betas']} Delta={c['sensitivity']:.4g} sigma={c['sigma']:.4g} "
                f"(noise/value {c['noise_to_value']:.3f}); states clipped into "
                f"{c['state_intervals']}",
                f"  epsilon={_g(c['epsilon'])} delta={c['delta_total']:.3g} holds={c['holds']}",
                f"  fitted in {outcome.seconds:.2f} s",
            ]
        )
    return "\n".join(
        [
            f"bundle {c['bundle_id']} written to {outcome.path}",
            f"  mode=fqi neighbour={c['neighbour']} users={c['users']} gamma={c['gamma']:g} "
            f"T={c['iterations']} grid={c['model']['grid_points']}",
            f"  D_T={c['sup_sensitivity']:.4g} kappa={c['kappa']:.4g} beta={c['beta']:g} "
            f"Delta={c['sensitivity']:.4g} sigma={c['sigma']:.4g} "
            f"(noise/value {c['noise_to_value']:.3f})",
            f"  epsilon={_g(c['epsilon'])} delta={c['delta_total']:.3g} holds={c['holds']}",
            f"  fitted in {outcome.seconds:.2f} s",
        ]
    )


def _g(v: float) -> str:
    """A number for people: 7.999999999999996 -> 8."""
    return f"{v:.6g}" if math.isfinite(v) else "n/a"
