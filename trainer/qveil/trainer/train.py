"""Orchestration of one training run: config -> env -> privacy -> Algorithm 1 -> bundle.

Everything that can be refused is checked before training starts and before anything is
written (config, environment spaces, privacy parameters, output path); the bundle is then
written atomically by :func:`qveil.bundle.write_bundle`.

Noise levels: in ``paper`` and ``gdp`` modes training uses the accountant's (sigma, beta)
and the server releases with the same. In ``output`` mode the guarantee comes from one GP
mechanism applied at release to the clamped, L-Lipschitz network, whatever the training did,
so training runs with sigma = 0 (the non-private DQN) and the release uses output mode's
sigma and beta.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np

from qveil.bundle import build_card, load_bundle, nonprivate_privacy, write_bundle
from qveil.errors import InvalidArgument
from qveil.json_types import JSONObject
from qveil.keyed import seeded_key
from qveil.noise import StateInterval
from qveil.privacy import PrivacyParams, PrivacyResult, account, calibrate
from qveil.trainer import register_envs
from qveil.trainer.config import TrainConfig, to_toml
from qveil.trainer.env import GymEnv
from qveil.version import __version__

if TYPE_CHECKING:  # the module itself loads torch: imported where training runs
    from qveil.trainer.algorithm import TrainResult

__all__ = [
    "EnvInfo",
    "TrainOutcome",
    "code_version",
    "env_fingerprint",
    "make_env",
    "privacy_for",
    "run_training",
]


@dataclass(frozen=True)
class EnvInfo:
    """The facts about an environment that the trainer and the card need."""

    env: GymEnv
    interval: StateInterval
    n_actions: int
    fingerprint: str


def make_env(cfg: TrainConfig) -> EnvInfo:
    """Build the config's env and check it has a bounded 1-D Box state and Discrete actions."""
    register_envs()
    try:
        env = gym.make(cfg.env_id, **cfg.env_kwargs)
    except gym.error.Error as exc:
        raise InvalidArgument(f"unknown environment {cfg.env_id!r}: {exc}") from None
    except TypeError as exc:
        raise InvalidArgument(
            f"environment {cfg.env_id!r} rejects env_kwargs {cfg.env_kwargs!r}: {exc}"
        ) from None
    obs, act = env.observation_space, env.action_space
    if not isinstance(obs, gym.spaces.Box) or int(np.prod(obs.shape)) != 1:
        env.close()
        raise InvalidArgument(
            f"environment {cfg.env_id!r} has observation space {obs}; qveil needs a 1-D Box "
            "(one real state variable): the noise is a GP on a bounded interval"
        )
    lo, hi = float(np.asarray(obs.low).reshape(-1)[0]), float(np.asarray(obs.high).reshape(-1)[0])
    if not (np.isfinite(lo) and np.isfinite(hi)) or not lo < hi:
        env.close()
        raise InvalidArgument(
            f"environment {cfg.env_id!r} has an unbounded state [{lo}, {hi}]; qveil needs "
            "finite bounds (the state interval is mapped onto [0, 1], where beta is defined)"
        )
    if not isinstance(act, gym.spaces.Discrete) or int(act.n) < 1:
        env.close()
        raise InvalidArgument(
            f"environment {cfg.env_id!r} has action space {act}; qveil "
            "needs Discrete actions (one Q-function and noise path per action)"
        )
    interval = StateInterval(lo, hi)
    return EnvInfo(
        env=env,
        interval=interval,
        n_actions=int(act.n),
        fingerprint=env_fingerprint(cfg, env, interval),
    )


