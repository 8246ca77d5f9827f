"""The distributions' metadata and what they hold. The repository's pyproject.toml builds
with hatchling, whose build requirement admits only versions that read the license as an
SPDX expression; its wheel merges each part's qveil/ folder into one qveil/ (modules, stubs,
.proto files, the migrations' template, py.typed markers) and nothing else.
client/pyproject.toml (setuptools) applies without a warning and maps its packages to the
parts' folders. What the README's commands write in the repository root is git-ignored."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import warnings
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get("CI", "").lower() == "true"
ROOTS = ["core", "server", "trainer", "client", "common", "experiments", "proto"]


def test_build_requirement_reads_the_license_expression() -> None:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert data["project"]["license"] == "Apache-2.0"
    assert data["build-system"]["build-backend"] == "hatchling.build"
    (hatchling,) = [Requirement(r) for r in data["build-system"]["requires"]]
    assert hatchling.name == "hatchling"
    # license = "SPDX" (PEP 639) needs hatchling >= 1.27; no version below it may be chosen
    assert not any(hatchling.specifier.contains(f"1.{v}.0") for v in range(0, 27))
    assert hatchling.specifier.contains(Version("1.33.0"))


def test_client_metadata_applies_without_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    root = REPO / "client"
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
    # every mapped folder exists and none makes qveil a regular package
    assert dist.package_dir is not None
    for folder in dist.package_dir.values():
        assert (root / folder).is_dir(), folder
    assert not (root / dist.package_dir["qveil"] / "__init__.py").exists()
    assert (root / dist.package_dir["qveil"] / "errors.py").is_file()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """``pip wheel --no-deps .`` of the repository (hatchling from the package index)."""
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    if r.returncode != 0:
        unreachable = any(
            s in r.stderr
            for s in ("No matching distribution", "Could not find a version", "connection")
        )
        if unreachable and not IN_CI:
            pytest.skip(f"pip cannot reach the package index: {r.stderr.strip()[-400:]}")
        raise AssertionError(f"pip wheel . failed:\n{r.stdout}\n{r.stderr}")
    (whl,) = out.glob("qveil-0.1.0-*.whl")
    return zipfile.ZipFile(whl)


def test_wheel_holds_every_part_and_nothing_else(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    assert {n.split("/")[0] for n in names} == {"qveil", "qveil-0.1.0.dist-info"}
    # every file of every part's qveil/ folder, at its place in the one qveil/
    want = {
        "/".join(("qveil", *f.relative_to(REPO / root / "qveil").parts))
        for root in ROOTS
        for f in (REPO / root / "qveil").rglob("*")
        if f.is_file() and "__pycache__" not in f.parts
    }
    assert {n for n in names if n.startswith("qveil/")} == want
    assert "qveil/__init__.py" not in names  # a namespace package
    assert {
        "qveil/noise.py",
        "qveil/keyed.py",
        "qveil/answer.py",
        "qveil/bundle/receipt.py",
        "qveil/server/serving/answer_log.py",
        "qveil/server/migrations/versions/0007_keyed_releases.py",
        "qveil/version.py",
        "qveil/py.typed",
        "qveil/server/protocol/dataplane.py",
        "qveil/server/migrations/script.py.mako",
        "qveil/server/migrations/versions/0001_initial.py",
        "qveil/v1/value_service.proto",
        "qveil/v1/value_service_pb2.pyi",
        "qveil/v1/py.typed",
        "qveil/oip/LICENSE",
        "qveil/oip/README.md",
        "qveil/trainer/train.py",
        "qveil/client/sync.py",
        "qveil/common/serde.py",
        "qveil/experiments/commands/experiments.py",
    } <= names
    meta = wheel.read("qveil-0.1.0.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0" in meta.splitlines()
    entry = wheel.read("qveil-0.1.0.dist-info/entry_points.txt").decode()
    assert "qveil = qveil.cli:main" in entry


def test_readme_outputs_are_git_ignored() -> None:
    """What the README's commands write in the repository root is never offered to commit."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    paths = [
        "users.npz",
        "fqi-bundle/card.json",
        "fqi-bundle/noise.key",  # the release's secret noise key: never offered to commit
        "fqi-bundle/receipt.json",
        "bundle/weights.npz",
        "bundle/noise.key",
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
        [
            "git",
            "check-ignore",
            "--no-index",
            "configs/linewalk-private.toml",
            "client/qveil/client/commands/query.py",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.stdout == ""
