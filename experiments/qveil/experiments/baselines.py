"""The baselines of Wang & Hegde (2019) Section 4 / Appendix E.2, each with its own accountant.

Neighbouring inputs are reward functions with ||r - r'||_inf <= Delta_r (the reward
sensitivity, paper: 1). Under that relation *every* reward of a run may differ, so neither
baseline gets privacy amplification by subsampling, and both compose exactly in Gaussian DP
(Dong, Roth & Su 2019: n adaptive mu_i-GDP mechanisms are sqrt(sum mu_i^2)-GDP; mu-GDP gives
delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)), using qveil.privacy's
``gdp_mu`` / ``gdp_epsilon``:

* **DP-SGD** (Abadi et al. 2016) on the Q-learning loss: every update clips each per-sample
  gradient of 1/2 (Q(x_i, a_i) - y_i)^2 to L2 norm C, sums them, adds N(0, s^2 I) and steps
  theta <- theta - alpha (sum + noise) / B. Changing the rewards changes each of the B clipped
  per-sample gradients by at most 2C (both lie in the C-ball), so the summed gradient has
  L2 sensitivity 2 B C whatever the rewards (the target y_i is recomputed from the network, a
  post-processing of earlier private outputs). ``steps`` updates are
  mu = sqrt(steps) * 2 B C / s -GDP. The noise multiplier is z = s / (2 B C).
* **Input perturbation** (Venkitasubramaniam 2013, as the paper uses it): every reward the
  agent observes is replaced by r_t + N(0, s_r^2) once, when it is collected; everything after
  is post-processing. T noisy rewards of sensitivity Delta_r are
  mu = sqrt(T) * Delta_r / s_r -GDP.
* **Non-private DQN**: ``qveil.trainer.algorithm.train_q`` with sigma = 0 (the same code path
  as Algorithm 1).

Training reuses qveil.trainer's environment, network (``LipschitzMLP``) and loop
(``train_q``). ``train_q`` has no per-sample-gradient hook, so DP-SGD has its own thin loop
(:func:`train_dpsgd`) that mirrors it (literal Algorithm 1 batches or the replay recipe, plain
SGD at rate alpha, squared TD loss, the same target rule); input perturbation wraps the
environment (:class:`NoisyRewards`) and calls ``train_q`` unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np

from qveil.errors import InvalidArgument
from qveil.json_types import JSONObject
from qveil.privacy import gdp_epsilon, gdp_mu
from qveil.trainer.config import TrainConfig
from qveil.trainer.env import GymEnv
from qveil.trainer.train import make_env

if TYPE_CHECKING:  # the module loads torch: imported where a network trains
    import torch

    from qveil.trainer.algorithm import TrainResult
    from qveil.trainer.network import LipschitzMLP

__all__ = [
    "BaselinePrivacy",
    "NoisyRewards",
    "dpsgd_account",
    "dpsgd_calibrate",
    "input_perturbation_account",
    "input_perturbation_calibrate",
    "train_dpsgd",
    "train_input_perturbation",
]


# ----------------------------------------------------------------------------- accounting
@dataclass(frozen=True)
class BaselinePrivacy:
    """A baseline's guarantee: mu-GDP, hence (epsilon, delta)-DP, for its noise scale."""

    method: str
    noise_std: float
    """s (DP-SGD: std of the noise on the SUMMED clipped gradient; input: per reward)."""
    sensitivity: float
    """L2 sensitivity of one mechanism (DP-SGD: 2 B C; input perturbation: Delta_r)."""
    mechanisms: int
    """How many are composed (DP-SGD: updates; input perturbation: rewards)."""
    mu: float
    epsilon: float
    delta: float
    basis: str

    def to_dict(self) -> JSONObject:
        return dict(self.__dict__)


def _check(name: str, v: float, *, allow_zero: bool = False) -> float:
    x = float(v)
    if not math.isfinite(x) or x < 0 or (x == 0 and not allow_zero):
        raise InvalidArgument(f"{name} must be a finite number > 0, got {v!r}")
    return x


