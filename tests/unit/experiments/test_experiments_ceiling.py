"""``qveil experiments ceiling`` (qveil.experiments.ceiling): the offline learner learns a
known optimum from a dataset alone, and ``--quick`` (200 CartPole users, seconds) writes
every policy's row on common episodes with sigma from the accountant."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from experiment_helpers import read_rows, run_quick

from qveil.dataset import Dataset
from qveil.experiments import ceiling


def _bandit(n: int, seed: int) -> Dataset:
    """One-step episodes on x in [-1, 1]^2: action 1 pays 1 where x_0 > 0, action 0 pays 1
    where x_0 < 0 (the other pays 0); every step terminal."""
    rng = np.random.default_rng(seed)
    s = rng.uniform(-1, 1, (n, 2))
    a = rng.integers(0, 2, n)
    r = ((s[:, 0] > 0) == (a == 1)).astype(float)
    return Dataset(
        user=np.arange(n), s=s, a=a, r=r, s2=s, terminal=np.ones(n, bool), n_actions=2,
        reward_range=(0.0, 1.0),
    )  # fmt: skip


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_offline_learner_finds_the_optimum_from_data_alone(alpha: float) -> None:
    ds = _bandit(2000, 0)
    cfg = ceiling.LearnerConfig(cql_alpha=alpha, steps=400, hidden=(32,), lr=3e-3, batch=128)
    model = ceiling.fit_offline_q(ds, cfg, seed=0)
    x = np.random.default_rng(1).uniform(-1, 1, (500, 2))
    far = np.abs(x[:, 0]) > 0.15
    assert ((model.act(x) == 1) == (x[:, 0] > 0))[far].mean() > 0.95
    q = model.values(x[far])
    # terminal one-step rewards: DQN's values near 1 for the right action and 0 for the
    # other; CQL's are conservative (never above the truth) with the gap kept
    if alpha == 0:
        assert np.abs(q.max(axis=1) - 1.0).mean() < 0.2
        assert np.abs(q.min(axis=1)).mean() < 0.3
    else:
        assert q.max() < 1.05 and (q.max(axis=1) - q.min(axis=1)).mean() > 0.3


def test_quick_rows_on_common_episodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QVEIL_LEVERS_CACHE", str(tmp_path / "cache"))
    run_quick("ceiling", tmp_path)
    rows = read_rows(tmp_path / "ceiling.csv", ceiling.COLUMNS)
    assert [r["policy"] for r in rows] == [
        "random", "kernel fqi, non-private", "kernel fqi, eps 1", "offline DQN", "discrete CQL",
    ]  # fmt: skip
    assert {(r["env"], r["users"], r["seed"]) for r in rows} == {("CartPole-v1", "200", "0")}
    by = {r["policy"]: r for r in rows}
    assert float(by["random"]["fraction"]) == 0.0
    assert float(by["kernel fqi, non-private"]["fraction"]) == pytest.approx(1.0)
    assert by["kernel fqi, eps 1"]["releases"] == "2"
    from qveil.kfqi_config import KernelFQIConfig, plan_kernel

    cfg = ceiling.load_config("CartPole-v1")
    plan = plan_kernel(
        KernelFQIConfig.from_dict({**cfg, "epsilon": 1.0, "delta": 1e-5}),
        users=200, actions=2, dims=4, reward_range=(0.0, 1.0),
    )  # fmt: skip
    assert float(by["kernel fqi, eps 1"]["sigma"]) == pytest.approx(plan.sigma)
    for r in rows:
        assert float(r["return_lo"]) <= float(r["return"]) <= float(r["return_hi"])
        assert 8 <= float(r["return"]) <= 500 and not math.isnan(float(r["fraction"]))
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 1  # the dataset is cached
