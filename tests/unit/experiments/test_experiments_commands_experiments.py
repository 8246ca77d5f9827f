"""`qveil experiments NAME --quick` writes its CSV and PNG files (every experiment)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from experiment_helpers import read_rows, run_quick

from qveil.cli import main
from qveil.experiments.commands.experiments import EXPERIMENTS


def _check_outputs(out: Path, names: list[str]) -> None:
    for name in names:
        p = out / name
        assert p.is_file() and p.stat().st_size > 0, name
        if name.endswith(".csv"):
            assert read_rows(p), f"{name} has no rows"
        if name.endswith(".png"):
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bgp16_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_quick("bgp16", tmp_path, "--seeds", "2", "--workers", "1")
    _check_outputs(tmp_path, ["bgp16.csv", "bgp16.png"])
    rows = read_rows(tmp_path / "bgp16.csv")
    # 2 runs x 2 starts x 3 sizes x 2 features x (2 + 2 x 2) methods
    assert len(rows) == 2 * 2 * 3 * 2 * 6
    assert {r["method"] for r in rows} == {"LSW", "LSL", "DP-LSW", "DP-LSL"}
    assert "bgp16: done" in capsys.readouterr().out


def test_theory_quick(tmp_path: Path) -> None:
    run_quick("theory", tmp_path, "--workers", "1")
    _check_outputs(
        tmp_path, [f"theory_{n}.{e}" for n in ("lemma8", "prop10", "prop9") for e in ("csv", "png")]
    )


def test_fig1_quick(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    run_quick("fig1", tmp_path, "--workers", "1")
    _check_outputs(tmp_path, ["fig1_curves.csv", "fig1_summary.csv", "fig1.png"])


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
    streams it shard by shard with a log line per shard, and the releases are served."""
    from qveil.trainer.distributed import Engine, collect_parquet

    data = tmp_path / "cp.parquet"
    collect_parquet(
        "CartPole-v1", 200, 0, str(data), reward_range=(0.0, 1.0),
        engine=Engine(shard_users=100),
    )  # fmt: skip
    out = tmp_path / "out"
    argv = ["experiments", "multid", "--quick", "--dataset", str(data), "--workers", "1"]
    argv += ["--epsilons", "1", "--releases", "1", "--episodes", "2", "--out", str(out)]
    assert main(argv) == 0
    rows = read_rows(out / "multid.csv")
    assert {(r["env"], r["users"]) for r in rows} == {("CartPole-v1", "200")}
    assert {r["policy"] for r in rows} == {"non-private", "private", "random"}
    err = capsys.readouterr().err
    assert "fit shards: shard 2/2 done" in err


def test_multid_plan_is_the_env_asked_for() -> None:
    """--env with --users runs that env alone, also an env outside the default plan (an empty
    plan must never fall back to the default one)."""
    import argparse

    from qveil.experiments.commands.experiments import _multid_kwargs, add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())

    def plan(*argv: str) -> object:
        return _multid_kwargs(parser.parse_args(["experiments", "multid", *argv]))["plan"]

    assert plan("--env", "qveil/Reach16-v0", "--users", "30") == [("qveil/Reach16-v0", [30])]
    assert plan("--env", "Acrobot-v1") == [("Acrobot-v1", [300, 1000])]
    assert plan("--users", "50", "--quick") == [("CartPole-v1", [50]), ("Acrobot-v1", [50])]


def test_multid_config_names_the_env(tmp_path: Path) -> None:
    """--config FILE serves FILE's config for its own env_id; a plan of another env is
    refused before any work."""
    from qveil.experiments import multid
    from qveil.experiments.commands.experiments import _multid_config_env

    lunar = Path(__file__).resolve().parents[3] / "configs" / "lunarlander-private.toml"
    assert _multid_config_env(lunar, None) == "LunarLander-v3"
    with pytest.raises(ValueError, match="not of"):
        multid.run(out=tmp_path / "out", plan=[("CartPole-v1", [10])], config=lunar)
    assert not (tmp_path / "out").exists()


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


