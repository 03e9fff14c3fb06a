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
stamp=".venv/.installed$extras"
if [ ! -f "$stamp" ] || [ constraints.txt -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "[setup] installing session-router$extras (pinned by constraints.txt; torch is the CPU build)"
  # (some machines' pip configs add local indexes that pip warns about once per package)
  .venv/bin/pip install --quiet --disable-pip-version-check -c constraints.txt -e ".$extras" \
    2> >(grep -v "Location 'file:.*' is ignored" >&2)
  touch "$stamp"
fi
# checkov (the manifests' security checks) pins versions the project's own conflict with, so it
# gets a venv of its own inside .venv, pinned by constraints-checkov.txt.
if [ -n "$extras" ]; then
  ckv_stamp=".venv/checkov/.installed"
  if [ ! -f "$ckv_stamp" ] || [ constraints-checkov.txt -nt "$ckv_stamp" ]; then
    echo "[setup] installing checkov into .venv/checkov (pinned by constraints-checkov.txt)"
    python3 -m venv .venv/checkov
    .venv/checkov/bin/pip install --quiet --disable-pip-version-check -c constraints-checkov.txt \
      checkov 2> >(grep -v "Location 'file:.*' is ignored" >&2)
    touch "$ckv_stamp"
  fi
  # the OpenAI Agents SDK (a client the front door is tested with) pins websockets below the
  # version Ray's extras need: it too gets a venv of its own, pinned by constraints-agents.txt.
  agents_stamp=".venv/agents/.installed"
  if [ ! -f "$agents_stamp" ] || [ constraints-agents.txt -nt "$agents_stamp" ]; then
    echo "[setup] installing the OpenAI Agents SDK into .venv/agents (constraints-agents.txt)"
    python3 -m venv .venv/agents
    .venv/agents/bin/pip install --quiet --disable-pip-version-check -c constraints-agents.txt \
      openai-agents 2> >(grep -v "Location 'file:.*' is ignored" >&2)
    touch "$agents_stamp"
  fi
fi
