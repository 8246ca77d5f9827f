"""TrainConfig: TOML round trip, the shipped configs, and bad configs refused clearly by
``qveil train`` without writing anything."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from server_helpers import ensure_population

from qveil.cli import main
from qveil.errors import InvalidArgument
from qveil.trainer.config import TrainConfig, to_toml

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "configs"


class _Env(gym.Env[Any, Any]):
    def __init__(self, obs: gym.Space[Any], act: gym.Space[Any]) -> None:
        self.observation_space = obs
        self.action_space = act


for _id, _obs, _act in [
    ("qveil_test/Unbounded-v0", gym.spaces.Box(-np.inf, np.inf, (1,)), gym.spaces.Discrete(2)),
    ("qveil_test/TwoD-v0", gym.spaces.Box(0.0, 1.0, (2,)), gym.spaces.Discrete(2)),
    ("qveil_test/Continuous-v0", gym.spaces.Box(0.0, 1.0, (1,)), gym.spaces.Box(-1, 1, (1,))),
]:
    if _id not in gym.registry:
        gym.register(_id, entry_point=lambda o=_obs, a=_act, **kw: _Env(o, a))


def test_docstring_per_field_and_frozen_keyword_only() -> None:
    src = (ROOT / "trainer" / "qveil" / "trainer" / "config.py").read_text()
    for f in dataclasses.fields(TrainConfig):
        i = src.index(f"    {f.name}: ")
        assert '"""' in src[i : i + 300].split("\n", 2)[1], f"field {f.name} has no docstring"
    cfg = TrainConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.samples = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        TrainConfig("qveil/LineWalk-v0")  # type: ignore[misc]


@pytest.mark.parametrize("name", ["linewalk.toml", "linewalk-dqn.toml", "linewalk-quick.toml"])
def test_shipped_configs_load_and_round_trip(name: str, tmp_path: Path) -> None:
    cfg = TrainConfig.from_toml(CONFIGS / name)
    (tmp_path / "c.toml").write_text(to_toml(cfg))
    assert TrainConfig.from_toml(tmp_path / "c.toml") == cfg


def test_paper_settings_in_linewalk_toml() -> None:
    cfg = TrainConfig.from_toml(CONFIGS / "linewalk.toml")
    assert (cfg.samples, cfg.batch_size, cfg.lr, cfg.k, cfg.lipschitz) == (5000, 64, 3e-4, 23, 4)
    assert not cfg.replay and cfg.optimizer == "sgd" and cfg.plain_sgd
    assert cfg.iterations == 78 and cfg.resets == 78 and cfg.planned_updates == 78
    dqn = TrainConfig.from_toml(CONFIGS / "linewalk-dqn.toml")
    assert dqn.samples == 5000 and dqn.replay and dqn.optimizer == "rmsprop"
    assert dqn.reset_period == 50  # a new path every 50-step episode, as in dpql.py
    assert not dqn.plain_sgd and len(dqn.sgd_deviations()) == 3


BAD = [
    ({"sigma": -0.1}, "sigma=-0.1: must be >= 0"),
    ({"batch_size": 600, "samples": 500}, "batch_size B=600 is larger than samples T=500"),
    ({"resets": 7}, "resets J=7 does not divide the 78 iterations"),
    ({"resets": 100}, "resets J=100 exceeds the 78 iterations"),
    ({"gamma": 1.0}, "gamma=1.0: must be < 1"),
    ({"optimizer": "lbfgs"}, "optimizer='lbfgs': must be one of sgd, rmsprop, adam"),
    ({"reward_range": [1.0, 0.0]}, "reward_range"),
]


@pytest.mark.parametrize(("change", "message"), BAD)
def test_bad_values_refused(change: dict[str, Any], message: str) -> None:
    base = TrainConfig.from_toml(CONFIGS / "linewalk.toml").to_dict()
    with pytest.raises(
        InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        TrainConfig.from_mapping({**base, **change}).validate()


def test_unknown_key_refused(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text("samples = 100\nbatchsize = 10\n")
    with pytest.raises(InvalidArgument, match="unknown key.*batchsize"):
        TrainConfig.from_toml(tmp_path / "c.toml")


def _write(tmp_path: Path, **change: Any) -> Path:
    cfg = dataclasses.replace(TrainConfig.from_toml(CONFIGS / "linewalk-quick.toml"), **change)
    p = tmp_path / "bad.toml"
    p.write_text(to_toml(cfg))
    return p


@pytest.mark.parametrize(
    ("change", "args", "message"),
    [
        ({}, ["--sigma", "-1"], "sigma=-1.0: must be >= 0"),
        ({"batch_size": 2000}, ["--sigma", "0.1"], "larger than samples T=1000"),
        ({"env_id": "NoSuchEnv-v9"}, ["--sigma", "0.1"], "unknown environment 'NoSuchEnv-v9'"),
        ({"env_id": "qveil_test/TwoD-v0", "env_kwargs": {}}, ["--sigma", "0.1"], "needs a 1-D Box"),
        (
            {"env_id": "qveil_test/Unbounded-v0", "env_kwargs": {}},
            ["--sigma", "0.1"],
            "unbounded state",
        ),
        (
            {"env_id": "qveil_test/Continuous-v0", "env_kwargs": {}},
            ["--sigma", "0.1"],
            "needs Discrete actions",
        ),
        ({"resets": 3}, ["--sigma", "0.1"], "resets J=3 does not divide the 1000 iterations"),
        ({}, [], "give --sigma S or --epsilon E"),
    ],
)
def test_cli_bad_config_fails_clearly_and_writes_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: dict[str, Any],
    args: list[str],
    message: str,
) -> None:
    cfg_path = _write(tmp_path, **change)
    out = tmp_path / "bundle"
    argv = ["train", "--config", str(cfg_path), "--out", str(out), "--no-progress", *args]
    rc = main([*argv, *ensure_population()])
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml"]  # no temp dir left


def test_cli_refuses_existing_bundle_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "b"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    rc = main(
        [
            "train",
            *ensure_population(),
            "--config",
            str(CONFIGS / "linewalk-quick.toml"),
            "--out",
            str(out),
            "--sigma",
            "0.1",
            "--no-progress",
        ]
    )
    assert rc == 2 and "already exists" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
