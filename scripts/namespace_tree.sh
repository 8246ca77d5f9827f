#!/usr/bin/env bash
# Build .typecheck/qveil: the `qveil` namespace as Python imports it, out of symlinks.
#
# pyproject.toml maps each top-level folder to a part of one namespace (core/ -> qveil,
# server/ -> qveil.server, ...). The editable install resolves that mapping with an import
# hook that static tools cannot follow, so mypy and import-linter read this tree instead:
# one symlink per entry of core/, and one per other package of the mapping (read from
# pyproject.toml's [tool.setuptools] package-dir). It is rebuilt on every run (cheap), so a
# module or a package added anywhere is seen at once. Nothing is copied.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .typecheck
python3 - <<'PY'
import os
import tomllib
from pathlib import Path

mapping = tomllib.loads(Path("pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
tree = Path(".typecheck")
root = tree / "qveil"
root.mkdir(parents=True)
for entry in sorted(Path(mapping["qveil"]).iterdir()):
    if entry.name != "__pycache__":
        (root / entry.name).symlink_to(os.path.relpath(entry, root))
for package, folder in sorted(mapping.items()):
    if package != "qveil":
        link = tree.joinpath(*package.split("."))
        link.symlink_to(os.path.relpath(folder, link.parent))
PY
