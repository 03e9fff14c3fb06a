#!/usr/bin/env bash
# Sets everything up (Python packages and the Debian prometheus package) and runs the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev --system
# the slowest tests are listed at the end: the whole run is kept well under 30 min on 2 cores
# two workers, each test module whole on one (its servers start once): the suite waits on
# processes and clocks about half its time
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=20 "$@"
