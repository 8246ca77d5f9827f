"""``qveil experiments ceiling``: how strong is the kernel fqi estimator itself? A standard
non-private offline-RL learner on the same datasets (docs/results.md section 9).

For each environment, one dataset of N users with one uniformly random episode each
(:func:`qveil.trainer.collect.collect`, collection seed ``seed``, cached as npz in
``QVEIL_LEVERS_CACHE``, never in the repository), and on the **same E episode seeds** for
every policy (common random numbers):

* the random policy (the floor);
* the estimator's non-private policy: the kernel fqi fit of the public config
  ``configs/<env>-private.toml`` (:class:`qveil.experiments.multid_levers.Sweep`), greedy in
  its mean;
* the estimator's private releases at epsilon 1, delta 1e-5, user relation: sigma from the
  accountant (:func:`qveil.kfqi_config.plan_kernel`), R seeded in-process noise draws of the
  exact additive sampler, of the served noise's law (:func:`qveil.experiments.multid_levers.score`);
* **offline DQN** and **discrete CQL** (Kumar et al. 2020): a double DQN on an MLP, trained
  on the dataset only (no environment interaction), with CQL's regulariser
  alpha (logsumexp_b Q(s, b) - Q(s, a)) for CQL and alpha = 0 for DQN
  (:func:`fit_offline_q`). gamma 0.99, the standard discount of these learners, not the
  estimator's; the same rewards the estimator sees (clipped into the config's range).

The learner is hand-written in torch (the trainer extra) rather than taken from d3rlpy:
d3rlpy 2.8.1 requires ``gymnasium==1.0.0`` and the old ``gym`` package, which it imports at
import time, so installing it would downgrade the project's Gymnasium. The learner is the
textbook algorithm (the choices are in :class:`LearnerConfig`); it is a ceiling for
reading the estimator, not a tuned state of the art. Seeds are for experiments only.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from qveil.dataset import Dataset, load_npz, save_npz
from qveil.experiments._util import write_csv
from qveil.experiments.multid_levers import Sweep, score
from qveil.json_types import JSONObject
from qveil.kfqi_config import KernelFQIConfig, plan_kernel, read_fqi_toml

if TYPE_CHECKING:  # for annotations only: torch loads only for the runs that train
    from torch import nn

__all__ = [
    "COLUMNS",
    "ENVS",
    "cache_tag",
    "LearnerConfig",
    "OfflineQ",
    "dataset",
    "fit_offline_q",
    "run",
    "run_env",
]

ROOT = Path(__file__).resolve().parents[3]
DELTA = 1e-5
EPSILON = 1.0
#: env id -> the estimator's public config.
ENVS: dict[str, Path] = {
    "CartPole-v1": ROOT / "configs" / "cartpole-private.toml",
    "LunarLander-v3": ROOT / "configs" / "lunarlander-private.toml",
    "MountainCar-v0": ROOT / "configs" / "mountaincar-private.toml",
}
COLUMNS = (
    "env",
    "seed",
    "users",
    "samples",
    "policy",
    "return",
    "return_lo",
    "return_hi",
    "fraction",
    "episodes",
    "releases",
    "sigma",
    "train_s",
)


@dataclass(frozen=True)
class LearnerConfig:
    """The offline learner: a double DQN (``cql_alpha`` = 0) or discrete CQL."""

    cql_alpha: float = 1.0
    gamma: float = 0.99
    hidden: tuple[int, ...] = (256, 256)
    lr: float = 3e-4
    batch: int = 256
    steps: int = 30_000
    target_every: int = 250
    """Steps between hard copies of the online net into the target net."""
    reward_scale: float = 1.0
    """Rewards are multiplied by this (LunarLander's are up to 100: 0.1 keeps Q near 1-30)."""
    threads: int = 1


@dataclass
class OfflineQ:
    """A trained Q network with the dataset's state normalisation (non-private: a ceiling)."""

    net: nn.Sequential
    mean: np.ndarray
    std: np.ndarray
    losses: list[float] = field(default_factory=list)

    def values(self, obs: np.ndarray) -> np.ndarray:
        # torch loads only for the runs that train a network (a heavy import)
        import torch

        x = (np.asarray(obs, dtype=np.float64) - self.mean) / self.std
        with torch.no_grad():
            out: np.ndarray = self.net(torch.as_tensor(x, dtype=torch.float32)).numpy()
        return out

    def act(self, obs: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.argmax(self.values(obs), axis=1)
        return out


def _mlp(d: int, m: int, hidden: Sequence[int]) -> nn.Sequential:
    # torch loads only for the runs that train a network (a heavy import)
    from torch import nn

    layers: list[nn.Module] = []
    width = d
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, m))
    return nn.Sequential(*layers)


