"""One version, qveil.version.__version__: the distribution's, and the client
distribution's."""

from __future__ import annotations

import tomllib
from pathlib import Path

from qveil.version import __version__

REPO = Path(__file__).resolve().parents[3]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_version_is_the_distributions() -> None:
    assert __version__ == PYPROJECT["project"]["version"]
    client = tomllib.loads((REPO / "client" / "pyproject.toml").read_text())
    assert client["project"]["version"] == __version__
