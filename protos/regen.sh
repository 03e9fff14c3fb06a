#!/usr/bin/env bash
# Regenerates the committed Python modules from protos/session_router.proto:
#   protos/session_router_pb2.py, protos/session_router_pb2.pyi, protos/session_router_pb2_grpc.py
# Usage: protos/regen.sh [OUT_DIR]   (run from anywhere; OUT_DIR defaults to the repo root)
# Uses $PYTHON (default: python) with grpcio-tools installed. tests/test_protos_current.py runs
# this script into a temporary OUT_DIR and fails when its output differs from the committed files.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-.}"
mkdir -p "$out"
"${PYTHON:-python}" -m grpc_tools.protoc -I. \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  protos/session_router.proto
