"""The experiments' shared helpers (qveil.experiments._util): the worker count, a map in
order (in this process, or in spawned worker processes), CSV tables and the mean with its
standard error."""

from __future__ import annotations

import csv
import math
import operator
from pathlib import Path

import pytest

from qveil.experiments._util import (
    default_workers,
    mean_se,
    progress_map,
    write_csv,
    write_table_and_plot,
)


def test_default_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QVEIL_EXPERIMENT_WORKERS", "3")
    assert default_workers() == 3
    monkeypatch.setenv("QVEIL_EXPERIMENT_WORKERS", "0")
    assert default_workers() == 1
    monkeypatch.delenv("QVEIL_EXPERIMENT_WORKERS")
    assert 1 <= default_workers() <= 4


def test_progress_map_keeps_the_order_of_the_jobs() -> None:
    jobs = [(i, i + 1) for i in range(6)]
    assert progress_map(operator.mul, jobs) == [i * (i + 1) for i in range(6)]
    # two spawned worker processes: the same results, in the jobs' order
    assert progress_map(operator.mul, jobs, workers=2) == [i * (i + 1) for i in range(6)]
    assert progress_map(operator.mul, [], workers=2) == []


def test_write_csv_columns(tmp_path: Path) -> None:
    rows = [{"a": 1, "b": 2}, {"b": 3, "c": 4}]
    path = write_csv(tmp_path / "sub" / "t.csv", rows)  # the folder is created
    with path.open() as fh:
        got = list(csv.reader(fh))
    assert got == [["a", "b", "c"], ["1", "2", ""], ["", "3", "4"]]  # the union of keys, in order
    write_csv(tmp_path / "u.csv", rows, fields=["c", "a"])  # given columns; the rest left out
    assert (tmp_path / "u.csv").read_text().splitlines() == ["c,a", ",1", "4,"]


def test_write_table_and_plot(tmp_path: Path) -> None:
    drawn: list[tuple[int, Path]] = []

    def plot(rows: list[dict[str, object]], png: Path) -> None:
        drawn.append((len(rows), png))
        png.write_bytes(b"png")

    out = write_table_and_plot(tmp_path, "fig", [{"x": 1}, {"x": 2}], plot)
    assert out == {"csv": tmp_path / "fig.csv", "png": tmp_path / "fig.png"}
    assert drawn == [(2, tmp_path / "fig.png")] and out["csv"].read_text() == "x\n1\n2\n"


def test_mean_se() -> None:
    assert mean_se([2.0]) == (2.0, 0.0)
    mean, se = mean_se([1.0, 2.0, 3.0, 6.0])
    assert mean == 3.0 and se == pytest.approx(math.sqrt(14 / 3) / 2)
