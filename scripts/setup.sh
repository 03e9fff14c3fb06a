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

# The Triton kernels of the cuda-kernels extra (mamba-ssm, flash-linear-attention) with Triton,
# for the tests that run them on the CPU in Triton's interpreter (tests/test_triton_kernels.py).
# They stay out of the venv's packages: only those tests put the directory on sys.path.
# mamba-ssm's package cannot build here (its CUDA extension), so its Python files come from its
# source release, with an __init__ that leaves the extension out (the Triton kernels import
# alone); reading its metadata needs torch, hence after the project. scripts/gpu-bundle.sh
# carries the same files to a GPU machine.
TRITON_KERNELS=.venv/triton-kernels
install_triton() {
  local stamp="$TRITON_KERNELS/.installed-triton"
  if [ ! -f "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
    echo "[setup] installing triton and fla-core into $TRITON_KERNELS (pinned by constraints.txt)"
    mkdir -p "$TRITON_KERNELS"
    pip_install .venv constraints.txt --no-deps --upgrade --target "$TRITON_KERNELS" \
      triton fla-core einops
    touch "$stamp"
  fi
}
install_mamba_ssm_source() {
  local stamp="$TRITON_KERNELS/.installed-mamba-ssm-triton" sdist
  if [ ! -f "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
    echo "[setup] unpacking mamba-ssm's Python files into $TRITON_KERNELS (pinned by constraints.txt)"
    sdist=$(mktemp -d)
    MAMBA_SKIP_CUDA_BUILD=TRUE .venv/bin/pip download --quiet --disable-pip-version-check \
      -c constraints.txt --no-deps --no-binary :all: --no-build-isolation -d "$sdist" mamba-ssm \
      2> >(grep -v "Location 'file:.*' is ignored" >&2)
    tar -xzf "$sdist"/mamba_ssm-*.tar.gz -C "$sdist"
    rm -rf "$TRITON_KERNELS/mamba_ssm"
    cp -r "$sdist"/mamba_ssm-*/mamba_ssm "$TRITON_KERNELS/"
    cat > "$TRITON_KERNELS/mamba_ssm/__init__.py" <<'INIT'
"""mamba-ssm's Triton kernels alone: its own __init__ imports its CUDA extension, which is not
built here (scripts/setup.sh)."""
INIT
    rm -rf "$sdist"
    touch "$stamp"
  fi
}

# The installs run at once (most of their time is downloading and unpacking).
pids=()
install_project & pids+=($!)
if [ -n "$extras" ]; then
  install_tool checkov checkov constraints-checkov.txt & pids+=($!)
  install_tool agents openai-agents constraints-agents.txt & pids+=($!)
  install_triton & pids+=($!)
fi
failed=0
for pid in "${pids[@]}"; do
  wait "$pid" || failed=1
done
if [ "$failed" -ne 0 ]; then
  echo "[setup] an install failed (see above)" >&2
  exit 1
fi
if [ -n "$extras" ]; then
  install_mamba_ssm_source
fi
