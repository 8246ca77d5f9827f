#!/usr/bin/env bash
# `make demo`: train a private Q-function on LineWalk (a few seconds), serve it on 127.0.0.1
# with the embedded SQLite store, query a few states, restart the server, show that the
# answers are identical (the noise is stored, not redrawn), and print the privacy card.
set -euo pipefail
cd "$(dirname "$0")/.."
QVEIL=.venv/bin/qveil
OUT=demo-out
rm -rf "$OUT"
mkdir -p "$OUT"
SERVER_PID=""
cleanup() { if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then kill -TERM "$SERVER_PID"; wait "$SERVER_PID" || true; fi; }
trap cleanup EXIT

start_server() {
  rm -f "$OUT/port"
  "$QVEIL" serve --bundle "$OUT/bundle" --listen 127.0.0.1:0 --port-file "$OUT/port" \
    2>>"$OUT/server.log" &
  SERVER_PID=$!
  for _ in $(seq 1 300); do [[ -s "$OUT/port" ]] && break; sleep 0.1; done
  [[ -s "$OUT/port" ]] || { echo "server did not start:"; cat "$OUT/server.log"; exit 1; }
  TARGET="127.0.0.1:$(cat "$OUT/port")"
  # NOT_SERVING until bundle and store are verified; the client retries UNAVAILABLE
  for _ in $(seq 1 100); do "$QVEIL" query --target "$TARGET" --card >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "server never became ready:"; cat "$OUT/server.log"; exit 1
}

stop_server() { kill -TERM "$SERVER_PID"; wait "$SERVER_PID"; SERVER_PID=""; }

echo "== 1. train on LineWalk (configs/linewalk-quick.toml, sigma 0.1; seeded for the demo)"
"$QVEIL" train --config configs/linewalk-quick.toml --sigma 0.1 --seed 1 --out "$OUT/bundle" --no-progress

echo
echo "== 2. serve it on 127.0.0.1 (SQLite store beside the bundle: $OUT/qveil-store.sqlite)"
start_server
echo "serving on $TARGET"
STATES=(--state 0.05,0.3,0.5,0.7,0.95)
"$QVEIL" query --target "$TARGET" "${STATES[@]}"
"$QVEIL" query --target "$TARGET" "${STATES[@]}" --json >"$OUT/first.json"
echo "best actions:"
"$QVEIL" query --target "$TARGET" "${STATES[@]}" --best

echo
echo "== 3. restart the server and ask again"
stop_server
start_server
"$QVEIL" query --target "$TARGET" "${STATES[@]}" --json >"$OUT/second.json"
"$QVEIL" query --target "$TARGET" "${STATES[@]}"
if cmp -s "$OUT/first.json" "$OUT/second.json"; then
  echo "identical answers after the restart: every noise value was stored before it was answered"
else
  echo "ANSWERS DIFFER after restart"; diff "$OUT/first.json" "$OUT/second.json"; exit 1
fi

echo
echo "== 4. the public privacy card (no weights, no noise)"
"$QVEIL" query --target "$TARGET" --card
stop_server

echo
echo "== 5. what an honest guarantee costs: the noise each accounting mode needs for (eps=1, delta=1e-5)"
echo "   at the paper's Appendix E.3 settings (computed by the accountant; docs/privacy.md explains)"
for mode in paper gdp output; do
  "$QVEIL" privacy --mode "$mode" --epsilon 1 --delta 1e-5 --json | .venv/bin/python -c '
import json, sys
d = json.load(sys.stdin)
print("   %6s: sigma %9.4g  beta %9.4g  holds %s" % (d["mode"], d["sigma"], d["beta"], d["holds"]))'
done
echo
echo "demo done: bundle, store and logs in $OUT/"
