#!/usr/bin/env bash
# `make demo`: grows with the project. Today: sample an exact OU noise path and summarise it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
echo "== qveil demo: an exact GP (Ornstein-Uhlenbeck) noise path, 10000 states in random order"
.venv/bin/qveil noise --beta 2222 --sigma 0.5 --points 10000
