"""`qveil experiments`: bgp16 and theory --quick write their CSV and PNG files, the multid
flags, bad arguments exit 2, and every experiment prints its help (fig1, fig2, multid and
utility: their own test files)."""

from __future__ import annotations

from pathlib import Path

import pytest
from experiment_helpers import check_outputs, read_rows, run_quick

from qveil.cli import main
from qveil.experiments.commands.experiments import EXPERIMENTS


def test_bgp16_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_quick("bgp16", tmp_path, "--seeds", "2", "--workers", "1")
    check_outputs(tmp_path, ["bgp16.csv", "bgp16.png"])
    rows = read_rows(tmp_path / "bgp16.csv")
    # 2 runs x 2 starts x 3 sizes x 2 features x (2 + 2 x 2) methods
    assert len(rows) == 2 * 2 * 3 * 2 * 6
    assert {r["method"] for r in rows} == {"LSW", "LSL", "DP-LSW", "DP-LSL"}
    assert "bgp16: done" in capsys.readouterr().out


def test_theory_quick(tmp_path: Path) -> None:
    run_quick("theory", tmp_path, "--workers", "1")
    check_outputs(
        tmp_path, [f"theory_{n}.{e}" for n in ("lemma8", "prop10", "prop9") for e in ("csv", "png")]
    )


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
