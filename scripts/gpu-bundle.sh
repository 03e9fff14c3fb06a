#!/usr/bin/env bash
# Makes gpu-bundle/: what scripts/gpu-check.sh needs on a GPU machine whose Python has PyTorch,
# Triton and transformers but none of the cuda-kernels extra, and that cannot download:
#   python/mamba_ssm, python/fla  the extra's Triton kernels (mamba-ssm's without its CUDA
#                                 extension), as scripts/setup.sh --dev puts them in
#                                 .venv/triton-kernels for the CPU tests;
#   causal_conv1d-*.tar.gz        causal-conv1d's source, built there for its GPU alone
#                                 (scripts/causal_conv1d_build.py).
# Ray is not in it (its wheel alone is over 64 MiB): the GPU check's tests run without it.
# Then, on the GPU machine, from the repository root with gpu-bundle/ beside it:
#   PYTHON=python3 bash scripts/gpu-check.sh --bundle gpu-bundle [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
KERNELS=.venv/triton-kernels
if [ ! -f "$KERNELS/.installed-mamba-ssm-triton" ]; then
  bash scripts/setup.sh --dev
fi
rm -rf gpu-bundle
mkdir -p gpu-bundle/python
cp -r "$KERNELS/mamba_ssm" "$KERNELS/fla" gpu-bundle/python/
CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE .venv/bin/pip download --quiet --disable-pip-version-check \
  -c constraints.txt --no-deps --no-binary :all: --no-build-isolation -d gpu-bundle causal-conv1d \
  2> >(grep -v "Location 'file:.*' is ignored" >&2)
find gpu-bundle -name __pycache__ -prune -exec rm -rf {} +
echo "gpu-bundle: $(du -sh gpu-bundle | cut -f1) ($(find gpu-bundle -type f | wc -l) files)"