def env_fingerprint(cfg: TrainConfig, env: GymEnv, interval: StateInterval) -> str:
    """sha256 over the env id, kwargs, entry point, spaces and the env class's source file."""
    spec = env.spec
    src_sha = ""
    try:
        src = inspect.getsourcefile(type(env.unwrapped))
        if src:
            src_sha = hashlib.sha256(Path(src).read_bytes()).hexdigest()
    except (TypeError, OSError):
        pass
    payload = {
        "env_id": cfg.env_id,
        "env_kwargs": cfg.env_kwargs,
        "entry_point": str(spec.entry_point) if spec else "",
        "interval": [interval.lo, interval.hi],
        "actions": int(env.action_space.n),  # type: ignore[attr-defined]
        "source_sha256": src_sha,
    }
    return (
        "sha256:"
        + hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()
    )


def code_version() -> str:
    """qveil's version plus the git commit of the source tree (``+dirty`` if modified)."""
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            cwd=here,
            timeout=5,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return f"{__version__}+g{rev}" if rev else __version__


def _notes(cfg: TrainConfig) -> list[str]:
    how = "from a replay memory" if cfg.replay else "one per batch of B fresh samples"
    notes = [f"updates actually taken: {cfg.planned_updates} ({how})"]
    if cfg.replay:
        notes.append(
            f"replay memory of {cfg.replay_capacity}: samples are reused across "
            f"updates ({cfg.updates_per_step} update(s) per environment step)"
        )
    if cfg.target_update_episodes:
        notes.append(
            f"targets from a target network refreshed every {cfg.target_update_episodes} episodes"
        )
    if cfg.eps_start > 0:
        notes.append("epsilon-greedy exploration (reward-independent: post-processing)")
    notes += cfg.sgd_deviations()
    if cfg.mode == "output":
        notes.append(
            "training ran with sigma = 0; the release adds output mode's GP noise "
            "to the clamped network"
        )
    return notes


def privacy_for(
    cfg: TrainConfig, *, n_actions: int
) -> tuple[PrivacyResult | JSONObject, TrainConfig]:
    """The accountant's result for this run and the effective config.

    With a given sigma: ``account``. With a target epsilon: ``calibrate`` (which, when
    ``calibrate_k``, also picks the smallest k whose Lemma 8 term fits in delta, as Appendix
    E.3 does; the effective config then carries that k), then ``account`` again at the
    calibrated parameters, so the card's numbers are exactly what ``account`` gives for the
    card's own ``privacy_params`` (what :func:`qveil.bundle.load_bundle` recomputes).
    """
    if cfg.sigma is None and cfg.epsilon is None:
        raise InvalidArgument(
            "give either a noise scale (--sigma S) or a target (--epsilon E --delta D [--mode M])"
        )
    # every PrivacyParams field but beta (the accountant's) is the config's of the same name,
    # except these three; in PrivacyParams' order, which the card keeps
    derived = {"actions": n_actions, "steps": cfg.planned_updates, "notes": tuple(_notes(cfg))}
    fields: JSONObject = {  # PrivacyParams' fields: the card's privacy params
        f.name: derived[f.name] if f.name in derived else getattr(cfg, f.name)
        for f in dataclasses.fields(PrivacyParams)
        if f.name != "beta"
    }
    if cfg.sigma == 0:  # the non-private baseline: PrivacyParams refuses sigma = 0
        return nonprivate_privacy({**fields, "beta": None, "notes": list(fields["notes"])}), cfg
    params = PrivacyParams(**fields)
    if cfg.epsilon is not None:
        calibrated = calibrate(params, target_epsilon=cfg.epsilon, tune=cfg.calibrate_k)
        params = PrivacyParams.from_dict(calibrated.to_dict()["params"])
        if params.k != cfg.k:
            cfg = dataclasses.replace(cfg, k=float(params.k))
            cfg.validate()
    return account(params), cfg


