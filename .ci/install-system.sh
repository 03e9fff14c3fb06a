#!/usr/bin/env bash
# Installs the Debian packages the tests need, only when missing; safe to run repeatedly.
#   prometheus: provides promtool (tests/test_prometheus_rules.py) and the prometheus server.
#   redis-server: the GCS's external store in tests/test_gcs_fault_tolerance.py.
# Runs apt-get update at most once, non-interactively. Needs root (uses sudo when not root).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi

missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-system: nothing to install"
  exit 0
fi

echo "install-system: installing ${missing[*]}"
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
command -v promtool >/dev/null
command -v redis-server >/dev/null