def fit_offline_q(
    ds: Dataset,
    cfg: LearnerConfig,
    *,
    seed: int = 0,
    progress: Callable[[str], object] | None = None,
) -> OfflineQ:
    """Train on the dataset's transitions only: minibatches drawn uniformly, the double-DQN
    target r + gamma (1 - terminal) Q_target(s', argmax_b Q(s', b)), Huber loss, plus the
    CQL term when ``cql_alpha`` > 0. A time-limit truncation is not terminal (as the
    estimator's collection records it)."""
    # torch loads only for the runs that train a network (a heavy import)
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(int(cfg.threads))
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    s = np.asarray(ds.s, dtype=np.float64)
    mean, std = s.mean(axis=0), s.std(axis=0)
    std = np.where(std > 1e-8, std, 1.0)
    ts = torch.as_tensor((s - mean) / std, dtype=torch.float32)
    ts2 = torch.as_tensor((np.asarray(ds.s2) - mean) / std, dtype=torch.float32)
    ta = torch.as_tensor(np.array(ds.a), dtype=torch.int64)
    tr = torch.as_tensor(np.array(ds.r) * cfg.reward_scale, dtype=torch.float32)
    tcont = torch.as_tensor(~np.asarray(ds.terminal, dtype=bool), dtype=torch.float32)
    m = int(ds.n_actions)
    net = _mlp(s.shape[1], m, cfg.hidden)
    target = _mlp(s.shape[1], m, cfg.hidden)
    target.load_state_dict(net.state_dict())
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    out = OfflineQ(net=net, mean=mean, std=std)
    n = len(ta)
    for step in range(int(cfg.steps)):
        idx = torch.as_tensor(rng.integers(n, size=cfg.batch))
        q = net(ts[idx])
        q_sa = q.gather(1, ta[idx, None]).squeeze(1)
        with torch.no_grad():
            nxt = ts2[idx]
            best = net(nxt).argmax(dim=1, keepdim=True)
            y = tr[idx] + cfg.gamma * tcont[idx] * target(nxt).gather(1, best).squeeze(1)
        loss = F.smooth_l1_loss(q_sa, y)
        if cfg.cql_alpha > 0:
            loss = loss + cfg.cql_alpha * (torch.logsumexp(q, dim=1) - q_sa).mean()
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        if (step + 1) % cfg.target_every == 0:
            target.load_state_dict(net.state_dict())
        if (step + 1) % 1000 == 0:
            out.losses.append(loss.item())
            if progress is not None and (step + 1) % 10_000 == 0:
                progress(f"  step {step + 1}: loss {out.losses[-1]:.4f}")
    net.eval()
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("QVEIL_LEVERS_CACHE", "/tmp/levers-data"))


def load_config(env_id: str) -> JSONObject:
    """``env_id``'s config as a dict (a relative ``anchor_file`` resolved against configs/)."""
    return read_fqi_toml(ENVS[env_id])


def cache_tag(behaviour: tuple[str, float] | None) -> str:
    """How a cached file's name says who collected it: "" for uniformly random actions,
    ``-NAME-eEPSILON`` for a public behaviour policy."""
    return "" if behaviour is None else f"-{behaviour[0]}-e{behaviour[1]:g}"


def dataset(
    env_id: str,
    users: int,
    seed: int,
    *,
    cache: Path | None = None,
    behaviour: tuple[str, float] | None = None,
) -> Dataset:
    """N users of ``env_id``, one episode each, rewards clipped into the config's public
    range, cached as npz: uniformly random actions, or ``behaviour`` = (name, epsilon), a
    public heuristic of :mod:`qveil.trainer.behaviour` mixed epsilon-greedy."""
    # the trainer's modules load gymnasium: only when this runs
    from qveil.trainer.behaviour import resolve_behaviour
    from qveil.trainer.collect import collect

    root = cache if cache is not None else cache_dir()
    path = root / f"{env_id}-{users}-s{seed}{cache_tag(behaviour)}.npz"
    if path.exists():
        return load_npz(path)
    lo, hi = load_config(env_id)["reward_range"]
    ds = collect(
        env_id,
        users,
        seed,
        reward_range=(float(lo), float(hi)),
        clip_rewards=True,
        behaviour=None if behaviour is None else resolve_behaviour(*behaviour),
    )
    root.mkdir(parents=True, exist_ok=True)
    save_npz(ds, path)
    return ds


