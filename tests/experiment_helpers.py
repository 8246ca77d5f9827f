"""Shared by the experiment tests: run ``qveil experiments NAME --quick`` in process, read the
CSV tables it writes and check the files it wrote."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from qveil.cli import main


def run_quick(name: str, out: Path, *extra: str) -> None:
    """``qveil experiments NAME --quick --out OUT [extra]``, which must exit 0."""
    assert main(["experiments", name, "--quick", "--out", str(out), *extra]) == 0


def read_rows(path: Path, columns: Sequence[str] | None = None) -> list[dict[str, str]]:
    """The rows of the CSV table ``path``; with ``columns``, its header must be exactly those."""
    with path.open() as fh:
        rd = csv.DictReader(fh)
        if columns is not None:
            assert tuple(rd.fieldnames or ()) == tuple(columns)
        return list(rd)


def check_outputs(out: Path, names: list[str]) -> None:
    """Each of ``names`` was written in ``out``: a CSV table with rows, a PNG image."""
    for name in names:
        p = out / name
        assert p.is_file() and p.stat().st_size > 0, name
        if name.endswith(".csv"):
            assert read_rows(p), f"{name} has no rows"
        if name.endswith(".png"):
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
