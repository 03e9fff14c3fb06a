"""A decode step updates each row's recurrent state where it lives in the pool (``StateRows``):
the same outputs and states as the step on a gathered copy written back, and no other slot
touched. Every recurrent mixer of every family (Mamba2 with one and two groups, gated DeltaNet)."""

from __future__ import annotations

import pytest
import torch

from replica.model import LayerBuffers, load_model
from replica.model.state_rows import StateRows
from tests.models.peers import CONFIGS

SLOTS = [4, 0, 2]  # rows of the batch; slots 1 and 3 belong to sequences not in it


def _mixers(model):
    for layer in model.layers:
        mixer = layer.mamba if layer.mamba is not None else layer.deltanet
        if mixer is not None:
            yield layer.mamba_ordinal, mixer


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_in_place_step_equals_the_step_on_a_copy(name, peer_checkpoint):
    cfg, model, _ = load_model(peer_checkpoint(name))
    gen = torch.Generator().manual_seed(7)
    buffers = LayerBuffers.allocate(cfg, mamba_slots=5, kv_token_slots=8)
    for t in (*buffers.conv, *buffers.ssm):
        t.copy_(torch.randn(t.shape, generator=gen))
    copy = LayerBuffers(*([t.clone() for t in ts] for ts in buffers))
    before = LayerBuffers(*([t.clone() for t in ts] for ts in buffers))
    rows = StateRows.build(buffers.ssm, SLOTS)
    assert rows is not None
    slots = torch.tensor(SLOTS)
    mixers = list(_mixers(model))
    assert mixers
    with torch.inference_mode():
        for step in range(3):  # each step continues from the state the last one left
            h = torch.randn(len(SLOTS), cfg.hidden_size, generator=gen)
            for o, mixer in mixers:
                got = mixer.decode(h, buffers.conv[o], buffers.ssm[o], slots, rows.ssm[o])
                want = mixer.decode(h, copy.conv[o], copy.ssm[o], slots, None)
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=f"step {step}")
                torch.testing.assert_close(buffers.ssm[o], copy.ssm[o], atol=1e-5, rtol=1e-5)
                assert torch.equal(buffers.conv[o], copy.conv[o])
    for o, _ in mixers:
        assert not torch.equal(buffers.ssm[o][SLOTS], before.ssm[o][SLOTS])  # it did change
        for other in (1, 3):
            assert torch.equal(buffers.ssm[o][other], before.ssm[o][other])
            assert torch.equal(buffers.conv[o][other], before.conv[o][other])


def test_no_rows_for_state_that_in_place_updates_would_round():
    """bfloat16 state is updated on a float32 copy and rounded once, never op by op in place."""
    f32 = [torch.zeros(3, 2, 4, 4)]
    assert StateRows.build(f32, [2, 0]) is not None
    assert StateRows.build([t.to(torch.bfloat16) for t in f32], [2, 0]) is None
    assert StateRows.build([], [2, 0]) is None
