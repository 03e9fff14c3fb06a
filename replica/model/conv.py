"""The depthwise causal conv1d of the recurrent mixers, continuing from a per-slot conv state.

The conv state of a sequence is its last ``k - 1`` conv inputs ``[channels, k - 1]``. Both
functions gather the states of a batch by slot, apply the conv and SiLU, and scatter the new
states back; they use causal-conv1d's kernels on CUDA when installed (see :mod:`kernels`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from replica.model import kernels


def conv_extend(
    x: torch.Tensor,
    lengths: torch.Tensor,
    conv_buf: torch.Tensor,
    slots: torch.Tensor,
    fresh: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """``silu(conv(x))`` of right-padded rows ``x [B, L, C]`` (row ``b``: ``lengths[b]`` real).

    Row ``b`` continues from the state in ``slots[b]``, or from zeros where ``fresh[b]``; its new
    state (the inputs ending at its last real token) is written back. ``weight [C, 1, k]``.
    Outputs at padded positions are meaningless (the conv is causal, so real ones are exact).
    """
    batch, _, channels = x.shape
    k1 = weight.shape[-1] - 1
    prev = conv_buf.index_select(0, slots).to(x.dtype)  # [B, C, k1]
    prev = torch.where(fresh[:, None, None], torch.zeros_like(prev), prev)
    window = torch.cat([prev, x.transpose(1, 2)], dim=-1)  # [B, C, k1 + L]
    # the last k1 inputs of row b end at its last real token: window[:, :, len_b : len_b + k1]
    idx = lengths[:, None] + torch.arange(k1, device=x.device)[None, :]
    conv_buf[slots] = window.gather(2, idx[:, None, :].expand(batch, channels, k1)).to(
        conv_buf.dtype
    )
    window = window.to(weight.dtype)
    if kernels.causal_conv1d(window):
        out = kernels.causal_conv1d_fn(window, weight[:, 0], bias)[..., k1:]
    else:
        out = F.silu(F.conv1d(window, weight, bias, groups=channels))
    return out.transpose(1, 2).to(x.dtype)


def conv_step(
    x: torch.Tensor,
    conv_buf: torch.Tensor,
    slots: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """``silu(conv)`` of one new input per row, ``x [B, C]``; updates each row's slot state."""
    state = conv_buf.index_select(0, slots)
    if kernels.causal_conv1d(x):
        state = state.to(weight.dtype)
        out = kernels.causal_conv1d_update(x.to(weight.dtype), state, weight[:, 0], bias)
        conv_buf[slots] = state.to(conv_buf.dtype)
        return out.to(x.dtype)
    # the window time-major, [B, k, C]: the cat, the shift and the sum run along whole rows of
    # channels (1.5x the speed on the CPU of running them along the k steps, the innermost
    # dimension of the state)
    window = torch.cat([state.to(x.dtype).transpose(1, 2), x[:, None, :]], dim=1)
    # a contiguous source: index_copy_ of it takes half the time of indexing with a strided one
    shifted = window[:, 1:].transpose(1, 2)
    conv_buf.index_copy_(0, slots, shifted.to(conv_buf.dtype).contiguous())
    out = (window.to(weight.dtype) * weight[:, 0].t()).sum(1)
    if bias is not None:
        out = out + bias
    return F.silu(out).to(x.dtype)
