#!/usr/bin/env bash
# Sets everything up (Python packages and the Debian prometheus package) and runs the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev --system
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