def _mean_ci(x: np.ndarray, *, draws: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """The mean of (R, E) or (E,) returns and a 95% bootstrap interval over its axes."""
    rng = np.random.default_rng(seed)
    x2 = np.atleast_2d(x)
    r, e = x2.shape
    ri, ei = rng.integers(r, size=(draws, r)), rng.integers(e, size=(draws, e))
    means = np.array([x2[ri[b]][:, ei[b]].mean() for b in range(draws)])
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(x2.mean()), float(lo), float(hi)


def run_env(
    env_id: str,
    *,
    users: int,
    seed: int,
    episodes: int,
    releases: int,
    learners: dict[str, LearnerConfig],
    config: JSONObject | None = None,
    cache: Path | None = None,
    say: Callable[[str], object] = print,
) -> list[JSONObject]:
    """The rows of one (env, N, seed): random, the estimator non-private and private at
    epsilon 1, and each offline learner, on the same ``episodes`` episode seeds."""

    cfg = config if config is not None else load_config(env_id)
    ds = dataset(env_id, users, seed, cache=cache)
    say(f"{env_id}: {ds.users} users, {ds.n} samples (seed {seed})")
    kcfg = KernelFQIConfig.from_dict({**cfg, "epsilon": EPSILON, "delta": DELTA})
    plan = plan_kernel(
        kcfg,
        users=int(ds.users),
        actions=int(ds.n_actions),
        dims=int(ds.d),
        reward_range=(float(cfg["reward_range"][0]), float(cfg["reward_range"][1])),
    )
    t0 = time.perf_counter()
    fit = Sweep(ds, progress=say).fit(cfg)
    fit_s = time.perf_counter() - t0
    eval_seed = 10_000 + 1000 * seed
    sc = score(
        fit,
        sigma=float(plan.sigma),
        releases=releases,
        episodes=episodes,
        eval_seed=eval_seed,
        env_id=env_id,
    )
    base = {"env": env_id, "seed": seed, "users": int(ds.users), "samples": int(ds.n)}
    low = float(sc.floor.mean())
    rows: list[JSONObject] = []

    def add(policy: str, ret: np.ndarray, *, n_rel: int = 1, sigma: float = math.nan,
            train_s: float = math.nan) -> None:  # fmt: skip
        mean, lo, hi = _mean_ci(ret)
        top = float(sc.ceiling.mean())
        frac = (mean - low) / (top - low) if top != low else math.nan
        rows.append(
            {**base, "policy": policy, "return": mean, "return_lo": lo, "return_hi": hi,
             "fraction": frac, "episodes": episodes, "releases": n_rel, "sigma": sigma,
             "train_s": train_s}
        )  # fmt: skip
        say(f"  {policy:<28} {mean:8.1f} [{lo:.1f}, {hi:.1f}]")

    add("random", sc.floor)
    add("kernel fqi, non-private", sc.ceiling, train_s=fit_s)
    add(f"kernel fqi, eps {EPSILON:g}", sc.private, n_rel=releases, sigma=float(plan.sigma))
    # the trainer's modules load gymnasium: only when this runs
    from qveil.trainer.forecast import lockstep

    seeds = [eval_seed + e for e in range(episodes)]
    for name, lc in learners.items():
        t0 = time.perf_counter()
        model = fit_offline_q(ds, lc, seed=seed, progress=say)
        train_s = time.perf_counter() - t0
        add(name, lockstep(env_id, model.act, seeds), train_s=train_s)
    return rows


#: The full run: (env, users, learners' reward scale, episodes, releases). LunarLander's
#: episodes last up to 1000 steps: fewer of them.
FULL: tuple[tuple[str, int, float, int, int], ...] = (
    ("CartPole-v1", 10_000, 1.0, 30, 10),
    ("LunarLander-v3", 10_000, 0.1, 20, 5),
)


def run(
    *,
    out: Path,
    quick: bool = False,
    seeds: int | None = None,
    **_: object,
) -> dict[str, Path]:
    """Every environment of ``FULL`` on report seed 0 (``--seeds 2``: also seed 2), DQN and
    CQL 20000 steps each. ``--quick``: CartPole with 200 users, 2 releases x 3 episodes, 300
    learner steps (seconds)."""

    out.mkdir(parents=True, exist_ok=True)
    rows: list[JSONObject] = []
    t0 = time.perf_counter()

    def say(text: str) -> None:
        print(f"ceiling [{time.perf_counter() - t0:.0f} s] {text}", flush=True)

    plan: Sequence[tuple[str, int, float, int, int]] = (
        (("CartPole-v1", 200, 1.0, 3, 2),) if quick else FULL
    )
    steps = 300 if quick else 20_000
    for env_id, users, scale, episodes, releases in plan:
        learners = {
            "offline DQN": LearnerConfig(cql_alpha=0.0, steps=steps, reward_scale=scale),
            "discrete CQL": LearnerConfig(cql_alpha=1.0, steps=steps, reward_scale=scale),
        }
        for seed in (0,) if quick else (0, 2)[: seeds or 1]:
            rows += run_env(
                env_id,
                users=users,
                seed=seed,
                episodes=episodes,
                releases=releases,
                learners=learners,
                say=say,
            )
    return {"csv": write_csv(out / "ceiling.csv", rows, COLUMNS)}
