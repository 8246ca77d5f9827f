"""Algorithm 1 (and the replay recipe): the SGD step, determinism, noise resets, |g| > k
counting, and learning (non-private beats random; the authors' recipe approaches the
hand-written policy). The network's Lipschitz construction: test_trainer_network.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from qveil.bundle import mlp_forward
from qveil.trainer.algorithm import NoisePaths, _Rngs, train_q
from qveil.trainer.config import TrainConfig
from qveil.trainer.env import towards_middle_policy
from qveil.trainer.evaluate import run_policy
from qveil.trainer.network import LipschitzMLP
from qveil.trainer.train import make_env

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def quick(**change: object) -> TrainConfig:
    return dataclasses.replace(TrainConfig.from_toml(CONFIGS / "linewalk-quick.toml"), **change)


def _train(cfg: TrainConfig, *, sigma: float, beta: float = 50.0, seed: int | None = 1):
    info = make_env(cfg)
    return train_q(cfg, info.env, interval=info.interval, sigma=sigma, beta=beta, seed=seed)


def _greedy_return(weights: dict[str, np.ndarray], cfg: TrainConfig, episodes: int) -> float:
    env = make_env(cfg).env
    rets = run_policy(
        env, lambda s: int(np.argmax(mlp_forward(weights, [s])[0])), episodes=episodes, seed=123
    )
    return float(np.mean(rets))


def test_literal_update_is_one_plain_sgd_descent_step() -> None:
    """T = B = 16, gamma = 0, sigma = 0: the run must end at theta0 - alpha grad of
    (1/B) sum 1/2 (Q(x_t, a_t) - r_t)^2 over the batch it collected, recomputed here from
    scratch (same seed -> same initial net, env and greedy actions). Ascent (the paper's
    "+"), a sum instead of the mean, or a missing 1/2 all move theta elsewhere."""
    cfg = TrainConfig(
        samples=16, batch_size=16, lr=0.05, gamma=0.0, resets=1, env_kwargs={"episode_length": 50}
    )
    res = _train(cfg, sigma=0.0, seed=11)
    rngs = _Rngs(11)
    net0 = LipschitzMLP(
        n_actions=2, hidden=cfg.hidden, lipschitz=cfg.lipschitz, generator=rngs.torch
    )
    w0 = net0.export()
    env = make_env(cfg).env
    obs, _ = env.reset(seed=rngs.env_seed)
    xs, acts, rs = [], [], []
    for _ in range(16):
        x = float(obs[0])
        a = int(np.argmax(mlp_forward(w0, [x])[0]))
        obs, r, *_ = env.step(a)
        xs.append(x)
        acts.append(a)
        rs.append(r)
    q = net0(torch.tensor(xs)).gather(1, torch.tensor(acts).view(-1, 1)).view(-1)
    loss = 0.5 * torch.mean((q - torch.tensor(rs, dtype=torch.float64)) ** 2)
    loss.backward()
    with torch.no_grad():
        for p in net0.parameters():
            p -= cfg.lr * p.grad
    want, got = net0.export(), res.network.export()
    assert res.updates == 1
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-9, atol=1e-12)
    assert not np.allclose(got["b2"], w0["b2"])  # the step moved the network


def test_written_out_optimizers_match_torch() -> None:
    """RMSprop and Adam are written out (importing torch.optim costs ~2 s per process);
    20 steps on a cubic must match torch.optim's defaults to rounding."""
    from qveil.trainer.algorithm import _Adam, _RMSprop

    for mine, ref in ((_RMSprop, torch.optim.RMSprop), (_Adam, torch.optim.Adam)):
        g = torch.Generator().manual_seed(0)
        a = torch.nn.Parameter(torch.randn(5, 3, generator=g, dtype=torch.float64))
        b = torch.nn.Parameter(a.detach().clone())
        oa, ob = mine([a], 0.01), ref([b], lr=0.01)
        for i in range(20):
            for p, o in ((a, oa), (b, ob)):
                o.zero_grad()
                ((p**3).sum() + (p * i).sum()).backward()
                o.step()
        assert (a - b).abs().max().item() < 1e-12


