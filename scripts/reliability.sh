#!/usr/bin/env bash
# `make reliability`: the full form of the system-level suite and docs/reliability.md.
#
# Full form (QVEIL_RELIABILITY=full): >= 50 SIGKILLs of the real server under streaming
# clients, three replicas on one PostgreSQL store, a two-minute soak at the measured
# sustainable rate, faults (disk full, read-only database, PostgreSQL backends terminated and,
# with QVEIL_PG_RESTART=1, the machine's PostgreSQL cluster restarted: that disturbs anyone
# else using it, so it is off unless asked for). Every test appends its numbers to a JSON-lines
# file; the report below is built from it, next to the command that produced it.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export QVEIL_RELIABILITY=full
export QVEIL_PG_RESTART="${QVEIL_PG_RESTART:-0}"
RESULTS="$(mktemp -t qveil-reliability.XXXXXX.jsonl)"
export QVEIL_RELIABILITY_RESULTS="$RESULTS"
LOG="$(mktemp -t qveil-reliability.XXXXXX.log)"
start=$(date +%s)
$PY -m pytest -q -p no:cacheprovider -o addopts="-ra --strict-markers" \
    tests/reliability/ tests/integration/test_deploy.py ${PYTEST_ARGS:-} 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
elapsed=$(( $(date +%s) - start ))
summary="$(grep -E '^(=+ )?[0-9]+ (passed|failed)|(passed|failed|skipped|error)( |,).* in [0-9.]+s' "$LOG" | tail -1)"
$PY tests/reliability_helpers.py write-doc --results "$RESULTS" --doc docs/reliability.md \
    --command "make reliability  (QVEIL_PG_RESTART=$QVEIL_PG_RESTART)" \
    --elapsed "$elapsed" --pytest-summary "$summary" --exit-code "$rc"
echo "docs/reliability.md written (pytest exit $rc, ${elapsed}s); raw results: $RESULTS"
exit "$rc"
