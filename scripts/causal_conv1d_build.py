"""Builds causal-conv1d from its source release for this machine's GPU alone, into a directory
that then goes on ``PYTHONPATH``: ``python scripts/causal_conv1d_build.py SDIST TARGET``.

scripts/gpu-check.sh runs it with ``--bundle`` on a GPU machine that cannot download packages
(scripts/gpu-bundle.sh carries the source there). The release's own build compiles eight GPU
architectures, more minutes than a GPU check has; this compiles the same sources with the same
flags for the one architecture torch sees (PyTorch's extension builder, in parallel with ninja).
"""

from __future__ import annotations

import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

# setup.py's nvcc flags (causal-conv1d 1.7), less its list of architectures
NVCC_FLAGS = [
    "-O3",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT162_OPERATORS__",
    "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "--use_fast_math",
    "--threads",
    "4",
]
SOURCES = [
    "causal_conv1d.cpp",
    "causal_conv1d_fwd.cu",
    "causal_conv1d_bwd.cu",
    "causal_conv1d_update.cu",
]


def build(sdist: Path, target: Path) -> None:
    if not torch.cuda.is_available():
        sys.exit("causal_conv1d_build: no CUDA device here")
    major, minor = torch.cuda.get_device_capability()
    os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"  # read by the extension builder
    os.environ.setdefault("MAX_JOBS", str(len(SOURCES)))
    work = Path(tempfile.mkdtemp(prefix="causal-conv1d-"))
    with tarfile.open(sdist) as tar:
        tar.extractall(work, filter="data")
    [source] = work.glob("causal_conv1d-*")
    start = time.monotonic()
    module = load(
        name="causal_conv1d_cuda",
        sources=[str(source / "csrc" / name) for name in SOURCES],
        extra_cflags=["-O3"],
        extra_cuda_cflags=NVCC_FLAGS,
        extra_include_paths=[str(source / "csrc")],
        build_directory=str(work),
    )
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(module.__file__, target / Path(module.__file__).name)
    shutil.copytree(source / "causal_conv1d", target / "causal_conv1d", dirs_exist_ok=True)
    took = time.monotonic() - start
    print(f"causal_conv1d_build: built for sm_{major}{minor} in {took:.0f} s into {target}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    build(Path(sys.argv[1]), Path(sys.argv[2]))
