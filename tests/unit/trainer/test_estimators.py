"""qveil.trainer.estimators: one interface (plan, train, summary) and one registry for the
grid fqi, kernel fqi and Algorithm 1 estimators; one config loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from qveil.bundle import load_bundle
from qveil.errors import InvalidArgument
from qveil.fqi_config import FQIConfig
from qveil.kfqi_config import KernelFQIConfig
from qveil.trainer.collect import collect
from qveil.trainer.config import TrainConfig
from qveil.trainer.estimators import (
    ESTIMATORS,
    Estimator,
    create_estimator,
    estimator_name,
    load_config,
    register,
)

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def test_registry_holds_every_kind_and_refuses_a_second_registration() -> None:
    assert sorted(ESTIMATORS) == ["algorithm1", "grid", "kernel"]
    for name, cls in ESTIMATORS.items():
        assert issubclass(cls, Estimator) and cls.name == name
    with pytest.raises(InvalidArgument, match="registered already"):
        register("grid")(ESTIMATORS["grid"])


@pytest.mark.parametrize(
    "config,name,kind",
    [
        ("linewalk-private.toml", "grid", FQIConfig),
        ("cartpole-private.toml", "kernel", KernelFQIConfig),
        ("acrobot-private.toml", "kernel", KernelFQIConfig),
        ("linewalk-quick.toml", "algorithm1", TrainConfig),
        ("linewalk-dqn.toml", "algorithm1", TrainConfig),
    ],
)
def test_one_loader_for_every_config(config: str, name: str, kind: type) -> None:
    cfg = load_config(CONFIGS / config)
    assert isinstance(cfg, kind) and estimator_name(cfg) == name
    assert create_estimator(cfg).name == name
    assert create_estimator(cfg).needs_dataset is (name != "algorithm1")


def test_defaults_and_refusals(tmp_path: Path) -> None:
    assert isinstance(load_config(None), FQIConfig)
    with pytest.raises(InvalidArgument, match="needs --config"):
        load_config(None, estimator="algorithm1")
    bad = tmp_path / "bad.toml"
    bad.write_text('estimator = "forest"\n')
    with pytest.raises(InvalidArgument, match="estimator must be one of"):
        load_config(bad)
    with pytest.raises(InvalidArgument, match="does not exist"):
        load_config(tmp_path / "none.toml")
    with pytest.raises(InvalidArgument, match="no estimator takes"):
        create_estimator({"estimator": "grid"})


def test_plan_is_the_accountants_from_public_quantities() -> None:
    """plan() is the accountant's result for the config and the public shape only; the grid
    estimator refuses more than one coordinate; the kernel plan shrinks sigma as 1/N."""
    from qveil.fqi_config import plan

    grid = create_estimator(load_config(CONFIGS / "linewalk-private.toml"))
    got = grid.plan(users=300, actions=2, dims=1, reward_range=(0.0, 0.5))
    want = plan(grid.config, users=300, actions=2, reward_range=(0.0, 0.5))
    assert got.sigma == want.sigma and got.epsilon == want.epsilon == 1.0
    with pytest.raises(InvalidArgument, match="one coordinate"):
        grid.plan(users=300, actions=2, dims=4, reward_range=(0.0, 0.5))
    kern = create_estimator(load_config(CONFIGS / "cartpole-private.toml"))
    s1 = kern.plan(users=1000, actions=2, dims=4, reward_range=(0.0, 1.0)).sigma
    s10 = kern.plan(users=10_000, actions=2, dims=4, reward_range=(0.0, 1.0)).sigma
    assert s10 == pytest.approx(s1 / 10, rel=1e-6)
    cfg = load_config(CONFIGS / "linewalk-quick.toml").replace(
        epsilon=8.0, sigma=None, mode="output"
    )
    alg = create_estimator(cfg)
    assert alg.plan(users=0, actions=2, dims=1, reward_range=(0.0, 0.5)).epsilon is not None


def test_train_through_the_interface_writes_a_release(tmp_path: Path) -> None:
    est = create_estimator(load_config(CONFIGS / "linewalk-private.toml"))
    ds = collect("qveil/LineWalk-v0", 50, 3)
    out = est.train(ds, tmp_path / "b", force=True)
    assert out.path == tmp_path / "b" and load_bundle(out.path).card["mode"] == "fqi"
    assert out.card["users"] == 50 and "written to" in est.summary(out)
    with pytest.raises(InvalidArgument, match="no --dataset"):
        create_estimator(load_config(CONFIGS / "linewalk-quick.toml")).train(ds, tmp_path / "c")
