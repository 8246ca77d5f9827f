"""The d > 1 experiment (qveil.experiments.multid): `--quick` on CartPole-v1 and
Acrobot-v1 with every private return measured through a real server, on a Parquet dataset
streamed shard by shard, and the fraction's bootstrap that pairs episodes across policies."""

from __future__ import annotations

from pathlib import Path

import pytest
from experiment_helpers import read_rows, run_quick

from qveil.cli import main

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def test_multid_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """CartPole-v1 (d = 4) and Acrobot-v1 (d = 6): the non-private, private (each epsilon)
    and random rows of every (env, N), with the fraction of the way from random. Every
    private return is measured through a real server: each release is a distinct release
    id with its own key from OS entropy, served with its own answer log, and the server
    answered exactly the states the episodes visited (CartPole pays 1 per step, so its steps
    are its returns) and logged their noise (each path's value at most once per state: no
    more points than answered states times d). An in-process policy would leave the
    server's counters at zero."""
    run_quick("multid", tmp_path)
    rows = read_rows(tmp_path / "multid.csv")
    assert {r["env"] for r in rows} == {"CartPole-v1", "Acrobot-v1"}
    assert {r["policy"] for r in rows} == {"non-private", "private", "random"}
    private = [r for r in rows if r["policy"] == "private"]
    assert len(private) == 4 * 2
    assert all("fraction" in r for r in rows)
    assert all(r["releases"] == "2" and r["noise"].startswith("the release key") for r in private)
    releases = read_rows(tmp_path / "multid_releases.csv")
    assert len(releases) == 4 * 2 * 2
    assert len({r["release_id"] for r in releases}) == len(releases)
    actions = {"CartPole-v1": 2, "Acrobot-v1": 3}
    dims = {"CartPole-v1": 4, "Acrobot-v1": 6}
    for r in releases:
        assert r["seeded"] == "False" and float(r["served_sigma"]) == float(r["sigma"])
        assert int(r["calls"]) > 0 and int(r["stored_points"]) > 0
        assert int(r["server_values_answered"]) == actions[r["env"]] * int(r["states_sent"])
        assert int(r["server_logged_points"]) == int(r["stored_points"])
        most = actions[r["env"]] * dims[r["env"]] * int(r["states_sent"])
        assert int(r["stored_points"]) <= most
        if r["env"] == "CartPole-v1":
            assert int(r["states_sent"]) == round(float(r["return"]) * int(r["episodes"]))
    assert (tmp_path / "multid.png").stat().st_size > 1000
    out = capsys.readouterr().out
    assert out.count("GetBestActions calls") == len(releases)  # a progress line per release


def test_multid_on_a_parquet_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--dataset FILE.parquet: the plan is the file's env and users (no collection), the fit
    streams it shard by shard with a log line per shard, and the releases are served; with
    --config a config of the file's env (a config of another env is refused before any
    work)."""
    from qveil.experiments import multid
    from qveil.trainer.distributed import Engine, collect_parquet

    data = tmp_path / "cp.parquet"
    collect_parquet(
        "CartPole-v1", 200, 0, str(data), reward_range=(0.0, 1.0),
        engine=Engine(shard_users=100),
    )  # fmt: skip
    out = tmp_path / "out"
    argv = ["experiments", "multid", "--quick", "--dataset", str(data), "--workers", "1"]
    argv += ["--epsilons", "1", "--releases", "1", "--episodes", "2", "--out", str(out)]
    assert main([*argv, "--config", str(CONFIGS / "cartpole-private.toml")]) == 0
    rows = read_rows(out / "multid.csv")
    assert {(r["env"], r["users"]) for r in rows} == {("CartPole-v1", "200")}
    assert {r["policy"] for r in rows} == {"non-private", "private", "random"}
    err = capsys.readouterr().err
    assert "fit shards: shard 2/2 done" in err
    lunar = CONFIGS / "lunarlander-private.toml"
    with pytest.raises(ValueError, match="not of"):
        multid.run(out=tmp_path / "other", dataset=data, config=lunar)
    assert not (tmp_path / "other").exists()


def test_fraction_bootstrap_pairs_episodes() -> None:
    """The fraction's bootstrap over releases and episodes: with every release equal to the
    floor plus half the (ceiling - floor) gap of the same episode, the fraction is 0.5 in
    every replicate (standard error 0), because the episodes are resampled jointly for the
    three policies. Resampling them independently (a wrong implementation) would give a
    positive spread here. With releases that differ, the interval widens and holds 0.5."""
    import numpy as np

    from qveil.experiments.multid import fraction_bootstrap

    rng = np.random.default_rng(0)
    floor = rng.uniform(10, 30, size=12)
    ceiling = floor + rng.uniform(100, 400, size=12)
    same = np.tile(floor + 0.5 * (ceiling - floor), (6, 1))
    b = fraction_bootstrap(same, ceiling, floor, rng=np.random.default_rng(1))
    assert b["fraction"] == pytest.approx(0.5) and b["se"] == pytest.approx(0.0, abs=1e-12)
    spread = same + np.linspace(-60, 60, 6)[:, None]
    b = fraction_bootstrap(spread, ceiling, floor, rng=np.random.default_rng(1))
    assert b["fraction"] == pytest.approx(0.5) and b["se"] > 0.01
    assert b["lo"] < 0.5 < b["hi"]


def test_multid_config_names_the_env(tmp_path: Path) -> None:
    """--config FILE serves FILE's config for its own env_id; a plan of another env is
    refused before any work."""
    from qveil.experiments import multid
    from qveil.experiments.commands.experiments import _multid_config_env

    lunar = CONFIGS / "lunarlander-private.toml"
    assert _multid_config_env(lunar, None) == "LunarLander-v3"
    with pytest.raises(ValueError, match="not of"):
        multid.run(out=tmp_path / "out", plan=[("CartPole-v1", [10])], config=lunar)
    assert not (tmp_path / "out").exists()
