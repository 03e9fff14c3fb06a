"""The decode step's causal conv (``conv_step``, its window time-major) against the same step
written along the window (``bench.state_update``'s reference, the formulation it replaced): the
same output and the same new state in each slot, bit for bit, other slots untouched, for float32
and bfloat16 states, with and without a bias."""

from __future__ import annotations

import pytest
import torch

from bench.state_update import conv_step_along_the_window
from replica.model.conv import conv_step


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [True, False])
def test_the_time_major_conv_step_is_the_step_along_the_window(state_dtype, with_bias):
    gen = torch.Generator().manual_seed(7)
    channels, k, slots_total = 96, 4, 12
    weight = torch.randn(channels, 1, k, generator=gen)
    bias = torch.randn(channels, generator=gen) if with_bias else None
    conv_buf = torch.randn(slots_total, channels, k - 1, generator=gen).to(state_dtype)
    slots = torch.tensor([9, 2, 5, 11, 0])
    x = torch.randn(len(slots), channels, generator=gen)
    ours_buf, theirs_buf = conv_buf.clone(), conv_buf.clone()
    ours = conv_step(x, ours_buf, slots, weight, bias)
    theirs = conv_step_along_the_window(x, theirs_buf, slots, weight, bias)
    assert torch.equal(ours, theirs)
    assert torch.equal(ours_buf, theirs_buf)
    untouched = [s for s in range(slots_total) if s not in slots.tolist()]
    assert torch.equal(ours_buf[untouched], conv_buf[untouched])
    # the window moved by one: the newest input is last, the oldest dropped
    assert torch.equal(ours_buf[slots, :, -1], x.to(state_dtype))
    assert torch.equal(ours_buf[slots, :, :-1], conv_buf[slots, :, 1:])
