#!/usr/bin/env bash
# Generate the committed protobuf/gRPC stubs of proto/qveil/v1 (package qveil.v1).
#   bash scripts/gen_proto.sh          regenerate in place (`make proto`)
#   bash scripts/gen_proto.sh --check  regenerate into a temp dir and diff; non-zero on drift
#                                      (`make proto-check`, part of `make check`)
# The stubs (*_pb2.py, *_pb2_grpc.py and mypy-protobuf *.pyi) are committed and never edited
# by hand; they are generated with the venv's grpcio-tools, so its version is part of the
# output (regenerate after upgrading grpcio-tools).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
OUT_PKG=proto/qveil/v1

mode=write
if [[ "${1:-}" == "--check" ]]; then mode=check; elif [[ -n "${1:-}" ]]; then
  echo "usage: $0 [--check]" >&2; exit 2
fi

generate() {  # $1 = output root (gets qveil/v1/...)
  "$PY" -m grpc_tools.protoc -Iproto \
    --python_out="$1" --grpc_python_out="$1" \
    --plugin=protoc-gen-mypy="$VENV/bin/protoc-gen-mypy" --mypy_out=quiet:"$1" \
    --plugin=protoc-gen-mypy_grpc="$VENV/bin/protoc-gen-mypy_grpc" --mypy_grpc_out=quiet:"$1" \
    "$OUT_PKG"/*.proto
}

generated() {  # list generated files under $1, relative
  (cd "$1" && ls -1 ./*_pb2.py ./*_pb2_grpc.py ./*_pb2.pyi ./*_pb2_grpc.pyi 2>/dev/null | sort)
}

if [[ "$mode" == write ]]; then
  rm -f "$OUT_PKG"/*_pb2.py "$OUT_PKG"/*_pb2_grpc.py "$OUT_PKG"/*_pb2.pyi "$OUT_PKG"/*_pb2_grpc.pyi
  generate proto
  touch "$OUT_PKG/py.typed"
  echo "generated: $(generated "$OUT_PKG" | tr '\n' ' ')"
  exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
generate "$tmp"
status=0
if ! diff <(generated "$tmp/qveil/v1") <(generated "$OUT_PKG") >/dev/null; then
  echo "proto-check: the set of generated files differs:" >&2
  diff <(generated "$tmp/qveil/v1") <(generated "$OUT_PKG") >&2 || true
  status=1
fi
for f in $(generated "$tmp/qveil/v1"); do
  if ! diff -u "$OUT_PKG/$f" "$tmp/qveil/v1/$f" >&2; then status=1; fi
done
if [[ $status -ne 0 ]]; then
  echo "proto-check: committed stubs drift from proto/qveil/v1/*.proto; run 'make proto'" >&2
else
  echo "proto-check: stubs up to date"
fi
exit $status