def _gdp(
    method: str, *, noise_std: float, sensitivity: float, mechanisms: int, delta: float, basis: str
) -> BaselinePrivacy:
    if int(mechanisms) < 1:
        raise InvalidArgument(f"mechanisms must be >= 1, got {mechanisms!r}")
    s = _check("noise_std", noise_std)
    mu = math.sqrt(int(mechanisms)) * _check("sensitivity", sensitivity) / s
    return BaselinePrivacy(
        method=method,
        noise_std=s,
        sensitivity=sensitivity,
        mechanisms=int(mechanisms),
        mu=mu,
        epsilon=gdp_epsilon(delta=delta, mu=mu),
        delta=delta,
        basis=basis,
    )


def _dpsgd_basis(batch_size: int, clip: float, steps: int) -> str:
    return (
        f"DP-SGD without subsampling amplification: {steps} Gaussian mechanisms on the sum of "
        f"B={batch_size} per-sample gradients clipped to C={clip:g} (L2 sensitivity 2BC, all "
        "rewards may differ), composed exactly as Gaussian DP (Dong, Roth & Su 2019)"
    )


def dpsgd_account(
    *, noise_std: float, batch_size: int, clip: float, steps: int, delta: float
) -> BaselinePrivacy:
    """epsilon of ``steps`` DP-SGD updates with noise std ``noise_std`` on the clipped sum."""
    sens = 2.0 * int(batch_size) * _check("clip", clip)
    return _gdp(
        "dp-sgd",
        noise_std=noise_std,
        sensitivity=sens,
        mechanisms=steps,
        delta=delta,
        basis=_dpsgd_basis(batch_size, clip, steps),
    )


def dpsgd_calibrate(
    *, epsilon: float, delta: float, batch_size: int, clip: float, steps: int
) -> BaselinePrivacy:
    """Smallest noise std meeting (epsilon, delta): s = sqrt(steps) 2 B C / mu(eps, delta)."""
    mu = gdp_mu(epsilon=epsilon, delta=delta)
    sens = 2.0 * int(batch_size) * _check("clip", clip)
    s = math.sqrt(int(steps)) * sens / mu
    res = dpsgd_account(noise_std=s, batch_size=batch_size, clip=clip, steps=steps, delta=delta)
    while res.epsilon > epsilon:  # s rounds; nudge up until the verified target holds
        s = math.nextafter(s, math.inf)
        res = dpsgd_account(noise_std=s, batch_size=batch_size, clip=clip, steps=steps, delta=delta)
    return res


def _input_basis(samples: int, sens: float) -> str:
    return (
        f"input perturbation: {samples} rewards each released once with Gaussian noise "
        f"(L2 sensitivity Delta_r={sens:g} each, all rewards may differ), composed exactly "
        "as Gaussian DP (Dong, Roth & Su 2019); training is post-processing"
    )


def input_perturbation_account(
    *, noise_std: float, samples: int, delta: float, reward_sensitivity: float = 1.0
) -> BaselinePrivacy:
    """epsilon of ``samples`` rewards perturbed with N(0, noise_std^2)."""
    return _gdp(
        "input-perturbation",
        noise_std=noise_std,
        sensitivity=reward_sensitivity,
        mechanisms=samples,
        delta=delta,
        basis=_input_basis(samples, reward_sensitivity),
    )


def input_perturbation_calibrate(
    *, epsilon: float, delta: float, samples: int, reward_sensitivity: float = 1.0
) -> BaselinePrivacy:
    """Smallest per-reward noise std meeting (epsilon, delta): sqrt(T) Delta_r / mu."""
    mu = gdp_mu(epsilon=epsilon, delta=delta)
    s = math.sqrt(int(samples)) * _check("reward_sensitivity", reward_sensitivity) / mu
    res = input_perturbation_account(
        noise_std=s, samples=samples, delta=delta, reward_sensitivity=reward_sensitivity
    )
    while res.epsilon > epsilon:
        s = math.nextafter(s, math.inf)
        res = input_perturbation_account(
            noise_std=s, samples=samples, delta=delta, reward_sensitivity=reward_sensitivity
        )
    return res


