#!/usr/bin/env bash
# Generate the committed protobuf/gRPC stubs of proto/qveil/v1 (package qveil.v1) and of
# proto/qveil/oip (the vendored Open Inference Protocol, package `inference`).
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
PKGS=(qveil/v1 qveil/oip)

mode=write
if [[ "${1:-}" == "--check" ]]; then mode=check; elif [[ -n "${1:-}" ]]; then
  echo "usage: $0 [--check]" >&2; exit 2
fi

generate() {  # $1 = output root (gets qveil/v1/...), $2 = package folder (qveil/v1)
  "$PY" -m grpc_tools.protoc -Iproto \
    --python_out="$1" --grpc_python_out="$1" \
    --plugin=protoc-gen-mypy="$VENV/bin/protoc-gen-mypy" --mypy_out=quiet:"$1" \
    --plugin=protoc-gen-mypy_grpc="$VENV/bin/protoc-gen-mypy_grpc" --mypy_grpc_out=quiet:"$1" \
    proto/"$2"/*.proto
}

generated() {  # list generated files under $1, relative
  (cd "$1" && ls -1 ./*_pb2.py ./*_pb2_grpc.py ./*_pb2.pyi ./*_pb2_grpc.pyi 2>/dev/null | sort)
}

if [[ "$mode" == write ]]; then
  for pkg in "${PKGS[@]}"; do
    out="proto/$pkg"
    rm -f "$out"/*_pb2.py "$out"/*_pb2_grpc.py "$out"/*_pb2.pyi "$out"/*_pb2_grpc.pyi
    generate proto "$pkg"
    touch "$out/py.typed"
    echo "generated $pkg: $(generated "$out" | tr '\n' ' ')"
  done
  exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
status=0
for pkg in "${PKGS[@]}"; do
  out="proto/$pkg"
  generate "$tmp" "$pkg"
  if ! diff <(generated "$tmp/$pkg") <(generated "$out") >/dev/null; then
    echo "proto-check: the set of generated files of $pkg differs:" >&2
    diff <(generated "$tmp/$pkg") <(generated "$out") >&2 || true
    status=1
  fi
  for f in $(generated "$tmp/$pkg"); do
    if ! diff -u "$out/$f" "$tmp/$pkg/$f" >&2; then status=1; fi
  done
done
if [[ $status -ne 0 ]]; then
  echo "proto-check: committed stubs drift from proto/qveil/*/*.proto; run 'make proto'" >&2
else
  echo "proto-check: stubs up to date"
fi
exit $status
