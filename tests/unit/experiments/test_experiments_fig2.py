"""`qveil experiments fig2 --quick` (Fig. 2 of the paper: the methods at target epsilons,
the epsilon sweep and the sensitivity sweep) writes its CSV tables and PNG figures."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from experiment_helpers import check_outputs, run_quick


def test_fig2_quick(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    run_quick("fig2", tmp_path, "--workers", "1")
    check_outputs(
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