# ----------------------------------------------------------------------------- training
class NoisyRewards(gym.Wrapper):
    """Adds N(0, noise_std^2) to every reward once, when it is collected; keeps the TRUE
    episode returns in ``true_returns`` (for evaluation only, never for training)."""

    def __init__(
        self,
        env: GymEnv,
        *,
        noise_std: float,
        rng: np.random.Generator,
    ) -> None:
        super().__init__(env)
        self.noise_std = float(noise_std)
        self.rng = rng
        self.true_returns: list[float] = []
        self._ret = 0.0

    def reset(
        self, *, seed: int | None = None, options: dict[str, object] | None = None
    ) -> tuple[object, dict[str, object]]:
        self._ret = 0.0
        return self.env.reset(seed=seed, options=options)

    def step(self, action: object) -> tuple[object, float, bool, bool, dict[str, object]]:
        obs, r, term, trunc, info = self.env.step(action)
        self._ret += float(r)
        if term or trunc:
            self.true_returns.append(self._ret)
        noisy = float(r) + self.noise_std * float(self.rng.standard_normal())
        return obs, noisy, term, trunc, info


def _log_rows_with(returns: list[float], rows: list[JSONObject]) -> list[JSONObject]:
    out = []
    for row, ret in zip(rows, returns, strict=False):
        out.append({**row, "return": ret})
    return out


def train_input_perturbation(cfg: TrainConfig, *, noise_std: float, seed: int) -> TrainResult:
    """``train_q`` (sigma = 0) on an env whose rewards carry N(0, noise_std^2). The trainer's
    reward clipping is widened so the noisy rewards stay unbiased. The result's log rows hold
    the TRUE episode returns. Returns qveil.trainer.algorithm.TrainResult."""
    # here, not at the top: loads torch only when this runs
    from qveil.trainer.algorithm import train_q

    info = make_env(cfg)
    rng = np.random.default_rng([8, 2, int(seed)])
    env = NoisyRewards(info.env, noise_std=noise_std, rng=rng)
    wide = cfg.replace(reward_range=(-1e9, 1e9))
    try:
        res = train_q(wide, env, interval=info.interval, sigma=0.0, beta=1.0, seed=seed)
    finally:
        env.close()
    res.log_rows = _log_rows_with(env.true_returns, res.log_rows)
    return res


@dataclass
class DPSGDResult:
    network: LipschitzMLP
    log_rows: list[JSONObject]
    updates: int
    samples_used: int


def _effective(v: torch.Tensor, c: float, last: bool) -> torch.Tensor:
    """LipschitzMLP's layer rescaling (qveil.trainer.network): W = V c / max(c, ||V||), the
    spectral norm for hidden layers and the row norms for the output layer."""
    # torch loads only for the runs that train a network (a heavy import)
    import torch

    if last:
        norms = torch.linalg.vector_norm(v, dim=1, keepdim=True)
    else:
        norms = torch.linalg.matrix_norm(v, ord=2)
    return v * (c / torch.clamp(norms, min=c))


def _rescale_vjp(v: torch.Tensor, g: torch.Tensor, c: float, last: bool) -> torch.Tensor:
    """Per-sample vector-Jacobian products through W = V c / max(c, ||V||) (batched over the
    first axis of g). Where the norm is <= c the map is the identity. Hidden layers (spectral
    norm s1 with top singular vectors u, w): vjp(G) = c G / s1 - c <G, V> / s1^2 u w^T.
    Output rows (norm n): vjp(g) = c g / n - c <g, v> / n^3 v."""
    # torch loads only for the runs that train a network (a heavy import)
    import torch

    if last:
        n = torch.linalg.vector_norm(v, dim=1)  # (out,)
        big = n > c
        nn_ = n[:, None]
        dot = (g * v[None]).sum(dim=2, keepdim=True)  # (B, out, 1)
        scaled = c * g / nn_ - c * dot / nn_**3 * v[None]
        return torch.where(big[None, :, None], scaled, g)
    u, svals, vh = torch.linalg.svd(v, full_matrices=False)
    s1 = svals[0]
    if s1 <= c:
        return g
    top = torch.outer(u[:, 0], vh[0])
    dot = (g * v[None]).sum(dim=(1, 2))[:, None, None]
    out: torch.Tensor = c * g / s1 - c * dot / s1**2 * top[None]
    return out


