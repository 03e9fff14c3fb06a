#!/usr/bin/env bash
# Sets everything up and runs the demo: a local cluster serving many short sessions.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/session-router demo "$@"
