"""The `qveil` namespace as the repository lays it out (docs/architecture.md): a PEP 420
namespace package with no ``__init__`` in any part, each part nested under its own top-level
folder as it is imported (``server/qveil/server/...``), read from those folders as they are
(the editable install's .pth puts the seven roots on sys.path; no import hook). The one
version: test_version.py."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

import qveil

REPO = Path(__file__).resolve().parents[3]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
ROOTS = ["core", "server", "trainer", "client", "common", "experiments", "proto"]

# each part of the namespace -> the file Python reads it from
PARTS = {
    "qveil.noise": "core/qveil/noise.py",
    "qveil.version": "core/qveil/version.py",
    "qveil.bundle": "core/qveil/bundle/__init__.py",
    "qveil.server": "server/qveil/server/__init__.py",
    "qveil.trainer": "trainer/qveil/trainer/__init__.py",
    "qveil.client": "client/qveil/client/__init__.py",
    "qveil.common": "common/qveil/common/__init__.py",
    "qveil.experiments": "experiments/qveil/experiments/__init__.py",
    "qveil.v1": "proto/qveil/v1/__init__.py",
    "qveil.oip": "proto/qveil/oip/__init__.py",
}


def test_qveil_is_a_namespace_over_every_root() -> None:
    assert qveil.__spec__ is not None and qveil.__spec__.origin is None  # no __init__
    assert not [r for r in ROOTS if (REPO / r / "qveil" / "__init__.py").exists()]
    assert {REPO / r / "qveil" for r in ROOTS} <= {Path(p).resolve() for p in qveil.__path__}


def test_every_part_is_read_from_its_folder() -> None:
    """find_spec reads where each part comes from without running it (no torch here)."""
    for module, path in PARTS.items():
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        assert Path(spec.origin).resolve() == REPO / path, (module, spec.origin)


def test_no_import_hook_maps_qveil() -> None:
    """The roots are plain sys.path entries; no editable finder (setuptools' __editable__
    hooks, the `editables` package) stands in sys.meta_path."""
    assert {str(REPO / r) for r in ROOTS} <= {str(Path(p).resolve()) for p in sys.path if p}
    finders = [f if isinstance(f, type) else type(f) for f in sys.meta_path]
    names = [f"{f.__module__}.{f.__qualname__}" for f in finders]
    assert not [n for n in names if "editable" in n.lower()], names


def test_the_roots_agree_across_pyproject() -> None:
    """The editable install's roots, the wheel's sources and mypy's path name the same seven
    folders, and the wheel and mypy read each one's qveil/."""
    hatch = PYPROJECT["tool"]["hatch"]["build"]
    mypy = PYPROJECT["tool"]["mypy"]
    assert hatch["dev-mode-dirs"] == ROOTS
    assert hatch["targets"]["wheel"]["sources"] == ROOTS
    assert mypy["mypy_path"] == ROOTS
    assert hatch["targets"]["wheel"]["only-include"] == [f"{r}/qveil" for r in ROOTS]
    assert mypy["files"] == [f"{r}/qveil" for r in ROOTS]