def assumptions_for(
    cfg: TrainConfig, *, interval: StateInterval, noise: JSONObject, measured_note: str = ""
) -> dict[str, list[str]]:
    """Which assumptions of the guarantee the code enforces and which it only assumes."""
    enforced = [
        f"rewards clipped to the declared range [{cfg.reward_range[0]:g}, "
        f"{cfg.reward_range[1]:g}] (r0 = {cfg.reward_bound:g})",
        f"each Q(., a) is {cfg.lipschitz:g}-Lipschitz in the unit state x by construction "
        "(norm-bounded layers, ReLU) and checked numerically when the bundle was written "
        "(lipschitz.measured)" + measured_note,
        f"states outside [{interval.lo:g}, {interval.hi:g}] are refused; states are mapped "
        "onto [0, 1] where beta is defined",
        f"the accountant counts the {cfg.planned_updates} updates actually taken "
        f"(step size {cfg.lr:g})",
        f"J = {cfg.resets} sample paths per action, reset every {cfg.reset_period} "
        "iteration(s), counted",
        "release noise from OS entropy unless the card says seeded: true",
    ]
    assumed = [
        f"neighbouring reward functions differ by at most {cfg.reward_sensitivity:g} in sup norm",
        "the environment's dynamics do not depend on the private rewards",
    ]
    if cfg.mode == "output":
        enforced.append(
            f"served Q clamped to |Q| <= r0/(1-gamma) = {cfg.reward_bound / (1 - cfg.gamma):g}"
        )
        assumed.append(
            "the RKHS norm bound of Lemma 6 for clamped, L-Lipschitz functions "
            "(docs/privacy.md section 2.3)"
        )
    else:
        assumed.append(
            f"|g| <= k = {cfg.k:g} on every training path (Lemma 8); how many values "
            "exceeded k is measured in the admin card (training_noise.exceed_k: it depends "
            "on the noise and the states visited, so it is not public)"
        )
        assumed.append(
            "Theorem 5's per-step sensitivity (open concerns: a batch of B "
            "differing rewards, Q0 treated as fixed, m actions released jointly; "
            "docs/privacy.md section 5)"
        )
        for d in cfg.sgd_deviations():
            assumed.append(f"VIOLATED: plain SGD with step alpha ({d})")
    return {"enforced": enforced, "assumed": assumed}


@dataclass(frozen=True)
class TrainOutcome:
    """What ``run_training`` produced."""

    path: Path
    card: JSONObject
    log_rows: list[JSONObject]
    seconds: float
    noise_seconds: float


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidArgument(
            f"output {str(out)!r} already exists and is not empty; bundles are written once"
        )


def run_training(
    cfg: TrainConfig, out: str | Path, *, seed: int | None = None, progress: bool = False
) -> TrainOutcome:
    """Train per ``cfg`` and write the release bundle at ``out`` (must not exist yet)."""
    # here, not at the top: loads torch only when this runs
    from qveil.trainer.algorithm import train_q

    out = Path(out)
    cfg.validate()
    _check_out(out)
    info = make_env(cfg)
    try:
        result, cfg = privacy_for(cfg, n_actions=info.n_actions)
        pr = result if isinstance(result, dict) else result.to_dict()
        if cfg.mode == "output":
            train_sigma, train_beta = 0.0, float(pr["beta"])
        else:
            train_sigma, train_beta = float(pr["sigma"]), float(pr["beta"])
        if not np.isfinite(train_sigma) or train_sigma < 0:
            raise InvalidArgument(f"the accountant returned sigma={train_sigma!r}")
        tr = train_q(
            cfg,
            info.env,
            interval=info.interval,
            sigma=train_sigma,
            beta=train_beta,
            seed=seed,
            progress=progress,
        )
    finally:
        info.env.close()
    weights = tr.network.export()
    card = _algorithm1_card(cfg, info, tr, result, pr, seed=seed)
    title = f"{cfg.env_id}  mode={cfg.mode}  sigma={pr['sigma']:.4g}"
    path = write_bundle(
        out,
        card=card,
        weights=weights,
        config_toml=to_toml(cfg),
        training_log_rows=tr.log_rows,
        curve_title=title,
        # the release's one key: OS entropy; a seeded run (tests, experiments; the card says
        # seeded) derives it from its seed
        noise_key=None if seed is None else seeded_key(seed),
    )
    written = load_bundle(path, verify=True)  # what the server will check, checked now
    return TrainOutcome(
        path=path,
        card=written.card,
        log_rows=tr.log_rows,
        seconds=tr.seconds,
        noise_seconds=float(tr.noise["seconds"]),
    )