def per_sample_grads(
    net: LipschitzMLP, xs: torch.Tensor, acts: torch.Tensor, ys: torch.Tensor
) -> torch.Tensor:
    """Per-sample gradients of 1/2 (Q(x_i, a_i) - y_i)^2 with respect to the RAW parameters
    of a ``LipschitzMLP`` (in ``named_parameters`` order), shape (B, n_params).

    Backpropagation by hand through the ReLU MLP in the effective weights W (one batched pass:
    for a linear layer the per-sample gradient is outer(delta_i, h_i)), then through the
    rescaling V -> W in closed form (:func:`_rescale_vjp`). Checked against autograd in the
    tests."""
    # torch loads only for the runs that train a network (a heavy import)
    import torch

    c = net.layer_bound
    n = net.n_layers
    with torch.no_grad():
        vs = [v.detach() for v in net.weights]
        bs = [b.detach() for b in net.biases]
        ws = [_effective(v, c, i == n - 1) for i, v in enumerate(vs)]
        hs = [xs.reshape(-1, 1).to(torch.float64)]
        zs = []
        for i in range(n):
            z = hs[-1] @ ws[i].T + bs[i]
            zs.append(z)
            hs.append(torch.relu(z) if i < n - 1 else z)
        q = hs[-1]
        bsz = q.shape[0]
        rows = torch.arange(bsz)
        delta = torch.zeros_like(q)
        delta[rows, acts] = q[rows, acts] - ys
        by_name = {}
        for i in range(n - 1, -1, -1):
            gw = delta[:, :, None] * hs[i][:, None, :]
            by_name[f"weights.{i}"] = _rescale_vjp(vs[i], gw, c, i == n - 1).reshape(bsz, -1)
            by_name[f"biases.{i}"] = delta
            if i > 0:
                delta = (delta @ ws[i]) * (zs[i - 1] > 0).to(delta.dtype)
        return torch.cat([by_name[name] for name, _ in net.named_parameters()], dim=1)


