"""The fqi utility experiment (qveil.experiments.utility) end to end: the served LineWalk
config beats the random policy by a margin, Algorithm 1's modes and the chain variant."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from experiment_helpers import check_outputs, read_rows

from qveil.cli import main


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
    check_outputs(
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
