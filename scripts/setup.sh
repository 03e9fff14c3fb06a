#!/usr/bin/env bash
# Sets up .venv with the project and its pinned dependencies (constraints.txt). Idempotent.
# Usage: scripts/setup.sh [--dev] [--system]
#   --dev     also install the test dependencies (pytest, hypothesis, transformers, ...)
#   --system  also install the Debian packages the tests need (prometheus for promtool)
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
for arg in "$@"; do
  case "$arg" in
    --dev) extras="[dev]" ;;
    --system) bash .ci/install-system.sh ;;
    *) echo "unknown option $arg" >&2; exit 2 ;;
  esac
done
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  python3 -m venv .venv
fi
# pip: --no-compile leaves byte-compiling to the first import (only what runs is compiled);
# some machines' pip configs add local indexes that pip warns about once per package.
pip_install() {  # VENV CONSTRAINTS ARGS...
  local venv="$1" constraints="$2"
  shift 2
  "$venv/bin/pip" install --quiet --no-compile --disable-pip-version-check -c "$constraints" "$@" \
    2> >(grep -v "Location 'file:.*' is ignored" >&2)
}

install_project() {
  local stamp=".venv/.installed$extras"
  if [ ! -f "$stamp" ] || [ constraints.txt -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "[setup] installing session-router$extras (pinned by constraints.txt; torch is the CPU build)"
    pip_install .venv constraints.txt -e ".$extras"
    touch "$stamp"
  fi
}

# A tool whose pins conflict with the project's gets a venv of its own inside .venv:
# checkov (the manifests' security checks), and the OpenAI Agents SDK (a client the front door
# is tested with; it pins websockets below the version Ray's extras need).
install_tool() {  # NAME PACKAGE CONSTRAINTS
  local venv=".venv/$1" package="$2" constraints="$3"
  if [ ! -f "$venv/.installed" ] || [ "$constraints" -nt "$venv/.installed" ]; then
    echo "[setup] installing $package into $venv (pinned by $constraints)"
    python3 -m venv "$venv"
    pip_install "$venv" "$constraints" "$package"
    touch "$venv/.installed"
  fi
}

# The three installs run at once (most of their time is downloading and unpacking).
pids=()
install_project & pids+=($!)
if [ -n "$extras" ]; then
  install_tool checkov checkov constraints-checkov.txt & pids+=($!)
  install_tool agents openai-agents constraints-agents.txt & pids+=($!)
fi
failed=0
for pid in "${pids[@]}"; do
  wait "$pid" || failed=1
done
if [ "$failed" -ne 0 ]; then
  echo "[setup] an install failed (see above)" >&2
  exit 1
fi
