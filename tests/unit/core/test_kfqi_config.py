"""The public configuration of an fqi release (qveil.kfqi_config): each field's check (a
bad value named), a config file in either form (kernel, or the 1-D grid one read as d = 1),
relative paths taken from the file's folder, the TOML round trip, and the privacy plan from
public quantities."""

from __future__ import annotations

from pathlib import Path

import pytest

from qveil.errors import InvalidArgument
from qveil.kfqi_config import (
    DEFAULT_BETA,
    GRID_DEFAULTS,
    KernelFQIConfig,
    default_config,
    grid_config,
    load_fqi_config,
    plan_kernel,
    read_fqi_toml,
)

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"estimator": "grid"}, "estimator must be kernel, got 'grid'"),
        ({"state_intervals": [[0.0, 1.0, 2.0]]}, r"state_intervals must be \[\[lo, hi\], ...\]"),
        ({"state_intervals": 3}, "state_intervals must be"),
        ({"reward_range": [0.0]}, r"reward_range must be \[lo, hi\], got \[0.0\]"),
        ({"actions": 0}, "actions must be an integer >= 1, got 0"),
        ({"actions": True}, "actions must be an integer >= 1, got True"),
        ({"neighbour": "row"}, "neighbour must be user or reward, got 'row'"),
        ({"epsilon": 1.0, "sigma": 2.0}, "give epsilon or sigma, not both"),
        ({"prior": ""}, "prior must be a file path"),
        ({"behaviour_policy": ""}, "behaviour_policy must be a name"),
        ({"behaviour_epsilon": 1.5}, r"behaviour_epsilon must be in \[0, 1\], got 1.5"),
        ({"behaviour_epsilon": True}, "behaviour_epsilon must be in"),
    ],
)
def test_each_bad_field_is_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        KernelFQIConfig(**fields)  # type: ignore[arg-type]


def test_fields_are_normalised_to_tuples_of_floats() -> None:
    cfg = KernelFQIConfig(
        state_intervals=[[0, 1], [-2, 2]],  # type: ignore[arg-type]
        reward_range=[0, 1],  # type: ignore[arg-type]
        betas=[1, 3],  # type: ignore[arg-type]
        behaviour_epsilon=0,
    )
    assert cfg.state_intervals == ((0.0, 1.0), (-2.0, 2.0))
    assert cfg.reward_range == (0.0, 1.0) and cfg.betas == (1.0, 3.0)
    assert type(cfg.behaviour_epsilon) is float
    with pytest.raises(InvalidArgument, match="unknown kernel fqi config key"):
        KernelFQIConfig.from_dict({"gama": 0.5})
    with pytest.raises(InvalidArgument, match="give epsilon or sigma"):
        cfg.replace(sigma=1.0)  # replace checks again


def test_betas_for() -> None:
    assert KernelFQIConfig().betas_for(3) == (DEFAULT_BETA,) * 3
    assert KernelFQIConfig(betas=(1.0, 2.0)).betas_for(2) == (1.0, 2.0)
    with pytest.raises(InvalidArgument, match="the config gives 2 betas for 3 coordinates"):
        KernelFQIConfig(betas=(1.0, 2.0)).betas_for(3)


def test_spec_takes_the_config_fields() -> None:
    cfg = KernelFQIConfig(gamma=0.5, iterations=3, anchor_points=4, lam=0.1, betas=(3.0, 4.0))
    spec = cfg.spec(2)
    assert (spec.gamma, spec.iterations, spec.lam, tuple(spec.betas)) == (0.5, 3, 0.1, (3.0, 4.0))
    assert spec.anchor_total == 16


def test_grid_config_renames_the_1d_keys_and_takes_its_defaults() -> None:
    cfg = grid_config(
        {
            "estimator": "grid",
            "state_interval": [0, 2],
            "beta": 3,
            "grid_points": 21,
            "smoother_bandwidth": 0.1,
            "gamma": 0.5,
        }  # fmt: skip
    )
    assert cfg.state_intervals == ((0.0, 2.0),) and cfg.betas == (3.0,)
    assert (cfg.anchor_points, cfg.gamma, cfg.lam) == (21, 0.5, GRID_DEFAULTS["lam"])
    assert default_config() == grid_config({})
    assert default_config().iterations == GRID_DEFAULTS["iterations"]
    with pytest.raises(InvalidArgument, match="unknown kernel fqi config key"):
        grid_config({"smoother": 0.2})


def test_load_fqi_config_either_form_and_relative_paths(tmp_path: Path) -> None:
    cp = load_fqi_config(CONFIGS / "cartpole-private.toml")
    assert cp.estimator == "kernel" and cp.state_intervals is not None
    assert len(cp.state_intervals) == 4
    (tmp_path / "sub").mkdir()
    f = tmp_path / "sub" / "c.toml"
    f.write_text('estimator = "kernel"\nprior = "p.npz"\nenv_id = "X"\n')
    assert read_fqi_toml(f)["prior"] == str(tmp_path / "sub" / "p.npz")
    assert load_fqi_config(f).prior == str(tmp_path / "sub" / "p.npz")
    f.write_text('prior = "/abs/p.npz"\ngrid_points = 5\n')  # no estimator: the 1-D form
    cfg = load_fqi_config(f)
    assert cfg.prior == "/abs/p.npz" and cfg.anchor_points == 5
    f.write_text('estimator = "forest"\n')
    with pytest.raises(InvalidArgument, match="estimator must be grid or kernel, got 'forest'"):
        load_fqi_config(f)


def test_to_toml_round_trips(tmp_path: Path) -> None:
    cfg = load_fqi_config(CONFIGS / "cartpole-private.toml").replace(gamma=0.6)
    f = tmp_path / "c.toml"
    f.write_text(cfg.to_toml())
    assert load_fqi_config(f) == cfg


def test_plan_kernel() -> None:
    cfg = KernelFQIConfig(epsilon=1.0)
    plan = plan_kernel(cfg, users=500, actions=2, dims=1, reward_range=(0.0, 1.0))
    assert plan.epsilon <= 1.0 + 1e-9 and plan.sigma > 0
    fixed = plan_kernel(
        cfg.replace(epsilon=None, sigma=plan.sigma), users=500, actions=2, dims=1,
        reward_range=(0.0, 1.0),
    )  # fmt: skip
    assert fixed.epsilon == pytest.approx(plan.epsilon)
    more = plan_kernel(cfg, users=5000, actions=2, dims=1, reward_range=(0.0, 1.0))
    assert more.sigma < plan.sigma  # more users, less noise for the same epsilon
    with pytest.raises(InvalidArgument, match="config says actions = 3, but the data has 2"):
        plan_kernel(cfg.replace(actions=3), users=500, actions=2, dims=1, reward_range=(0, 1))
    with pytest.raises(InvalidArgument, match=r"give epsilon \(or sigma\)"):
        plan_kernel(cfg.replace(epsilon=None), users=500, actions=2, dims=1, reward_range=(0, 1))
