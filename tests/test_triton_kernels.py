"""The mixers' calls into the Triton kernels of the ``cuda-kernels`` extra, run on the CPU in
Triton's interpreter (``tests.support.triton_interpreter``): the kernels' own code, as released,
against the PyTorch path they replace. The GPU runs the same and more (tests/gpu/test_kernels.py,
with causal-conv1d and flash-linear-attention's chunk kernel, which the interpreter cannot run).

- mamba-ssm's state update gives the PyTorch step, on the batch's slots only, and rows that share
  a slot (a padded batch's rows on the scratch slot) agree;
- a whole model with mamba-ssm's chunk scan (prefill) and state update (decode) gives the
  PyTorch path's logits and state;
- flash-linear-attention's recurrent step gives the PyTorch gated delta step.
"""

from __future__ import annotations

import pytest
import torch

from replica.model import build_tiny, kernels
from replica.model.delta_rule import gated_delta_step
from replica.model.mamba2 import Mamba2Mixer
from tests.support.mixer_workload import run_workload
from tests.support.triton_interpreter import interpreter


@pytest.fixture(scope="module", autouse=True)
def triton_interpreter():
    with interpreter():
        yield


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_state_update_changes_the_batch_slots_only(state_dtype):
    cfg, model, _ = build_tiny("tiny-nemotron-h")  # two groups of heads
    mixer = next(m for m in model.modules() if isinstance(m, Mamba2Mixer))
    assert mixer.n_groups > 1
    gen = torch.Generator().manual_seed(1)
    conv = torch.randn(9, *cfg.conv_state_shape, generator=gen)
    ssm = torch.randn(9, *cfg.ssm_state_shape, generator=gen).to(state_dtype)
    h = torch.randn(3, cfg.hidden_size, generator=gen)
    slots = torch.tensor([5, 2, 8])
    got_conv, got_ssm = conv.clone(), ssm.clone()
    assert kernels.mamba_ssm(h)
    with torch.no_grad():
        got = mixer.decode(h, got_conv, got_ssm, slots)
        with kernels.disabled():
            assert not kernels.mamba_ssm(h)
            want_conv, want_ssm = conv.clone(), ssm.clone()
            want = mixer.decode(h, want_conv, want_ssm, slots)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_conv, want_conv)
    # the kernel and the PyTorch path both compute in float32 and round the state once
    tol = 1e-5 if state_dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got_ssm.float(), want_ssm.float(), atol=tol, rtol=tol)
    others = [s for s in range(9) if s not in slots.tolist()]
    assert torch.equal(got_ssm[others], ssm[others]), "a slot outside the batch changed"
    assert not torch.equal(got_ssm[slots], ssm[slots])


def test_rows_on_one_slot_agree():
    """A padded batch's padding rows: the same input on the scratch slot. Each must read the
    slot's state before the step (all give the same output, and the slot holds one step's
    update), as the graphs' check of a replay against the eager step needs; an update in place
    in the pool would let a row read what another wrote."""
    cfg, model, _ = build_tiny("tiny-bamba")
    mixer = next(m for m in model.modules() if isinstance(m, Mamba2Mixer))
    gen = torch.Generator().manual_seed(3)
    conv = torch.randn(4, *cfg.conv_state_shape, generator=gen)
    ssm = torch.randn(4, *cfg.ssm_state_shape, generator=gen)
    h = torch.randn(1, cfg.hidden_size, generator=gen)
    with torch.no_grad():
        one_conv, one_ssm = conv.clone(), ssm.clone()
        one = mixer.decode(h, one_conv, one_ssm, torch.tensor([3]))
        rows = mixer.decode(h.expand(4, -1), conv, ssm, torch.tensor([3, 3, 3, 3]))
    for row in rows:
        torch.testing.assert_close(row, one[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ssm, one_ssm, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", ["tiny-bamba", "tiny-nemotron-h"])
def test_a_model_with_mamba_ssm_kernels_matches_the_pytorch_path(name):
    cfg, model, _ = build_tiny(name)
    probe = torch.zeros(1)
    assert kernels.mamba_ssm(probe) and not kernels.causal_conv1d(probe)
    with torch.no_grad():
        got, got_state = run_workload(model, cfg, torch.float32, "cpu", (3, 12, 21), steps=3)
        with kernels.disabled():
            want, want_state = run_workload(model, cfg, torch.float32, "cpu", (3, 12, 21), 3)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for kind, gs, ws in zip(("conv", "ssm"), got_state[:2], want_state[:2]):
        for g, w in zip(gs, ws):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4, msg=kind)


def test_the_gated_deltanet_recurrent_step_matches_the_pytorch_step():
    gen = torch.Generator().manual_seed(2)
    b, h, dk, dv = 3, 2, 16, 8
    q, k = (torch.randn(b, h, dk, generator=gen) for _ in range(2))
    k = torch.nn.functional.normalize(k, dim=-1)
    v = torch.randn(b, h, dv, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(b, h, generator=gen))
    beta = torch.rand(b, h, generator=gen)
    state = torch.randn(b, h, dk, dv, generator=gen)
    got, got_state = kernels.recurrent_gated_delta_rule(q, k, v, g, beta, state.clone())
    want, want_state = gated_delta_step(q, k, v, g, beta, state.clone())
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_state, want_state, atol=1e-5, rtol=1e-5)
