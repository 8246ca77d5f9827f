"""Algorithm 1 of Wang & Hegde (2019), faithful, with the authors' training practices as options.

One code path serves both recipes of :class:`qveil.trainer.config.TrainConfig` and sigma = 0
(the non-private DQN: the zero function is the GP sample path with sigma = 0, so no normals
are drawn, and everything else is identical).

Literal Algorithm 1 (``replay = false``), for iterations j = 0 .. T//B - 1:

* line 7-9: if j = 0 mod (T//B)/J, every action's sample path is replaced by a fresh
  :class:`qveil.noise.OUSamplePath` (J paths per action in all; the iterations are counted
  in :attr:`TrainResult.resets`);
* line 12: a_t = argmax_a Q(x_t, a) + g_a(x_t), x_t the unit state, evaluated on the path
  (so x_t is in the path before it is used); optional epsilon-greedy exploration ignores
  rewards, so it is post-processing;
* line 13-18: step the env, clip r_t to the declared range, put x_{t+1} in every path;
* line 19: y_t = r_t + gamma max_a [Q(x_{t+1}, a) + g_a(x_{t+1})] (no bootstrap after a
  terminal step, nor after a truncation when ``truncation_as_terminal``), held constant;
* line 20-22: l_t = 1/2 (Q(x_t, a_t) + g_{a_t}(x_t) - y_t)^2 and one plain SGD step
  theta <- theta - alpha grad (1/B) sum_t l_t. The paper's line 22 has "+": that is ascent;
  we descend (docs/privacy.md section 4, errata). y_t uses the same theta, which does not change
  within an iteration, so computing it at update time is the same as at line 19.

The leftover T - B (T//B) samples of a T not divisible by B would never enter an update,
so they are not collected.

With ``replay = true`` (the authors' dpql.py) an iteration is one environment step; each
step stores its transition in a replay memory and, once it holds ``learning_starts``
samples, takes ``updates_per_step`` updates on batches of B drawn uniformly from it. The
noise of a replayed transition is the *current* path evaluated at its states (drawn exactly
and lazily), as in dpql.py; targets may come from a target network refreshed every
``target_update_episodes`` episodes.

Randomness: with a seed every source (env, initial weights, exploration, replay, noise) is
derived from it; without one the noise draws from OS entropy (``rng=None``) and the rest
from OS-seeded generators.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from qveil.errors import InvalidArgument
from qveil.json_types import JSONObject
from qveil.noise import OUSamplePath, StateInterval
from qveil.rng import NormalSource
from qveil.trainer.config import TrainConfig
from qveil.trainer.env import GymEnv
from qveil.trainer.network import LipschitzMLP

__all__ = ["NoisePaths", "TrainResult", "train_q"]


class NoisePaths:
    """The m per-action sample paths of the current reset epoch, with counters.

    ``reset(iteration)`` starts J's next set of paths (recording the iteration); ``values``
    returns g_a(x) for every action, drawing new points exactly. With sigma = 0 the paths
    are the zero function and nothing is drawn. Counts |g| > k over all paths ever used.
    """

    def __init__(
        self, *, n_actions: int, sigma: float, beta: float, k: float, rng: NormalSource | None
    ) -> None:
        self.n_actions = int(n_actions)
        self.sigma = float(sigma)
        self.beta = float(beta)
        self.k = float(k)
        self.rng = rng
        self.resets: list[int] = []
        self.points = 0
        self.exceed_k = 0
        self.paths_exceeding = 0
        self.max_abs = 0.0
        self.seconds = 0.0
        self._paths: list[OUSamplePath] | None = None
        self._cache: dict[float, np.ndarray] = {}

    def reset(self, iteration: int) -> None:
        self._close_epoch()
        self.resets.append(int(iteration))
        self._cache = {}
        if self.sigma > 0:
            self._paths = [
                OUSamplePath(beta=self.beta, sigma=self.sigma, rng=self.rng)
                for _ in range(self.n_actions)
            ]

    def value(self, x: float) -> np.ndarray:
        """g_a(x) for one unit state and every action: shape (m,)."""
        g = self._cache.get(x)
        if g is None:
            if self._paths is None:  # sigma = 0: the zero function
                return np.zeros(self.n_actions)
            t0 = time.perf_counter()
            g = np.array([p.sample_one(x) for p in self._paths])
            self._cache[x] = g
            self.seconds += time.perf_counter() - t0
        return g

    def values(self, xs: np.ndarray) -> np.ndarray:
        """g_a(x) for each unit state in ``xs`` (1-D) and each action: shape (n, m).

        States already drawn in this epoch come from a mirror of the paths' stored values
        (values never change); new ones are drawn by each action's path in one call, in
        first-occurrence order (the exact joint law, qveil.noise)."""
        if self.sigma == 0:
            return np.zeros((len(xs), self.n_actions))
        assert self._paths is not None, "reset() must be called before values()"
        t0 = time.perf_counter()
        cache = self._cache
        keys = xs.tolist()
        new = [x for x in dict.fromkeys(keys) if x not in cache]
        if new:
            arr = np.array(new)
            drawn = np.stack([p.sample(arr) for p in self._paths], axis=1)
            cache.update(zip(new, drawn, strict=True))
        out = np.array([cache[x] for x in keys])
        self.seconds += time.perf_counter() - t0
        return out

    def _close_epoch(self) -> None:
        if not self._paths:
            return
        for p in self._paths:
            _, gs = p.points()
            n_big = int((np.abs(gs) > self.k).sum())
            self.points += len(gs)
            self.exceed_k += n_big
            self.paths_exceeding += n_big > 0
            if len(gs):
                self.max_abs = max(self.max_abs, float(np.abs(gs).max()))
        self._paths = None

    def finish(self) -> JSONObject:
        """Close the last epoch and return the counters (for the card)."""
        self._close_epoch()
        return {
            "sigma": self.sigma,
            "beta": self.beta,
            "k": self.k,
            "paths_per_action": len(self.resets),
            "reset_iterations": list(self.resets),
            "points": self.points,
            "exceed_k": self.exceed_k,
            "paths_exceeding_k": self.paths_exceeding,
            "max_abs_g": self.max_abs,
            "seconds": self.seconds,
        }


@dataclass
class TrainResult:
    """What a run produced: the network, per-episode log rows and counters."""

    network: LipschitzMLP
    log_rows: list[JSONObject]
    updates: int
    samples_used: int
    noise: JSONObject
    seconds: float
    reward_clipped: int = 0
    extra: JSONObject = field(default_factory=dict)


class _Rngs:
    def __init__(self, seed: int | None) -> None:
        if seed is None:
            ss = np.random.SeedSequence()  # OS entropy
            self.noise: NormalSource | None = None  # OSEntropy in every path
        else:
            ss = np.random.SeedSequence(int(seed))
        env_ss, noise_ss, explore_ss, torch_ss = ss.spawn(4)
        if seed is not None:
            self.noise = np.random.default_rng(noise_ss)
        self.env_seed = int(env_ss.generate_state(1, dtype=np.uint32)[0])
        self.explore = np.random.default_rng(explore_ss)
        self.torch = torch.Generator().manual_seed(
            int(torch_ss.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))
        )


def _epsilon(cfg: TrainConfig, step: int) -> float:
    return cfg.eps_end + (cfg.eps_start - cfg.eps_end) * math.exp(-step / cfg.eps_decay)


class _PlainSGD:
    """theta <- theta - alpha grad: Theorem 5's update, nothing else (no momentum, no decay)."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float) -> None:
        self.params = params
        self.lr = float(lr)

    def zero_grad(self, set_to_none: bool = False) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for p in self.params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-self.lr)


