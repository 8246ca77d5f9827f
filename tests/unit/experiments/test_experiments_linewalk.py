"""One LineWalk run of any method (qveil.experiments.linewalk): the config and its privacy
row, the released function's returns (Q clamped, plus one fixed noise path per action), the
reference policies, and a small run of a spec."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qveil.errors import InvalidArgument
from qveil.experiments.linewalk import (
    DEFAULT_CONFIG,
    evaluate_release,
    load_cfg,
    privacy_row,
    reference_returns,
    run_spec,
)
from qveil.trainer.config import TrainConfig
from qveil.trainer.env import towards_middle_policy
from qveil.trainer.evaluate import run_policy
from qveil.trainer.train import make_env

QUICK = Path(__file__).resolve().parents[3] / "configs" / "linewalk-quick.toml"
#: Q(x, 0) = 0.5 - x, Q(x, 1) = x - 0.5 on the unit state (a ReLU pair per action)
TOWARDS_THE_EDGES = {
    "W0": np.array([[1.0], [-1.0]]),
    "b0": np.array([-0.5, 0.5]),
    "W1": np.array([[-1.0, 1.0], [1.0, -1.0]]),
    "b1": np.zeros(2),
}


def test_load_cfg() -> None:
    assert load_cfg() == TrainConfig.from_toml(DEFAULT_CONFIG)
    cfg = load_cfg(QUICK, samples=200, resets=4)
    assert (cfg.samples, cfg.resets) == (200, 4) and cfg.env_id == "qveil/LineWalk-v0"


def test_privacy_row() -> None:
    row, eff = privacy_row(load_cfg(QUICK, sigma=1.0))
    assert row["sigma"] == 1.0 and row["params"]["actions"] == 2 and eff.sigma == 1.0
    calibrated, eff = privacy_row(load_cfg(QUICK, sigma=None, epsilon=3.0, mode="output"))
    assert calibrated["epsilon"] <= 3.0 and calibrated["holds"] is True


def test_evaluate_release_plays_the_released_function() -> None:
    cfg = load_cfg(QUICK)
    got = evaluate_release(cfg, TOWARDS_THE_EDGES, sigma=0.0, beta=1.0, q_bound=None,
                           episodes=3, seed=4)  # fmt: skip
    info = make_env(cfg)
    try:
        edges = run_policy(info.env, lambda s: int(s > 0.5), episodes=3, seed=10_004)
    finally:
        info.env.close()
    assert got == edges
    # a clamp to 0 ties every action: argmax takes action 0 everywhere
    clamped = evaluate_release(cfg, TOWARDS_THE_EDGES, sigma=0.0, beta=1.0, q_bound=0.0,
                               episodes=3, seed=4)  # fmt: skip
    info = make_env(cfg)
    try:
        assert clamped == run_policy(info.env, lambda s: 0, episodes=3, seed=10_004)
    finally:
        info.env.close()
    # the noise paths are fixed by the seed: the same release, the same returns
    noisy = [
        evaluate_release(
            cfg, TOWARDS_THE_EDGES, sigma=5.0, beta=2.0, q_bound=None, episodes=3, seed=4
        )  # fmt: skip
        for _ in range(2)
    ]
    assert noisy[0] == noisy[1]


def test_reference_returns() -> None:
    cfg = load_cfg(QUICK)
    refs = reference_returns(cfg, episodes=5, seed=1)
    info = make_env(cfg)
    try:
        mid = run_policy(info.env, towards_middle_policy, episodes=5, seed=1)
    finally:
        info.env.close()
    assert refs["towards 0.5"] == float(np.mean(mid)) > refs["random"]


def test_run_spec_trains_and_scores_the_release() -> None:
    spec = {"method": "alg1", "config": str(QUICK), "seed": 2, "eval_episodes": 2,
            "config_changes": {"samples": 100, "resets": 2}, "train_sigma": 0.0,
            "train_beta": 1.0}  # fmt: skip
    out = run_spec(spec)
    assert {k: out[k] for k in spec} == spec
    assert len(out["curve"]) >= 1 and all(len(point) == 2 for point in out["curve"])
    assert np.isfinite(out["release_return"]) and out["seconds"] > 0
    with pytest.raises(
        InvalidArgument, match="method must be one of alg1, dpsgd, input, got 'sgd'"
    ):
        run_spec({**spec, "method": "sgd"})
