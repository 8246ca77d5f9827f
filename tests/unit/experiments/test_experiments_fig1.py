"""`qveil experiments fig1 --quick` (Fig. 1 of the paper: training curves and the release
per noise scale and reset count) writes its CSV tables and PNG figure."""

from __future__ import annotations

from pathlib import Path

import pytest
from experiment_helpers import check_outputs, run_quick


def test_fig1_quick(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    run_quick("fig1", tmp_path, "--workers", "1")
    check_outputs(tmp_path, ["fig1_curves.csv", "fig1_summary.csv", "fig1.png"])
