"""Triton's interpreter on the CPU: the ``cuda-kernels`` extra's Triton kernels (mamba-ssm's,
flash-linear-attention's) run on CPU tensors, so the calls the mixers make into them are tested
where there is no GPU. ``scripts/setup.sh --dev`` puts the kernels and Triton in
``.venv/triton-kernels``, apart from the venv's packages; :func:`interpreter` puts them on
``sys.path`` for its duration.

mamba-ssm's package there is its Triton modules with an ``__init__`` that leaves its CUDA
extension out (it does not build here), as scripts/gpu-bundle.sh carries it to a GPU machine.
Only what the interpreter lacks is stood in for: ``torch.cuda.device`` of a CPU tensor's device
index (None) enters nothing; an autotuned kernel runs its first configuration (the interpreter
has no benchmarker, and every configuration computes the same values).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from replica.model import kernels

KERNELS = Path(__file__).resolve().parents[2] / ".venv" / "triton-kernels"


@contextlib.contextmanager
def interpreter() -> Iterator[None]:
    """Triton kernels imported from here on run in the interpreter, and the model's mamba-ssm
    kernels serve CPU tensors (:func:`replica.model.kernels.interpreted`)."""
    for package in ("triton", "mamba_ssm", "fla"):
        if not (KERNELS / package).is_dir():
            raise RuntimeError(f"{KERNELS} lacks {package}: run scripts/setup.sh --dev")
    patch = pytest.MonkeyPatch()
    try:
        patch.setenv("TRITON_INTERPRET", "1")  # read when a kernel is defined, at its import
        patch.syspath_prepend(str(KERNELS))
        from triton.runtime.autotuner import Autotuner

        patch.setattr(Autotuner, "prune_configs", lambda self, kwargs: self.configs[:1])
        cuda_device = torch.cuda.device
        patch.setattr(
            torch.cuda,
            "device",
            lambda index: contextlib.nullcontext() if index is None else cuda_device(index),
        )
        with kernels.interpreted():
            yield
    finally:
        patch.undo()
        # what was imported from there leaves with it: transformers' qwen3_next, run later in the
        # same process, would otherwise take flash-linear-attention's kernels for its CPU layers
        for name in [n for n in sys.modules if n.split(".")[0] in ("mamba_ssm", "fla")]:
            del sys.modules[name]
        kernels.forget_modules()