class _RMSprop(_PlainSGD):
    """torch.optim.RMSprop's default update (alpha 0.99, eps 1e-8, no momentum), written out:
    v <- 0.99 v + 0.01 g^2; theta <- theta - lr g / (sqrt(v) + eps). (Importing torch.optim
    pulls in torch._dynamo, ~2 s per process.)"""

    def __init__(self, params: list[torch.nn.Parameter], lr: float) -> None:
        super().__init__(params, lr)
        self.v = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self) -> None:
        for p, v in zip(self.params, self.v, strict=True):
            if p.grad is not None:
                v.mul_(0.99).addcmul_(p.grad, p.grad, value=0.01)
                p.addcdiv_(p.grad, v.sqrt().add_(1e-8), value=-self.lr)


class _Adam(_PlainSGD):
    """torch.optim.Adam's default update (betas 0.9, 0.999, eps 1e-8), written out."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float) -> None:
        super().__init__(params, lr)
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.t = 0

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        c1, c2 = 1 - 0.9**self.t, 1 - 0.999**self.t
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            if p.grad is not None:
                m.mul_(0.9).add_(p.grad, alpha=0.1)
                v.mul_(0.999).addcmul_(p.grad, p.grad, value=0.001)
                p.addcdiv_(m, (v / c2).sqrt_().add_(1e-8), value=-self.lr / c1)


def _make_optimizer(cfg: TrainConfig, net: LipschitzMLP) -> _PlainSGD:
    params = list(net.parameters())
    kind = {"sgd": _PlainSGD, "rmsprop": _RMSprop, "adam": _Adam}[cfg.optimizer]
    return kind(params, cfg.lr)


class _Actor:
    """numpy mirror of the effective weights for fast single-state action selection."""

    def __init__(self, net: LipschitzMLP) -> None:
        self.net = net
        self.refresh()

    def refresh(self) -> None:
        e = self.net.export()
        self.layers = [(e[f"W{i}"], e[f"b{i}"]) for i in range(self.net.n_layers)]

    def snapshot(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """A frozen copy of the current effective weights (a target network)."""
        return [(w.copy(), b.copy()) for w, b in self.layers]

    def q(self, x: float) -> np.ndarray:
        row: np.ndarray = self.q_batch(np.array([x]))[0]
        return row

    def q_batch(
        self, xs: np.ndarray, layers: list[tuple[np.ndarray, np.ndarray]] | None = None
    ) -> np.ndarray:
        layers = self.layers if layers is None else layers
        h = xs.reshape(-1, 1)
        for i, (w, b) in enumerate(layers):
            h = h @ w.T + b
            if i < len(layers) - 1:
                np.maximum(h, 0.0, out=h)
        return h


def train_q(
    cfg: TrainConfig,
    env: GymEnv,
    *,
    interval: StateInterval,
    sigma: float,
    beta: float,
    seed: int | None = None,
    progress: bool = False,
    on_episode: Callable[[JSONObject], None] | None = None,
) -> TrainResult:
    """Run Algorithm 1 (or the replay recipe) on ``env`` with training noise (sigma, beta).

    ``interval`` maps observations to the unit state x; ``seed`` None means OS entropy.
    Returns the trained network and the counters the card reports.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest and deterministic
    try:
        return _train_q(
            cfg,
            env,
            interval=interval,
            sigma=sigma,
            beta=beta,
            seed=seed,
            progress=progress,
            on_episode=on_episode,
        )
    finally:
        torch.set_num_threads(threads)


