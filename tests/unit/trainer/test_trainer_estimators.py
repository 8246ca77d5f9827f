"""qveil.trainer.estimators: one interface (plan, train, summary) and one registry for the
fqi (kernel, any d; a 1-D grid config is its d = 1 case) and Algorithm 1 estimators; one
config loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from qveil.bundle import load_bundle
from qveil.errors import InvalidArgument
from qveil.kfqi_config import KernelFQIConfig
from qveil.privacy.events import KernelFQIEvent, OutputGaussianEvent
from qveil.privacy.ledger import PrivacyEvent
from qveil.trainer.collect import collect
from qveil.trainer.config import TrainConfig
from qveil.trainer.estimators import (
    ALIASES,
    ESTIMATORS,
    Estimator,
    create_estimator,
    estimator_name,
    load_config,
    register,
)

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def test_registry_holds_every_kind_and_refuses_a_second_registration() -> None:
    assert sorted(ESTIMATORS) == ["algorithm1", "kernel"] and ALIASES == {"grid": "kernel"}
    for name, cls in ESTIMATORS.items():
        assert issubclass(cls, Estimator) and cls.name == name
    with pytest.raises(InvalidArgument, match="registered already"):
        register("kernel")(ESTIMATORS["kernel"])


@pytest.mark.parametrize(
    "config,name,kind",
    [
        ("linewalk-private.toml", "kernel", KernelFQIConfig),
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


def test_a_grid_config_is_the_kernel_estimator_with_one_coordinate(tmp_path: Path) -> None:
    """The 1-D grid form (no estimator key, or estimator = "grid") loads as the kernel
    config with d = 1: its interval, anchors and beta renamed, the 1-D defaults elsewhere,
    the retired smoother key accepted without effect; the plan is the kernel accountant's."""
    from qveil.kfqi_config import GRID_DEFAULTS

    old = tmp_path / "grid.toml"
    old.write_text(
        'mode = "fqi"\nenv_id = "qveil/LineWalk-v0"\nstate_interval = [0.0, 1.0]\n'
        "reward_range = [0.0, 0.5]\ngamma = 0.5\ngrid_points = 51\nbeta = 3.0\n"
        "smoother_bandwidth = 0.2\n"
    )
    for text in ("", 'estimator = "grid"\n'):
        p = tmp_path / "g.toml"
        p.write_text(text + old.read_text())
        cfg = load_config(p)
        assert isinstance(cfg, KernelFQIConfig) and estimator_name(cfg) == "kernel"
        assert cfg.state_intervals == ((0.0, 1.0),) and cfg.betas == (3.0,)
        assert (cfg.anchor_points, cfg.gamma, cfg.lam) == (51, 0.5, GRID_DEFAULTS["lam"])
        assert cfg.spec(1).anchor_total == 51
    default = load_config(None)
    assert isinstance(default, KernelFQIConfig)
    assert all(getattr(default, k) == v for k, v in GRID_DEFAULTS.items())
    bad = tmp_path / "bad_grid.toml"
    bad.write_text('estimator = "grid"\nsmoother = 0.2\n')
    with pytest.raises(InvalidArgument, match="unknown"):
        load_config(bad)


def test_defaults_and_refusals(tmp_path: Path) -> None:
    assert isinstance(load_config(None), KernelFQIConfig)
    with pytest.raises(InvalidArgument, match="needs --config"):
        load_config(None, estimator="algorithm1")
    bad = tmp_path / "bad.toml"
    bad.write_text('estimator = "forest"\n')
    with pytest.raises(InvalidArgument, match="estimator must be one of"):
        load_config(bad)
    with pytest.raises(InvalidArgument, match="does not exist"):
        load_config(tmp_path / "none.toml")
    with pytest.raises(InvalidArgument, match="no estimator takes"):
        create_estimator({"estimator": "kernel"})


def test_plan_is_the_accountants_from_public_quantities() -> None:
    """plan() is the accountant's result for the config and the public shape only; a 1-D
    config refuses more coordinates than it has betas; the kernel plan shrinks sigma as
    1/N."""
    from qveil.kfqi_config import plan_kernel

    line = create_estimator(load_config(CONFIGS / "linewalk-private.toml"))
    got = line.plan(users=300, actions=2, dims=1, reward_range=(0.0, 0.5))
    want = plan_kernel(line.config, users=300, actions=2, dims=1, reward_range=(0.0, 0.5))
    assert got.sigma == want.sigma and got.epsilon == want.epsilon == 1.0
    with pytest.raises(InvalidArgument, match="1 betas for 4 coordinates"):
        line.plan(users=300, actions=2, dims=4, reward_range=(0.0, 0.5))
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


def test_a_plan_is_what_the_ledger_records() -> None:
    """Each kind's plan is a ReleasePlan whose parameters become its typed ledger event (the
    kernel plan a KernelFQIEvent, Algorithm 1's output mode an OutputGaussianEvent); a
    sigma = 0 baseline has no plan, and the kernel estimator refuses to train without a
    dataset."""
    kern = create_estimator(load_config(CONFIGS / "cartpole-private.toml"))
    plan = kern.plan(users=1000, actions=2, dims=4, reward_range=(0.0, 1.0))
    ev = PrivacyEvent.from_result(plan, dataset_id="pop", bundle_id="planned")
    assert isinstance(ev.mechanism, KernelFQIEvent) and ev.mu == plan.mu
    assert ev.mechanism.account().epsilon == plan.epsilon
    quick = load_config(CONFIGS / "linewalk-quick.toml")
    assert isinstance(quick, TrainConfig)
    alg = create_estimator(quick.replace(epsilon=8.0, sigma=None, mode="output"))
    p = alg.plan(users=0, actions=2, dims=1, reward_range=(0.0, 0.5))
    ev = PrivacyEvent.from_result(p, dataset_id="pop", bundle_id="planned")
    assert type(ev.mechanism) is OutputGaussianEvent and ev.epsilon == p.epsilon
    with pytest.raises(InvalidArgument, match="non-private baseline"):
        create_estimator(quick.replace(epsilon=None, sigma=0.0)).plan(
            users=0, actions=2, dims=1, reward_range=(0.0, 0.5)
        )
    with pytest.raises(InvalidArgument, match="fits a dataset"):
        kern.train(None, "unused")