def test_fig2_quick(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    run_quick("fig2", tmp_path, "--workers", "1")
    _check_outputs(
        tmp_path,
        [
            "fig2_runs.csv",
            "fig2_summary.csv",
            "fig2.png",
            "fig2_curves.png",
            "fig2_eps_sweep.csv",
            "fig2_eps_sweep.png",
            "fig2_sensitivity.csv",
            "fig2_sensitivity.png",
        ],
    )
    with (tmp_path / "fig2_summary.csv").open() as fh:
        keys = {(r["key"], r["eps"]) for r in csv.DictReader(fh)}
    for key in ("non-private", "paper-sigma", "paper", "gdp", "output", "dp-sgd", "input"):
        assert (key, "0.9") in keys and (key, "0.45") in keys


def test_bad_arguments_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiments", "bgp16", "--quick", "--seeds", "0", "--out", str(tmp_path)]) == 2
    assert "--seeds must be >= 1" in capsys.readouterr().err
    assert (
        main(
            [
                "experiments",
                "fig1",
                "--quick",
                "--config",
                str(tmp_path / "nope.toml"),
                "--out",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert not any(tmp_path.iterdir())  # nothing written
    configs = Path(__file__).resolve().parents[3] / "configs"
    lunar = str(configs / "lunarlander-private.toml")
    acrobot = str(configs / "acrobot-private.toml")
    for argv, message in (
        (["bgp16", "--users", "3"], "apply to multid only"),
        (["multid", "--env", "Pong-v5"], "--env must be one of"),
        (["multid", "--env", "qveil/Reach16-v0"], "give --users"),
        (["multid", "--users", "1e5,x"], "--users must be comma-separated numbers"),
        (["multid", "--epsilons", "1,-2"], "--epsilons must be positive"),
        (["multid", "--releases", "0"], "--releases must be >= 1"),
        (["multid", "--dataset", str(tmp_path / "none.parquet")], "does not exist"),
        (["multid", "--dataset", __file__, "--users", "300"], "not with --env/--users"),
        (["anchors-sweep", "--env", "Acrobot-v1"], "--env must be one of CartPole-v1"),
        (["anchors-sweep", "--users", "300"], "apply to multid only"),
        (["bgp16", "--config", lunar], "applies to fig1, fig2, anchors-sweep and multid only"),
        (["multid", "--env", "CartPole-v1", "--config", lunar], "not of --env"),
        (["anchors-sweep", "--config", acrobot], "--env must be one of"),
        (["anchors-sweep", "--env", "CartPole-v1", "--config", lunar], "not of --env"),
    ):
        assert main(["experiments", *argv, "--quick", "--out", str(tmp_path)]) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert not any(tmp_path.iterdir())


def test_utility_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The fqi utility experiment end to end (LineWalk as served, Algorithm 1's modes, the
    chain variant). The served config (kernel d = 1, user relation, gamma 0.3) must beat the
    random policy at N = 300, eps = 1 by a margin: its release there scores about 20 (sigma
    is ~0.09 of the value scale), random about 11; a release whose noise were not scaled
    down with N, or a policy that ignored the mean, would score at or below random."""
    pytest.importorskip("torch")
    args = ["experiments", "utility", "--quick", "--seeds", "2", "--out", str(tmp_path)]
    assert main([*args, "--workers", "1"]) == 0
    names = ["utility_runs.csv", "utility.csv", "utility.md", "utility.png"]
    _check_outputs(
        tmp_path, [*names, "utility_chain.csv", "utility_chain_runs.csv", "utility_chain.png"]
    )
    with (tmp_path / "utility.csv").open() as fh:
        rd = csv.DictReader(fh)
        cols = set(rd.fieldnames or [])
        rows = list(rd)
    assert {
        "method",
        "variant",
        "relation",
        "gamma",
        "smoother",
        "users",
        "epsilon",
        "delta",
        "seeds",
        "return_mean",
        "return_se",
        "sigma",
        "noise_to_value",
        "holds",
        "refused_without_force",
    } <= cols
    methods = {r["method"] for r in rows}
    assert {"fqi", "non-private FQI", "random", "alg1 paper", "alg1 gdp", "alg1 output"} <= methods
    tuned = next(
        r
        for r in rows
        if r["method"] == "fqi"
        and r["relation"] == "user"
        and float(r["gamma"]) == 0.3
        and r["users"] == "300"
        and float(r["epsilon"]) == 1.0
    )
    rnd = next(r for r in rows if r["method"] == "random" and r["users"] == "300")
    assert tuned["holds"] == "True" and int(tuned["seeds"]) == 2
    assert float(tuned["return_mean"]) > float(rnd["return_mean"]) + 4.0
    chain = read_rows(tmp_path / "utility_chain.csv")
    assert {"DP-FQE (qveil fqi)", "DP-LSW", "DP-LSL"} <= {r["method"] for r in chain}
    assert "utility: done" in capsys.readouterr().out


def test_every_experiment_prints_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    """``qveil experiments --help`` and each experiment's ``--help`` print and exit 0 (a
    help string with a bare '%' once made argparse raise a TypeError)."""
    for argv in [["experiments", "--help"]] + [
        ["experiments", name, "--help"] for name in EXPERIMENTS
    ]:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 0, argv
        assert "usage:" in capsys.readouterr().out
