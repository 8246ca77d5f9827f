"""`qveil train --mode fqi` for datasets with d coordinates: the kernel estimator (issue 16).

1. kernel FQI with per-user averaging on the public anchor grid, then the public subspace
   KRR onto the additive RKHS of the noise (:mod:`qveil.kfqi`);
2. sigma from the kernel accountant (:mod:`qveil.privacy.kfqi`), computed BEFORE the data
   is touched; a release whose noise would swamp the values is refused unless forced;
3. an ``additive`` bundle (:func:`qveil.bundle.write_kernel_bundle`) whose card lists the
   public per-coordinate intervals (states outside are clipped) and betas.

The release noise is drawn by the server's store from OS entropy; serving d > 1 through the
server is part 2 of issue 16 (the store keys (release, action, coordinate, x_j)).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from qveil.errors import FailedPrecondition, InvalidArgument
from qveil.fqi_config import REFUSE_RATIO, ratio_message
from qveil.kfqi_config import KernelFQIConfig, plan_kernel

__all__ = ["state_intervals", "train_kernel_fqi"]


def state_intervals(cfg: KernelFQIConfig, env_id: str | None, dims: int) -> list[list[float]]:
    """The public per-coordinate intervals: the config's, else the env's finite bounds."""
    if cfg.state_intervals is not None:
        if len(cfg.state_intervals) != dims:
            raise InvalidArgument(
                f"the config gives {len(cfg.state_intervals)} state intervals; the dataset "
                f"has {dims} coordinates"
            )
        return [list(p) for p in cfg.state_intervals]
    if env_id:
        from qveil.trainer.fqi import observation_bounds

        lo, hi = observation_bounds(env_id)
        if lo.size == dims and np.isfinite(lo).all() and np.isfinite(hi).all():
            return [[float(a), float(b)] for a, b in zip(lo, hi, strict=True)]
    raise InvalidArgument(
        "the kernel fqi mode needs a bounded interval per coordinate: set state_intervals = "
        "[[lo, hi], ...] in the config (unbounded coordinates, e.g. CartPole's velocities, "
        "are clipped into them)"
    )


def train_kernel_fqi(
    cfg: KernelFQIConfig, dataset: Any, out: str | Path, *, force: bool = False
) -> Any:
    """Fit, account and write a d-coordinate fqi bundle at ``out`` (must not exist).
    Returns a :class:`qveil.trainer.fqi.FQIOutcome`. Nothing is written on any error."""
    from qveil.additive import StateBox
    from qveil.bundle import build_kernel_fqi_card, load_bundle, write_kernel_bundle
    from qveil.kfqi import kernel_fqi
    from qveil.trainer.fqi import FQIOutcome
    from qveil.trainer.train import code_version

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidArgument(f"output {str(out)[:80]!r} already exists and is not empty")
    s = np.asarray(dataset.s, dtype=np.float64)
    dims = 1 if s.ndim == 1 else int(s.shape[1])
    env_id = cfg.env_id or getattr(dataset, "env_id", None) or ""
    rr = cfg.reward_range or tuple(dataset.reward_range)
    users = int(len(np.unique(dataset.user)))
    actions = int(dataset.n_actions)
    result = plan_kernel(cfg, users=users, actions=actions, dims=dims, reward_range=rr)
    warning = ratio_message(result)
    if result.noise_to_value > REFUSE_RATIO and not force:
        raise FailedPrecondition(f"refusing: {warning}; pass --force to release anyway")
    intervals = state_intervals(cfg, env_id or None, dims)
    box = StateBox.of(intervals)
    spec = cfg.spec(dims)
    t0 = time.perf_counter()
    deltas: list[float] = []
    fit = kernel_fqi(
        s.reshape(len(s), dims),
        dataset.a,
        dataset.r,
        np.asarray(dataset.s2, dtype=np.float64).reshape(len(s), dims),
        dataset.terminal,
        dataset.user,
        n_actions=actions,
        reward_range=rr,
        box=box,
        spec=spec,
        on_iteration=deltas.append,
    )
    seconds = time.perf_counter() - t0
    unit = box.to_unit(s)
    clipped = int((np.clip(s, box.lo, box.hi) != s).any(axis=1).sum())
    del unit
    fingerprint = dataset.fingerprint() if callable(getattr(dataset, "fingerprint", None)) else ""
    card = build_kernel_fqi_card(
        env_id=env_id,
        state_intervals=intervals,
        privacy_result=result,
        dataset_fingerprint=fingerprint,
        hyperparameters={
            "gamma": cfg.gamma,
            "iterations": cfg.iterations,
            "anchor_points": cfg.anchor_points,
            "bandwidth": cfg.bandwidth,
            "kernel_radius": cfg.kernel_radius,
            "inducing_points": cfg.inducing_points,
            "lam": cfg.lam,
            "betas": list(spec.betas),
            "neighbour": cfg.neighbour,
            "default_value": spec.default_value(rr),
        },
        seeded=False,
        code_version=code_version(),
        extra={
            "release_noise": {
                "sigma": result.sigma,
                "betas": list(spec.betas),
                "kernel": "sigma^2 sum_j exp(-beta_j |x_j - y_j|) (each g_j has the full sigma)",
                "source": "OS entropy",
            },
            # admin view only (not in PUBLIC_CARD_KEYS): counts computed from the data
            "training": {
                "samples": int(len(s)),
                "seconds": round(seconds, 3),
                "states_clipped": clipped,
            },
        },
    )
    path = write_kernel_bundle(
        out,
        card=card,
        alpha=fit.alpha,
        centre=fit.centre,
        inducing=fit.inducing,
        config_toml=cfg.replace(betas=spec.betas).to_toml(),
        training_log_rows=[{"iteration": t + 1, "sup_change": d} for t, d in enumerate(deltas)],
    )
    written = load_bundle(path, verify=True)
    return FQIOutcome(path=path, card=written.card, seconds=seconds, warning=warning)
