#!/usr/bin/env bash
# Build .typecheck/qveil: the `qveil` namespace as Python imports it, out of symlinks.
#
# pyproject.toml maps each top-level folder to a part of one namespace (core/ -> qveil,
# server/ -> qveil.server, ...). The editable install resolves that mapping with an import
# hook that static tools cannot follow, so mypy and import-linter read this tree instead:
# one symlink per entry of core/, and one per mapped package. It is rebuilt on every run
# (cheap), so a module added anywhere is seen at once. Nothing is copied.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=.typecheck/qveil
rm -rf .typecheck
mkdir -p "$tree"
for entry in core/*; do
    name=$(basename "$entry")
    [[ $name == __pycache__ ]] && continue
    ln -s "../../$entry" "$tree/$name"
done
# the other parts of the namespace (pyproject.toml [tool.setuptools] package-dir)
for pair in server:server trainer:trainer client:client common:common experiments:experiments \
    v1:proto/qveil/v1 oip:proto/qveil/oip; do
    ln -s "../../${pair#*:}" "$tree/${pair%%:*}"
done
