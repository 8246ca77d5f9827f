"""The distributions' metadata (pyproject.toml and client/pyproject.toml): setuptools
applies both without a warning (the license is an SPDX expression, not the deprecated
table) and their build requirement admits only setuptools versions that read it; what the
README's commands write in the repository root is git-ignored."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("folder", [".", "client"])
def test_metadata_applies_without_warnings(folder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    root = REPO / folder
    data = tomllib.loads((root / "pyproject.toml").read_text())
    assert data["project"]["license"] == "Apache-2.0"
    (setuptools,) = [
        Requirement(r) for r in data["build-system"]["requires"] if r.startswith("setuptools")
    ]
    # license = "SPDX" needs setuptools >= 77; no version below it may be chosen
    assert not any(setuptools.specifier.contains(f"{v}.0") for v in range(60, 77))
    assert setuptools.specifier.contains(Version("80.9.0"))
    monkeypatch.chdir(root)  # setuptools resolves the package folders against it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist = apply_configuration(Distribution(), "pyproject.toml")
    assert dist.metadata.license_expression == "Apache-2.0"


def test_readme_outputs_are_git_ignored() -> None:
    """What the README's commands write in the repository root is never offered to commit."""
    import shutil
    import subprocess

    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    paths = [
        "users.npz",
        "fqi-bundle/card.json",
        "bundle/weights.npz",
        "qveil-store.sqlite",
        "qveil-store.sqlite-wal",
        "qveil-store.sqlite-shm",
        "demo-out/first.json",
    ]
    r = subprocess.run(
        ["git", "check-ignore", "--no-index", *paths],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert sorted(r.stdout.split()) == sorted(paths), r.stdout + r.stderr
    r = subprocess.run(
        ["git", "check-ignore", "--no-index", "configs/linewalk-private.toml", "client/cli.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.stdout == ""