def _algorithm1_card(
    cfg: TrainConfig,
    info: EnvInfo,
    tr: TrainResult,
    result: PrivacyResult | JSONObject,
    pr: JSONObject,
    *,
    seed: int | None,
) -> JSONObject:
    """The card of an Algorithm 1 release: its privacy numbers copied from the accountant's
    ``result``, the training noise and record from the training result ``tr``."""
    noise = {k: v for k, v in tr.noise.items() if k not in ("seconds", "reset_iterations")}
    noise["reset_iterations"] = tr.noise["reset_iterations"]
    return build_card(
        env_id=cfg.env_id,
        interval=info.interval,
        actions=info.n_actions,
        hyperparameters=cfg.to_dict(),
        privacy_result=result,
        lipschitz=cfg.lipschitz,
        seeded=seed is not None,
        env_fingerprint=info.fingerprint,
        code_version=code_version(),
        network={
            "activation": "relu",
            "input": "unit state x in [0, 1]",
            "hidden": list(cfg.hidden),
            "construction": "hidden layers scaled to spectral norm <= L^(1/n), output "
            "rows to norm <= L^(1/n)",
        },
        assumptions=assumptions_for(cfg, interval=info.interval, noise=noise),
        extra={
            "training_noise": noise,
            "training": {
                "updates": tr.updates,
                "samples_used": tr.samples_used,
                "episodes": len(tr.log_rows),
                "rewards_clipped": tr.reward_clipped,
                "recipe": "replay" if cfg.replay else "literal Algorithm 1",
                "seconds": round(tr.seconds, 3),
            },
            "release_noise": {
                "sigma": pr["sigma"],
                "beta": pr["beta"],
                "source": "seeded PRNG (experiments only)" if seed is not None else "OS entropy",
            },
        },
    )


def main_summary(outcome: TrainOutcome) -> str:
    """A few lines for the CLI."""
    c = outcome.card
    rets = [r["return"] for r in outcome.log_rows[-10:]]
    lines = [
        f"bundle {c['bundle_id']} written to {outcome.path}",
        f"  mode={c['mode']} release sigma={c['sigma']:.6g} beta={c['beta']:.6g} "
        f"k={c['k']} J={c['J']} seeded={c['seeded']}",
        (
            f"  epsilon={c['epsilon']:.6g} delta={c['delta']:.3g} "
            f"delta_total={c['delta_total']:.3g} holds=True"
            if c["holds"]
            else f"  holds=False: no guarantee (reason: {c['reason']})"
            + (
                f"; the formula alone would give epsilon="
                f"{c['privacy']['epsilon_if_conditions_held']:.6g}"
                if c["privacy"].get("epsilon_if_conditions_held") is not None
                else ""
            )
        ),
        f"  {c['training']['updates']} updates on {c['training']['samples_used']} samples in "
        f"{outcome.seconds:.2f} s; mean return of the last {len(rets)} episodes "
        f"{np.mean(rets) if rets else float('nan'):.3f}",
        f"  Lipschitz in x: bound {c['lipschitz']['bound']:g}, from weights "
        f"{c['lipschitz']['bound_from_weights']:.4g}, measured {c['lipschitz']['measured']:.4g}; "
        f"|g| > k: {c['training_noise']['exceed_k']} of {c['training_noise']['points']}",
    ]
    if c.get("q_bound") is not None:
        lines.append(f"  served Q clamped to |Q| <= {c['q_bound']:g}")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use `qveil train`")
