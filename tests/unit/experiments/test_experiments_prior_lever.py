"""``qveil experiments prior-lever --quick`` (200 private and 300 public CartPole users,
seconds): the table's rows and columns, the priors' simulators (the shifted pole is another
dynamics: the same seeds give other next states), the advantage form of a prior, and the
reference of the fraction (one non-private per seed, the config's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from experiment_helpers import read_rows, run_quick

from qveil.errors import InvalidArgument
from qveil.experiments import prior_lever as pl
from qveil.trainer.collect import collect


def test_quick_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QVEIL_LEVERS_CACHE", str(tmp_path / "cache"))
    run_quick("prior-lever", tmp_path)
    rows = read_rows(tmp_path / "prior_lever.csv", pl.COLUMNS)
    assert [(r["row"], r["prior"]) for r in rows] == [
        ("config (default 0)", ""),
        ("config + prior", "shifted"),
        ("config + prior", "same"),
        ("config + prior advantage", "shifted"),
        ("config + prior advantage", "same"),
        ("prior alone (greedy)", "shifted"),
        ("prior alone (greedy)", "same"),
    ]
    # one reference per seed: every row's fraction is against the config's non-private
    assert len({(r["non_private"], r["random"]) for r in rows}) == 1
    assert rows[0]["own_non_private"] == rows[0]["non_private"]
    assert {r["sigma"] for r in rows[:5]} == {rows[0]["sigma"]} and float(rows[0]["sigma"]) > 0
    assert all(float(r["sigma"]) == 0.0 and r["releases"] == "0" for r in rows[5:])
    for r in rows:
        assert float(r["return_lo"]) <= float(r["return"]) <= float(r["return_hi"])


def test_the_advantage_prior_keeps_the_preference_at_the_pessimistic_level() -> None:
    p = np.array([[1.0, 1.5], [2.0, 0.5], [3.0, 3.0]])
    adv = pl.advantage(p, 0.0)
    assert np.array_equal(adv, [[0.0, 0.5], [1.5, 0.0], [0.0, 0.0]])
    assert np.array_equal(np.argmax(adv[:2], axis=1), np.argmax(p[:2], axis=1))


def test_the_shifted_simulator_is_another_dynamics() -> None:
    """The same users and seeds under the longer pole: the same first states and actions,
    other next states; an attribute the env lacks is refused."""
    attrs = pl.PRIORS["shifted"][1]
    base = collect("CartPole-v1", 3, 5, reward_range=(0.0, 1.0))
    moved = collect("CartPole-v1", 3, 5, reward_range=(0.0, 1.0), env_attrs=attrs)
    assert np.array_equal(base.s[0], moved.s[0]) and base.a[0] == moved.a[0]
    assert not np.allclose(base.s2[0], moved.s2[0])
    with pytest.raises(InvalidArgument, match="no attribute"):
        collect("CartPole-v1", 1, 0, reward_range=(0.0, 1.0), env_attrs={"pole": 1.0})