# long-function: the DP-SGD baseline's training loop in one piece, as the baseline paper states it
def train_dpsgd(cfg: TrainConfig, *, clip: float, noise_std: float, seed: int) -> DPSGDResult:
    """DP-SGD Q-learning on cfg's environment, mirroring ``train_q``'s loop without functional
    noise: per-sample gradients clipped to ``clip`` in L2, summed, plus N(0, noise_std^2 I),
    divided by B, one plain SGD step at rate cfg.lr on the network's raw parameters."""
    # torch loads only for the runs that train a network (a heavy import)
    import torch

    # here, not at the top: loads torch only when this runs
    from qveil.trainer.network import LipschitzMLP

    info = make_env(cfg)
    env, interval = info.env, info.interval
    m = info.n_actions
    ss = np.random.SeedSequence([8, 1, int(seed)])
    env_ss, np_ss, torch_ss = ss.spawn(3)
    rng = np.random.default_rng(np_ss)
    tgen = torch.Generator().manual_seed(int(torch_ss.generate_state(1)[0]))
    net = LipschitzMLP(
        n_actions=m, hidden=tuple(cfg.hidden), lipschitz=cfg.lipschitz, generator=tgen
    )
    target = None
    if cfg.target_update_episodes > 0:
        target = LipschitzMLP(n_actions=m, hidden=tuple(cfg.hidden), lipschitz=cfg.lipschitz)
        target.load_state_dict(net.state_dict())

    r_lo, r_hi = cfg.reward_range
    n_iter = cfg.iterations
    steps_per_iter = 1 if cfg.replay else cfg.batch_size
    cap = cfg.replay_capacity if cfg.replay else cfg.batch_size
    mem = {k: np.zeros(cap) for k in ("x", "r", "x2", "done")}
    mem_a = np.zeros(cap, dtype=np.int64)
    mem_len = mem_pos = 0
    updates = 0

    def q_np(xs: np.ndarray, model: LipschitzMLP) -> np.ndarray:
        with torch.no_grad():
            out: np.ndarray = model(torch.from_numpy(np.asarray(xs, dtype=np.float64))).numpy()
            return out

    def update(idx: np.ndarray) -> None:
        nonlocal updates
        q2 = q_np(mem["x2"][idx], target or net)
        y = mem["r"][idx] + cfg.gamma * (1.0 - mem["done"][idx]) * q2.max(axis=1)
        g = per_sample_grads(
            net, torch.from_numpy(mem["x"][idx]), torch.from_numpy(mem_a[idx]), torch.from_numpy(y)
        )
        norms = torch.linalg.vector_norm(g, dim=1, keepdim=True)
        g = g * torch.clamp(clip / torch.clamp(norms, min=1e-300), max=1.0)
        total = g.sum(dim=0)
        total = total + noise_std * torch.from_numpy(rng.standard_normal(total.shape[0]))
        step = cfg.lr * total / len(idx)
        with torch.no_grad():
            off = 0
            for _n, p in net.named_parameters():
                k = p.numel()
                p.sub_(step[off : off + k].reshape(p.shape))
                off += k
        updates += 1

    log_rows: list[JSONObject] = []
    obs, _ = env.reset(seed=int(env_ss.generate_state(1)[0]))
    x = float(interval.to_unit(np.asarray(obs, dtype=np.float64).reshape(-1))[0])
    ep_ret, step_no = 0.0, 0
    try:
        for _it in range(n_iter):
            if not cfg.replay:
                mem_len = mem_pos = 0
            for _ in range(steps_per_iter):
                eps = (
                    (
                        cfg.eps_end
                        + (cfg.eps_start - cfg.eps_end) * math.exp(-step_no / cfg.eps_decay)
                    )
                    if cfg.eps_start > 0
                    else 0.0
                )
                if eps > 0 and rng.random() < eps:
                    a = int(rng.integers(m))
                else:
                    a = int(np.argmax(q_np(np.array([x]), net)[0]))
                obs2, r, term, trunc, _ = env.step(a)
                ep_ret += float(r)
                rc = min(r_hi, max(r_lo, float(r)))
                x2 = float(interval.to_unit(np.asarray(obs2, dtype=np.float64).reshape(-1))[0])
                done = bool(term or (trunc and cfg.truncation_as_terminal))
                mem["x"][mem_pos], mem_a[mem_pos], mem["r"][mem_pos] = x, a, rc
                mem["x2"][mem_pos], mem["done"][mem_pos] = x2, float(done)
                mem_pos = (mem_pos + 1) % cap
                mem_len = min(mem_len + 1, cap)
                step_no += 1
                if cfg.replay and mem_len >= cfg.effective_learning_starts:
                    for _u in range(cfg.updates_per_step):
                        update(rng.integers(mem_len, size=cfg.batch_size))
                if term or trunc:
                    log_rows.append(
                        {
                            "episode": len(log_rows) + 1,
                            "steps": step_no,
                            "return": ep_ret,
                            "updates": updates,
                        }
                    )
                    if target is not None and len(log_rows) % cfg.target_update_episodes == 0:
                        target.load_state_dict(net.state_dict())
                    obs, _ = env.reset()
                    x = float(interval.to_unit(np.asarray(obs, dtype=np.float64).reshape(-1))[0])
                    ep_ret = 0.0
                else:
                    x = x2
            if not cfg.replay:
                update(np.arange(cfg.batch_size))
    finally:
        env.close()
    if updates != cfg.planned_updates:  # the accountant was told planned_updates
        raise RuntimeError(f"took {updates} updates, planned {cfg.planned_updates}")
    return DPSGDResult(network=net, log_rows=log_rows, updates=updates, samples_used=step_no)
