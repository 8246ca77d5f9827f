"""`qveil experiments NAME --quick` writes its CSV and PNG files (every experiment)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from qveil.cli import main


def _check_outputs(out: Path, names: list[str]) -> None:
    for name in names:
        p = out / name
        assert p.is_file() and p.stat().st_size > 0, name
        if name.endswith(".csv"):
            with p.open() as fh:
                rows = list(csv.DictReader(fh))
            assert rows, f"{name} has no rows"
        if name.endswith(".png"):
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bgp16_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "experiments",
                "bgp16",
                "--quick",
                "--seeds",
                "2",
                "--out",
                str(tmp_path),
                "--workers",
                "1",
            ]
        )
        == 0
    )
    _check_outputs(tmp_path, ["bgp16.csv", "bgp16.png"])
    with (tmp_path / "bgp16.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    # 2 runs x 2 starts x 3 sizes x 2 features x (2 + 2 x 2) methods
    assert len(rows) == 2 * 2 * 3 * 2 * 6
    assert {r["method"] for r in rows} == {"LSW", "LSL", "DP-LSW", "DP-LSL"}
    assert "bgp16: done" in capsys.readouterr().out


def test_theory_quick(tmp_path: Path) -> None:
    assert main(["experiments", "theory", "--quick", "--out", str(tmp_path), "--workers", "1"]) == 0
    _check_outputs(
        tmp_path, [f"theory_{n}.{e}" for n in ("lemma8", "prop10", "prop9") for e in ("csv", "png")]
    )


def test_fig1_quick(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    assert main(["experiments", "fig1", "--quick", "--out", str(tmp_path), "--workers", "1"]) == 0
    _check_outputs(tmp_path, ["fig1_curves.csv", "fig1_summary.csv", "fig1.png"])


def test_fig2_quick(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    assert main(["experiments", "fig2", "--quick", "--out", str(tmp_path), "--workers", "1"]) == 0
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