# long-function: Algorithm 1's loop (the paper's lines 5-22) kept in one piece, each step beside the
#   line it implements
def _train_q(
    cfg: TrainConfig,
    env: GymEnv,
    *,
    interval: StateInterval,
    sigma: float,
    beta: float,
    seed: int | None,
    progress: bool,
    on_episode: Callable[[JSONObject], None] | None,
) -> TrainResult:
    t_start = time.perf_counter()
    m = int(env.action_space.n)  # type: ignore[attr-defined]
    rngs = _Rngs(seed)
    net = LipschitzMLP(
        n_actions=m, hidden=tuple(cfg.hidden), lipschitz=cfg.lipschitz, generator=rngs.torch
    )
    opt = _make_optimizer(cfg, net)
    actor = _Actor(net)  # numpy copy of the effective weights, refreshed after every update
    # the target network is a frozen copy of the effective weights (None: the current ones)
    target = actor.snapshot() if cfg.target_update_episodes > 0 else None
    noise = NoisePaths(n_actions=m, sigma=sigma, beta=beta, k=cfg.k, rng=rngs.noise)
    r_lo, r_hi = cfg.reward_range

    n_iter = cfg.iterations
    period = cfg.reset_period
    steps_per_iter = 1 if cfg.replay else cfg.batch_size
    total_steps = n_iter * steps_per_iter
    cap = cfg.replay_capacity if cfg.replay else cfg.batch_size
    mem_x = np.zeros(cap)
    mem_a = np.zeros(cap, dtype=np.int64)
    mem_r = np.zeros(cap)
    mem_x2 = np.zeros(cap)
    mem_done = np.zeros(cap)
    mem_len = 0
    mem_pos = 0

    state = {"updates": 0, "clipped": 0}
    log_rows: list[JSONObject] = []
    obs, _ = env.reset(seed=rngs.env_seed)
    lo, hi, width = interval.lo, interval.hi, interval.width

    def unit(o: object) -> float:
        """StateInterval.to_unit for one observation (same arithmetic, less overhead)."""
        st = float(np.asarray(o, dtype=np.float64).reshape(-1)[0])
        if not lo <= st <= hi:  # also refuses NaN
            raise InvalidArgument(
                f"the environment returned state {st!r} outside its "
                f"observation space [{lo!r}, {hi!r}]"
            )
        return min(1.0, max(0.0, (st - lo) / width)) + 0.0

    x = unit(obs)
    ep_return = 0.0
    ep_len = 0
    step = 0
    bar = tqdm(
        total=total_steps,
        disable=not progress,
        unit="step",
        dynamic_ncols=True,
        desc="train",
        leave=False,
    )

    def update(idx: np.ndarray) -> None:
        xs = mem_x[idx]
        xs2 = mem_x2[idx]
        acts = mem_a[idx]
        g_s = noise.values(xs)[np.arange(len(idx)), acts]
        g_s2 = noise.values(xs2)
        q_next = actor.q_batch(xs2, target) + g_s2  # held constant (no gradient)
        y = mem_r[idx] + cfg.gamma * (1.0 - mem_done[idx]) * q_next.max(axis=1)
        q = net(torch.from_numpy(xs)).gather(1, torch.from_numpy(acts).view(-1, 1)).view(-1)
        pred = q + torch.from_numpy(g_s)
        yt = torch.from_numpy(y)
        if cfg.loss == "mse":
            loss = 0.5 * torch.mean((pred - yt) ** 2)
        else:
            loss = F.smooth_l1_loss(pred, yt)
        opt.zero_grad(set_to_none=False)
        loss.backward()  # type: ignore[no-untyped-call]
        if cfg.grad_clamp > 0:
            for p in net.parameters():
                assert p.grad is not None
                p.grad.clamp_(-cfg.grad_clamp, cfg.grad_clamp)
        opt.step()
        state["updates"] += 1
        actor.refresh()

    try:
        for it in range(n_iter):
            if it % period == 0:
                noise.reset(it)
            if not cfg.replay:
                mem_len = mem_pos = 0
            for _ in range(steps_per_iter):
                g = noise.value(x)  # x_t is in every path before it is used
                eps = _epsilon(cfg, step) if cfg.eps_start > 0 else 0.0
                if eps > 0 and rngs.explore.random() < eps:
                    a = int(rngs.explore.integers(m))
                else:
                    a = int(np.argmax(actor.q(x) + g))
                obs2, r, terminated, truncated, _ = env.step(a)
                r = float(r)
                ep_return += r
                ep_len += 1
                rc = min(r_hi, max(r_lo, r))
                state["clipped"] += rc != r
                x2 = unit(obs2)
                noise.value(x2)  # lines 14-18: x_{t+1} enters every path
                done = bool(terminated or (truncated and cfg.truncation_as_terminal))
                mem_x[mem_pos], mem_a[mem_pos], mem_r[mem_pos] = x, a, rc
                mem_x2[mem_pos], mem_done[mem_pos] = x2, float(done)
                mem_pos = (mem_pos + 1) % cap
                mem_len = min(mem_len + 1, cap)
                step += 1
                if cfg.replay and mem_len >= cfg.effective_learning_starts:
                    for _u in range(cfg.updates_per_step):
                        update(rngs.explore.integers(mem_len, size=cfg.batch_size))
                if terminated or truncated:
                    row = {
                        "episode": len(log_rows) + 1,
                        "steps": step,
                        "return": ep_return,
                        "length": ep_len,
                        "updates": state["updates"],
                        "paths": len(noise.resets),
                        "explore_eps": round(eps, 6),
                    }
                    log_rows.append(row)
                    if on_episode is not None:
                        on_episode(row)
                    recent = [rr["return"] for rr in log_rows[-10:]]
                    bar.set_postfix(ep=len(log_rows), ret=f"{np.mean(recent):.2f}")
                    if target is not None and len(log_rows) % cfg.target_update_episodes == 0:
                        target = actor.snapshot()
                    obs, _ = env.reset()
                    x = unit(obs)
                    ep_return = 0.0
                    ep_len = 0
                else:
                    x = x2
                bar.update(1)
            if not cfg.replay:
                update(np.arange(cfg.batch_size))  # line 22: one SGD step on this batch
    finally:
        bar.close()
    stats = noise.finish()
    expected = cfg.planned_updates
    if state["updates"] != expected:  # the accountant was told `expected`
        raise RuntimeError(f"took {state['updates']} updates, planned {expected}")
    return TrainResult(
        network=net,
        log_rows=log_rows,
        updates=state["updates"],
        samples_used=step,
        noise=stats,
        seconds=time.perf_counter() - t_start,
        reward_clipped=state["clipped"],
    )
