"""The fused CUDA kernels (mamba-ssm, causal-conv1d, flash-linear-attention) against the PyTorch
path they replace, on the same model and inputs: a padded batched prefill (one row continuing
from saved state), then decode steps; logits and the final recurrent state. And mamba-ssm's state
update in place in the pool with a padded batch's inert rows sharing a slot.

Needs a CUDA device and the ``cuda-kernels`` extra; skipped otherwise, saying which. The Mamba2
families run in float32 (triton's dot products may use TF32, hence the tolerance), and again in
bfloat16 with float32 state (``--dtype bfloat16``'s default state); the gated
DeltaNet runs in bfloat16, the only precision flash-linear-attention's chunk kernel takes.
"""

from __future__ import annotations

import pytest
import torch

from replica.model import build_tiny, kernels
from replica.model.mamba2 import Mamba2Mixer
from tests.support.delta_step_check import check_gated_delta_step_in_place
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


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_inert_rows_in_place_on_one_slot_leave_it_as_it_was(state_dtype):
    """mamba-ssm's state update in place in the pool on the GPU, where a batch's rows run in
    parallel: 5 padding rows on one slot, marked inert, leave its state bit for bit and agree;
    the real rows beside them change their own slots as the PyTorch step does, and no other."""
    pytest.importorskip("mamba_ssm", reason="mamba_ssm is not installed (the cuda-kernels extra)")
    cfg, model, _ = build_tiny("tiny-nemotron-h")
    model.to("cuda")
    mixer = next(m for m in model.modules() if isinstance(m, Mamba2Mixer))
    gen = torch.Generator().manual_seed(4)
    conv = torch.randn(8, *cfg.conv_state_shape, generator=gen).cuda()
    ssm = torch.randn(8, *cfg.ssm_state_shape, generator=gen).to("cuda", state_dtype)
    h = torch.randn(3, cfg.hidden_size, generator=gen).cuda()
    h = torch.cat([h[:2], h[2:].expand(5, -1)])
    slots = torch.tensor([6, 1, 7, 7, 7, 7, 7], device="cuda")
    inert = slots == 7
    with torch.no_grad():
        got_ssm = ssm.clone()
        got = mixer.decode(h, conv.clone(), got_ssm, slots, inert=inert)
        with kernels.disabled():
            want_ssm = ssm.clone()
            want = mixer.decode(h, conv.clone(), want_ssm, slots, inert=inert)
    assert torch.equal(got_ssm[7], ssm[7])
    assert all(torch.equal(row, got[2]) for row in got[3:])
    tol = 1e-2 if state_dtype == torch.float32 else 5e-2  # TF32 dot products; bf16 state
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    torch.testing.assert_close(got_ssm.float(), want_ssm.float(), atol=tol, rtol=tol)
    assert torch.equal(got_ssm[[0, 2, 3, 4, 5]], ssm[[0, 2, 3, 4, 5]])


def test_the_gated_deltanet_step_in_place_leaves_inert_rows_slot():
    """flash-linear-attention's recurrent step in place in the pool on the GPU, where a batch's
    rows run in parallel (``check_gated_delta_step_in_place``)."""
    pytest.importorskip("fla", reason="fla is not installed (the cuda-kernels extra)")
    check_gated_delta_step_in_place("cuda", heads=4, dk=64, dv=32, tol=1e-3)
