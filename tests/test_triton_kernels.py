"""The mixers' calls into the Triton kernels of the ``cuda-kernels`` extra, run on the CPU in
Triton's interpreter (``tests.support.triton_interpreter``): the kernels' own code, as released,
against the PyTorch path they replace. The GPU runs the same and more (tests/gpu/test_kernels.py,
with causal-conv1d and flash-linear-attention's chunk kernel, which the interpreter cannot run).

- mamba-ssm's state update, in place in the pool, gives the PyTorch step, on the batch's slots
  only, and a padded batch's inert rows on the scratch slot leave its state and agree;
- a whole model with mamba-ssm's chunk scan (prefill) and state update (decode) gives the
  PyTorch path's logits and state;
- an engine on those kernels gives the same tokens and state with its decode batches padded;
- flash-linear-attention's recurrent step, in place in the pool, gives the PyTorch gated delta
  step, and inert rows on one slot leave it.
"""

from __future__ import annotations

import pytest
import torch

from replica.api import SamplingParams
from replica.config import PoolConfig
from replica.model import build_tiny, kernels
from replica.model.mamba2 import Mamba2Mixer
from tests.support.delta_step_check import check_gated_delta_step_in_place
from tests.support.engine import (
    assert_same_state,
    close_and_check,
    greedy,
    make_engine,
    run_batch,
    session_state,
    token_ids,
)
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


def test_inert_rows_on_one_slot_leave_its_state_and_agree():
    """A padded batch's padding rows: the same input on the scratch slot, marked inert. The
    kernel updates the pool in place, row by row, so each must write back exactly what it read:
    the slot's SSM state stays bit for bit, every padding row gives the same output, and the
    real rows beside them get the PyTorch path's results. Unmarked, the same rows in place read
    what another wrote (the failure the mark prevents: the graphs' check of a replay against
    the eager step would see it)."""
    cfg, model, _ = build_tiny("tiny-bamba")
    mixer = next(m for m in model.modules() if isinstance(m, Mamba2Mixer))
    gen = torch.Generator().manual_seed(3)
    conv = torch.randn(6, *cfg.conv_state_shape, generator=gen)
    ssm = torch.randn(6, *cfg.ssm_state_shape, generator=gen)
    h = torch.randn(3, cfg.hidden_size, generator=gen)
    h = torch.cat([h[:2], h[2:].expand(3, -1)])  # two real rows, three padding rows
    slots = torch.tensor([1, 4, 5, 5, 5])
    inert = torch.tensor([False, False, True, True, True])
    assert kernels.mamba_ssm(h)
    with torch.no_grad():
        got_conv, got_ssm = conv.clone(), ssm.clone()
        got = mixer.decode(h, got_conv, got_ssm, slots, inert=inert)
        with kernels.disabled():
            want_conv, want_ssm = conv.clone(), ssm.clone()
            want = mixer.decode(h, want_conv, want_ssm, slots, inert=inert)
        racing_ssm = ssm.clone()
        racing = mixer.decode(h, conv.clone(), racing_ssm, slots)
    assert torch.equal(got_ssm[5], ssm[5]) and torch.equal(want_ssm[5], ssm[5])
    assert all(torch.equal(row, got[2]) for row in got[3:])
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_ssm, want_ssm)
    torch.testing.assert_close(got_conv, want_conv)
    assert not torch.equal(racing_ssm[5], ssm[5])
    assert not torch.equal(racing[3], racing[2]), "unmarked rows in place agreed"


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


@pytest.mark.parametrize("name", ["tiny-bamba", "tiny-qwen3-next"])
def test_a_padded_engine_on_the_kernels_gives_the_unpadded_tokens_and_state(name):
    """The engine's steps with the kernels updating the pool in place (mamba-ssm's; for the
    gated DeltaNet flash-linear-attention's step): padded (as CUDA graphs replay) they give
    every turn the unpadded steps' tokens and state, leave the scratch slot's temporal state as
    it was, and every slot comes back."""
    pools = PoolConfig(max_sessions=4, kv_tokens=1024, max_context=256, page_size=16)
    results = []
    for pad in (False, True):
        engine = make_engine(pools, build_tiny(name, seed=0), pad_decode=pad)
        scratch = engine.pool.mamba_pool.scratch_slot
        before = [buf[scratch].clone() for buf in engine.pool.buffers.ssm]
        turns = {
            "a": (token_ids(12, 1), greedy(7)),
            "b": (token_ids(5, 2), SamplingParams(max_new_tokens=3, temperature=0.9, seed=3)),
            "c": (token_ids(20, 3), greedy(5)),
        }
        for sid in turns:
            engine.open_session(sid)
        tokens = run_batch(engine, turns)  # 3 rows (padded to 4), then 2, then 1
        results.append((tokens, {sid: session_state(engine, sid) for sid in turns}))
        assert all(torch.equal(buf[scratch], b) for buf, b in zip(engine.pool.buffers.ssm, before))
        close_and_check(engine)
    (want, want_states), (got, got_states) = results
    assert got == want
    for sid, state in got_states.items():
        assert_same_state(state, want_states[sid])


def test_the_gated_deltanet_step_in_place_matches_the_pytorch_step():
    """flash-linear-attention's recurrent step on the pool, by slot (the shared check)."""
    check_gated_delta_step_in_place("cpu", heads=2, dk=16, dv=8, tol=1e-5)
