"""Baselines: DP-SGD and input perturbation (accounting against closed forms, tiny training)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

pytest.importorskip("torch")

import torch  # noqa: E402

from qveil.errors import InvalidArgument  # noqa: E402
from qveil.experiments.baselines import (  # noqa: E402
    NoisyRewards,
    dpsgd_account,
    dpsgd_calibrate,
    input_perturbation_account,
    input_perturbation_calibrate,
    per_sample_grads,
    train_dpsgd,
    train_input_perturbation,
)
from qveil.trainer.config import TrainConfig  # noqa: E402
from qveil.trainer.network import LipschitzMLP  # noqa: E402


def gdp_delta_closed_form(eps: float, mu: float) -> float:
    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))


def tiny_cfg(**kw: object) -> TrainConfig:
    base = dict(
        samples=128,
        batch_size=32,
        lr=0.05,
        gamma=0.9,
        resets=1,
        hidden=(8,),
        lipschitz=4.0,
        replay=False,
    )
    base.update(kw)
    return TrainConfig(**base).replace()  # type: ignore[arg-type]


def test_dpsgd_accounting_closed_form() -> None:
    """4 steps, B = 1, C = 0.5 (sensitivity 2BC = 1), s = 2: mu = sqrt(4) * 1 / 2 = 1 and
    delta(1) = Phi(-0.5) - e Phi(-1.5) = 0.126937."""
    r = dpsgd_account(noise_std=2.0, batch_size=1, clip=0.5, steps=4, delta=0.126937)
    assert r.mu == pytest.approx(1.0)
    assert gdp_delta_closed_form(1.0, 1.0) == pytest.approx(0.126937, abs=1e-6)
    assert r.epsilon == pytest.approx(1.0, abs=1e-4)
    # sensitivity is 2 B C: doubling B doubles mu
    assert dpsgd_account(
        noise_std=2.0, batch_size=2, clip=0.5, steps=4, delta=1e-4
    ).mu == pytest.approx(2.0)


def test_dpsgd_calibration_meets_the_target_and_no_less_noise_would() -> None:
    r = dpsgd_calibrate(epsilon=0.9, delta=1e-4, batch_size=64, clip=1.0, steps=78)
    assert r.epsilon <= 0.9
    assert gdp_delta_closed_form(0.9, r.mu) == pytest.approx(1e-4, rel=1e-6)
    assert r.noise_std == pytest.approx(math.sqrt(78) * 2 * 64 / r.mu)
    less = dpsgd_account(
        noise_std=0.99 * r.noise_std, batch_size=64, clip=1.0, steps=78, delta=1e-4
    )
    assert less.epsilon > 0.9


def test_input_perturbation_accounting_closed_form() -> None:
    """T rewards with noise s, sensitivity Delta_r: mu = sqrt(T) Delta_r / s."""
    r = input_perturbation_account(noise_std=50.0, samples=2500, delta=0.126937)
    assert r.mu == pytest.approx(1.0)
    assert r.epsilon == pytest.approx(1.0, abs=1e-4)
    c = input_perturbation_calibrate(epsilon=0.45, delta=1e-4, samples=5000)
    assert c.epsilon <= 0.45
    assert gdp_delta_closed_form(0.45, c.mu) == pytest.approx(1e-4, rel=1e-6)
    half = input_perturbation_calibrate(
        epsilon=0.45, delta=1e-4, samples=5000, reward_sensitivity=0.5
    )
    assert half.noise_std == pytest.approx(c.noise_std / 2, rel=1e-9)
    with pytest.raises(InvalidArgument):
        input_perturbation_account(noise_std=0.0, samples=10, delta=1e-4)


@pytest.mark.parametrize("lipschitz", [0.05, 100.0])  # rescaling active / inactive
def test_per_sample_grads_match_autograd(lipschitz: float) -> None:
    net = LipschitzMLP(
        n_actions=2, hidden=(8, 8), lipschitz=lipschitz, generator=torch.Generator().manual_seed(0)
    )
    g = torch.Generator().manual_seed(1)
    xs = torch.rand(6, generator=g, dtype=torch.float64)
    acts = torch.tensor([0, 1, 1, 0, 1, 0])
    ys = torch.rand(6, generator=g, dtype=torch.float64)

    rows = []
    for i in range(6):  # reference: one autograd backward pass per sample
        net.zero_grad()
        loss = 0.5 * (net(xs[i : i + 1])[0, acts[i]] - ys[i]) ** 2
        loss.backward()
        rows.append(torch.cat([p.grad.reshape(-1) for _, p in net.named_parameters()]))
    ref_flat = torch.stack(rows)
    mine = per_sample_grads(net, xs, acts, ys)
    assert torch.allclose(mine, ref_flat, atol=1e-12, rtol=1e-10)


def test_dpsgd_noise_moves_parameters_by_lr_s_over_b() -> None:
    """Clip ~0 removes the signal; one update then moves each raw parameter by
    N(0, (lr s / B)^2). 4 updates: std of the total change = 2 lr s / B. Dividing by B twice,
    or forgetting the noise, would be off by 32x."""
    cfg = tiny_cfg()
    res = train_dpsgd(cfg, clip=1e-12, noise_std=10.0, seed=3)
    assert res.updates == cfg.planned_updates == 4
    fresh = train_dpsgd(cfg, clip=1e-12, noise_std=0.0, seed=3)  # same init, no noise
    d = torch.cat(
        [
            (a - b).detach().reshape(-1)
            for a, b in zip(res.network.parameters(), fresh.network.parameters(), strict=True)
        ]
    )
    expected = 2 * 0.05 * 10.0 / 32
    assert float(d.std()) == pytest.approx(expected, rel=0.25)  # 34 parameters
    assert len(res.log_rows) == 2 and all(0 <= r["return"] <= 25 for r in res.log_rows)


def test_noisy_rewards_wrapper_and_input_training() -> None:
    import gymnasium as gym

    from qveil.trainer import register_envs

    register_envs()
    env = NoisyRewards(gym.make("qveil/LineWalk-v0"), noise_std=3.0, rng=np.random.default_rng(0))
    env.reset(seed=1)
    diffs = []
    for _ in range(2000):
        _, r_noisy, term, trunc, _ = env.step(1)
        diffs.append(r_noisy - (0.5 - abs(float(env.unwrapped._state) - 0.5)))
        if term or trunc:
            env.reset()
    assert np.std(diffs) == pytest.approx(3.0, rel=0.05)
    assert abs(np.mean(diffs)) < 0.25
    assert len(env.true_returns) == 40 and all(0 <= r <= 25 for r in env.true_returns)
    res = train_input_perturbation(tiny_cfg(), noise_std=5.0, seed=0)
    assert res.updates == 4
    assert all(0 <= r["return"] <= 25 for r in res.log_rows)  # true, not noisy, returns
