"""The fused CUDA kernels (mamba-ssm, causal-conv1d, flash-linear-attention) against the PyTorch
path they replace, on the same model and inputs: a padded batched prefill (one row continuing
from saved state), then decode steps; logits and the final recurrent state.

Needs a CUDA device and the ``cuda-kernels`` extra; skipped otherwise, saying which. The Mamba2
families run in float32 (triton's dot products may use TF32, hence the tolerance), and again in
bfloat16 with float32 state (``--dtype bfloat16``'s default state); the gated
DeltaNet runs in bfloat16, the only precision flash-linear-attention's chunk kernel takes.
"""

from __future__ import annotations

import pytest
import torch

from replica.model import build_tiny, kernels
from tests.support.mixer_workload import run_workload

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device: the fused kernels run only there"
)

MAMBA2 = ("mamba_ssm", "causal_conv1d")
CASES = {  # built-in -> (packages it needs, model dtype, tolerance)
    "tiny-bamba": (MAMBA2, torch.float32, 1e-2),
    "tiny-granitemoehybrid": (MAMBA2, torch.float32, 1e-2),
    "tiny-nemotron-h": (MAMBA2, torch.float32, 1e-2),
    "tiny-falcon-h1": (MAMBA2, torch.float32, 1e-2),
    "tiny-qwen3-next": (("fla", "causal_conv1d"), torch.bfloat16, 5e-2),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_kernels_match_the_pytorch_path(name):
    _compare(name, *CASES[name])


@pytest.mark.parametrize("name", sorted(n for n, case in CASES.items() if case[0] == MAMBA2))
def test_mamba2_kernels_match_in_bf16_with_float32_state(name):
    """--dtype bfloat16 with the default --state-dtype float32: half-precision activations
    meet float32 conv and SSM state in the kernels."""
    _compare(name, MAMBA2, torch.bfloat16, 5e-2)


def _compare(name: str, packages: tuple[str, ...], dtype: torch.dtype, tol: float) -> None:
    for package in packages:
        pytest.importorskip(package, reason=f"{package} is not installed (the cuda-kernels extra)")
    cfg, model, _ = build_tiny(name)
    model.to("cuda", dtype)
    probe = torch.zeros(1, device="cuda", dtype=dtype)
    recurrent = kernels.fla(probe) if cfg.recurrent_kind == "deltanet" else kernels.mamba_ssm(probe)
    assert recurrent and kernels.causal_conv1d(probe)
    got, got_state = run_workload(model, cfg, dtype, "cuda")
    with kernels.disabled():
        assert not kernels.causal_conv1d(probe)
        want, want_state = run_workload(model, cfg, dtype, "cuda")
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    for kind, gs, ws in zip(("conv", "ssm"), got_state[:2], want_state[:2]):
        for g, w in zip(gs, ws):
            torch.testing.assert_close(g.float(), w.float(), atol=tol, rtol=tol, msg=kind)
