"""Shared by the experiment tests: run ``qveil experiments NAME --quick`` in process and read
the CSV tables it writes."""

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
