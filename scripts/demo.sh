#!/usr/bin/env bash
# `make demo`: a private release that holds, end to end, in well under a minute.
#  1. collect an offline dataset: 1000 LineWalk users, one random-policy episode each;
#  2. train the rigorous fqi mode at epsilon = 1, delta = 1e-5 (user-level relation);
#  3. serve it on 127.0.0.1 (the embedded SQLite store logs what it answers);
#  4. query it, copy the bundle, serve the copy with a store of its own, and show the answers
#     are identical (the noise is a pure function of the release's one key);
#  5. print the public card (holds: True, mode: fqi);
#  6. measure the served policy's return (actions from the server) beside random and
#     non-private FQI, and end on one line of those returns.
set -euo pipefail
cd "$(dirname "$0")/.."
QVEIL=.venv/bin/qveil
OUT=demo-out
rm -rf "$OUT"
mkdir -p "$OUT"
# the demo's own registry (population ledger, receipts): each run starts afresh
export QVEIL_HOME="$PWD/$OUT/qveil-home"
SERVER_PID=""
cleanup() { if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then kill -TERM "$SERVER_PID"; wait "$SERVER_PID" || true; fi; }
trap cleanup EXIT
START=$SECONDS

start_server() {
  rm -f "$OUT/port"
  "$QVEIL" serve --bundle "${1:-$OUT/bundle}" --listen 127.0.0.1:0 --port-file "$OUT/port" \
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

echo "== 1. collect 1000 LineWalk users (one random-policy episode each; the data is seeded, the release noise never is)"
"$QVEIL" dataset collect --env qveil/LineWalk-v0 --users 1000 --seed 1 --out "$OUT/users.npz" --no-progress
"$QVEIL" dataset info "$OUT/users.npz"

echo
echo "== 2. the population's budget (declared once), the privacy plan (public quantities only,"
echo "      before the data is read), then train fqi: its noise key drawn once, its charge receipted"
"$QVEIL" budget create linewalk-users --epsilon 2 --delta 1e-5
# the plan's basis (the paragraph of what the guarantee rests on) is on the card: step 5
"$QVEIL" privacy --mode fqi --config configs/linewalk-private.toml --users 1000 --epsilon 1 --delta 1e-5 \
  | grep -v '^basis '
"$QVEIL" train --mode fqi --dataset "$OUT/users.npz" --config configs/linewalk-private.toml \
  --epsilon 1 --delta 1e-5 --population linewalk-users --out "$OUT/bundle"

echo
echo "== 3. serve it on 127.0.0.1 (answer log: SQLite beside the bundle, $OUT/qveil-store.sqlite)"
start_server
echo "serving on $TARGET"
STATES=(--state 0.05,0.3,0.5,0.7,0.95)
"$QVEIL" query --target "$TARGET" "${STATES[@]}"
"$QVEIL" query --target "$TARGET" "${STATES[@]}" --json >"$OUT/first.json"
echo "best actions:"
"$QVEIL" query --target "$TARGET" "${STATES[@]}" --best

echo
echo "== 4. copy the bundle (cp -a), serve the copy with a new store of its own, ask again"
stop_server
mkdir -p "$OUT/copy"
cp -a "$OUT/bundle" "$OUT/copy/bundle"
start_server "$OUT/copy/bundle"
"$QVEIL" query --target "$TARGET" "${STATES[@]}" --json >"$OUT/second.json"
if cmp -s "$OUT/first.json" "$OUT/second.json"; then
  echo "identical answers from the copy: every answer is a pure function of the release's one key"
else
  echo "ANSWERS DIFFER between the copy and the original"; diff "$OUT/first.json" "$OUT/second.json"; exit 1
fi

echo
echo "== 5. the public privacy card (no weights, no noise, no dataset hash)"
"$QVEIL" query --target "$TARGET" --card

echo
echo "== 6. the served policy's return (actions from the server's GetBestActions), same episodes for each"
"$QVEIL" evaluate --target "$TARGET" --dataset "$OUT/users.npz" --episodes 100 --seed 7 \
  >"$OUT/evaluate.txt"
head -n -1 "$OUT/evaluate.txt"  # the table; its last line, the returns in one line, ends the demo
stop_server

echo
echo "demo done in $((SECONDS - START)) s: dataset, bundle, store and logs in $OUT/"
tail -n 1 "$OUT/evaluate.txt"
