"""``qveil experiments behaviour-target --quick`` (300 MountainCar users of the epsilon-greedy
energy heuristic, seconds): the behaviour policy's goal rate, then rows with the behaviour,
random, non-private and private returns on common episodes, the config on the report seed."""

from __future__ import annotations

from pathlib import Path

import pytest
from experiment_helpers import read_rows, run_quick

from qveil.experiments import behaviour_target as bt


def test_the_behaviour_policy_is_the_heuristic_mixed_with_uniform_actions() -> None:
    seeds = [20_000 + i for i in range(3)]
    greedy = bt.behaviour_returns("mountaincar-energy", 0.0, seeds)
    assert (greedy > -200.0).all()  # the energy heuristic always reaches the goal
    assert (bt.behaviour_returns("random", 0.0, seeds) == -200.0).all()
    assert list(bt.behaviour_returns("mountaincar-energy", 0.3, seeds)) == list(
        bt.behaviour_returns("mountaincar-energy", 0.3, seeds)
    )  # seeded by the episode


def test_quick_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QVEIL_LEVERS_CACHE", str(tmp_path / "cache"))
    run_quick("behaviour-target", tmp_path)
    goal = read_rows(tmp_path / "behaviour_goal.csv")
    assert [float(r["epsilon"]) for r in goal] == [0.0, 0.25]
    assert float(goal[0]["goal"]) == 1.0
    rows = read_rows(tmp_path / "behaviour_target.csv", bt.COLUMNS)
    assert [(r["seed"], r["label"]) for r in rows] == [
        ("1", bt.EXPLORE[0][0]),
        ("1", "config"),
        ("1", bt.PLAN[0][0]),
        ("0", "config"),
    ]
    assert rows[0]["releases"] == "0" and rows[0]["private"] == "nan"
    for r in rows:
        assert r["behaviour"] == "mountaincar-energy (epsilon 0.3)"
        assert float(r["random"]) == -200.0  # uniform actions never reach the goal
    for r in rows[1:]:
        assert float(r["private_lo"]) <= float(r["private"]) <= float(r["private_hi"])
        assert float(r["sigma"]) > 0.0
    assert (tmp_path / "behaviour_target.png").stat().st_size > 5_000