def test_seeded_runs_are_deterministic_and_seed_matters() -> None:
    cfg = quick(samples=150, resets=3)
    a, b, c = (_train(cfg, sigma=0.2, seed=s) for s in (5, 5, 6))
    for k, v in a.network.export().items():
        np.testing.assert_array_equal(v, b.network.export()[k])
    assert a.log_rows == b.log_rows
    assert {k: v for k, v in a.noise.items() if k != "seconds"} == {
        k: v for k, v in b.noise.items() if k != "seconds"
    }
    assert not np.array_equal(a.network.export()["W0"], c.network.export()["W0"])


def test_unseeded_noise_comes_from_os_entropy() -> None:
    assert _Rngs(None).noise is None  # OUSamplePath(rng=None) -> qveil.rng.OSEntropy
    assert _Rngs(3).noise is not None


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # literal: T // B = 640 // 32 = 20 iterations, J = 5 -> a new path every 4 iterations
        ({"replay": False, "samples": 640, "batch_size": 32, "resets": 5}, [0, 4, 8, 12, 16]),
        # replay: one iteration per step, T = 200, J = 4 -> every 50 steps (every episode)
        ({"replay": True, "samples": 200, "batch_size": 32, "resets": 4}, [0, 50, 100, 150]),
    ],
)
def test_noise_resets_happen_exactly_at_the_documented_iterations(
    change: dict[str, object], expected: list[int]
) -> None:
    cfg = quick(**change)
    assert cfg.reset_period * np.arange(cfg.resets).tolist() is not None
    res = _train(cfg, sigma=0.3)
    assert res.noise["reset_iterations"] == expected
    assert res.noise["paths_per_action"] == cfg.resets == len(expected)
    assert res.updates == cfg.planned_updates


def test_exceedances_of_k_are_counted() -> None:
    """sigma = 1, k = 0.5, beta = 5000 (points nearly independent): the share of |g| > k must
    be 2 (1 - Phi(0.5)) = 0.617 (a counter using 2k would give 0.317, one using k/2 0.803)."""
    cfg = quick(samples=300, resets=2, k=0.5)
    res = _train(cfg, sigma=1.0, beta=5000.0)
    share = res.noise["exceed_k"] / res.noise["points"]
    assert res.noise["points"] > 700  # s.e. of the share < 0.019
    assert share == pytest.approx(2 * stats.norm.sf(0.5), abs=0.06)
    assert res.noise["paths_exceeding_k"] == 2 * 2  # every path of both actions


def test_noise_paths_count_without_sigma() -> None:
    n = NoisePaths(n_actions=3, sigma=0.0, beta=1.0, k=1.0, rng=None)
    n.reset(0)
    assert n.values(np.array([0.1, 0.2])).shape == (2, 3)
    assert n.finish()["points"] == 0 and n.finish()["paths_per_action"] == 1


def test_non_private_beats_random_on_quick_config() -> None:
    """sigma = 0 on linewalk-quick.toml: greedy return vs a random policy (~10.7) over 50
    episodes. Measured: trained 19.99, random 10.80 (s.e. ~0.4)."""
    cfg = quick()
    res = _train(cfg, sigma=0.0, seed=0)
    trained = _greedy_return(res.network.export(), cfg, 50)
    rng = np.random.default_rng(0)
    rand = float(
        np.mean(
            run_policy(make_env(cfg).env, lambda s: int(rng.integers(2)), episodes=50, seed=123)
        )
    )
    print(f"quick config, sigma=0: greedy {trained:.2f} vs random {rand:.2f}")
    assert trained > rand + 4.0


def test_dqn_recipe_approaches_the_hand_written_policy() -> None:
    """linewalk-dqn.toml with sigma = 0, REDUCED to 1500 samples (J = 30, still a path per
    episode) to keep the suite fast; the full 5000 reach 20.26 vs 20.68 (docs/training.md).
    Measured here: 20.74 vs the hand-written 'move towards 0.5' 20.76 (50 episodes); random
    scores ~10.7 and the untrained net ~0.8."""
    cfg = dataclasses.replace(
        TrainConfig.from_toml(CONFIGS / "linewalk-dqn.toml"), samples=1500, resets=30
    )
    res = _train(cfg, sigma=0.0, seed=1)
    trained = _greedy_return(res.network.export(), cfg, 50)
    ref = float(
        np.mean(run_policy(make_env(cfg).env, towards_middle_policy, episodes=50, seed=123))
    )
    print(f"dqn recipe (1500 samples), sigma=0: greedy {trained:.3f} vs hand-written {ref:.3f}")
    assert trained > ref - 1.0
