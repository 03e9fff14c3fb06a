"""Qwen3-Next's gated DeltaNet (linear attention), its conv and recurrent state in slot buffers.

State per sequence: the conv state ``[2*key_dim + value_dim, k-1]`` (the last inputs of the
causal conv over queries, keys and values) and the recurrent matrix ``[value_heads, key_head_dim,
value_head_dim]``. :meth:`GatedDeltaNet.extend` runs right-padded chunks with the chunked delta
rule (padding inert: ``g = 0`` and ``beta = 0`` there); :meth:`GatedDeltaNet.decode` one token per
row with the recurrent step. The recurrence runs in float32; on CUDA, flash-linear-attention's
kernels when installed: its chunk kernel for prefill when the model is in half precision, its
recurrent step for decode (the state updated in place by slot) in any.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from replica.model import kernels
from replica.model.config import ModelConfig
from replica.model.conv import conv_extend, conv_step
from replica.model.delta_rule import (
    chunk_gated_delta_rule,
    gated_delta_step,
    gated_delta_step_in_place,
)
from replica.model.layers import GatedRMSNorm
from replica.model.state_rows import LayerRows


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


class GatedDeltaNet(nn.Module):
    """Parameter names follow transformers' ``Qwen3NextGatedDeltaNet``; ``in_proj_qkvz`` and
    ``in_proj_ba`` keep its layout (per key head: q, k, then its value heads' v and z; b, a)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d = cfg.deltanet
        self.cfg = d
        self.ratio = d.num_value_heads // d.num_key_heads
        qkvz = 2 * d.key_dim + 2 * d.value_dim
        self.in_proj_qkvz = nn.Linear(cfg.hidden_size, qkvz, bias=False)
        self.in_proj_ba = nn.Linear(cfg.hidden_size, 2 * d.num_value_heads, bias=False)
        self.conv1d = nn.Conv1d(
            d.conv_dim, d.conv_dim, d.conv_kernel, groups=d.conv_dim, bias=False
        )
        self.dt_bias = nn.Parameter(torch.ones(d.num_value_heads))
        self.A_log = nn.Parameter(torch.zeros(d.num_value_heads))
        self.norm = GatedRMSNorm(d.value_head_dim, d.value_head_dim, cfg.rms_norm_eps, True)
        self.out_proj = nn.Linear(d.value_dim, cfg.hidden_size, bias=False)

    def init_dynamics(self) -> None:
        """Decay rates ``A`` spread over [1, 16] and ``dt_bias = 1``, as transformers draws them
        (deterministically here)."""
        n = self.cfg.num_value_heads
        with torch.no_grad():
            self.A_log.copy_(torch.log(torch.linspace(1.0, 16.0, n)))
            self.dt_bias.fill_(1.0)

    def _inputs(
        self, h: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``h [..., hidden]`` -> conv input ``[..., conv_dim]``, gate ``z [..., hv, dv]``,
        ``beta`` and log decay ``g`` ``[..., hv]`` (float32)."""
        d, r = self.cfg, self.ratio
        prefix = h.shape[:-1]
        qkvz = self.in_proj_qkvz(h).view(*prefix, d.num_key_heads, -1)
        q, k, v, z = qkvz.split(
            [d.key_head_dim, d.key_head_dim, r * d.value_head_dim, r * d.value_head_dim], dim=-1
        )
        b, a = self.in_proj_ba(h).view(*prefix, d.num_key_heads, 2 * r).split([r, r], dim=-1)
        mixed = torch.cat([q.flatten(-2), k.flatten(-2), v.flatten(-2)], dim=-1)
        z = z.reshape(*prefix, d.num_value_heads, d.value_head_dim)
        beta = b.reshape(*prefix, -1).float().sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.reshape(*prefix, -1).float() + self.dt_bias)
        return mixed, z, beta, g

    def _qkv(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Conv output ``[..., conv_dim]`` -> float32 ``q`` (normalised, scaled), ``k``
        (normalised), both expanded to the value heads, and ``v``."""
        d = self.cfg
        prefix = mixed.shape[:-1]
        q, k, v = mixed.float().split([d.key_dim, d.key_dim, d.value_dim], dim=-1)
        q = _l2norm(q.reshape(*prefix, d.num_key_heads, d.key_head_dim)) * d.key_head_dim**-0.5
        k = _l2norm(k.reshape(*prefix, d.num_key_heads, d.key_head_dim))
        if self.ratio > 1:
            q = q.repeat_interleave(self.ratio, dim=-2)
            k = k.repeat_interleave(self.ratio, dim=-2)
        return q, k, v.reshape(*prefix, d.num_value_heads, d.value_head_dim)

    def _out(self, o: torch.Tensor, z: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        o = self.norm(o.to(dtype), z)
        return self.out_proj(o.flatten(-2))

    def extend(
        self,
        h: torch.Tensor,
        conv_buf: torch.Tensor,
        state_buf: torch.Tensor,
        lengths: torch.Tensor,
        slots: torch.Tensor,
        fresh: torch.Tensor,
    ) -> torch.Tensor:
        """Mix right-padded ``h [B, L, hidden]``, as :meth:`Mamba2Mixer.extend` (same contract)."""
        length = h.shape[1]
        mixed, z, beta, g = self._inputs(h)
        mixed = conv_extend(mixed, lengths, conv_buf, slots, fresh, self.conv1d.weight, None)
        q, k, v = self._qkv(mixed)
        real = (torch.arange(length, device=h.device)[None, :] < lengths[:, None])[..., None]
        beta, g = beta * real, g * real  # padding: no write, no decay
        init = state_buf.index_select(0, slots).float()
        init = torch.where(fresh[:, None, None, None], torch.zeros_like(init), init)
        if kernels.fla(h):
            o, final = kernels.chunk_gated_delta_rule(q, k, v, g, beta, init, h.dtype)
        else:
            o, final = chunk_gated_delta_rule(q, k, v, g, beta, self.cfg.chunk_size, init)
        state_buf.index_copy_(0, slots, final.to(state_buf.dtype))
        return self._out(o, z, h.dtype)

    def decode(
        self,
        h: torch.Tensor,
        conv_buf: torch.Tensor,
        state_buf: torch.Tensor,
        slots: torch.Tensor,
        rows: LayerRows | None = None,
        inert: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One token per row of ``h [B, hidden]``, as :meth:`Mamba2Mixer.decode` (same contract,
        ``rows`` and ``inert`` included: an inert row neither decays nor writes the state)."""
        mixed, z, beta, g = self._inputs(h)
        if inert is not None:
            beta, g = beta.masked_fill(inert[:, None], 0.0), g.masked_fill(inert[:, None], 0.0)
        mixed = conv_step(mixed, conv_buf, slots, self.conv1d.weight, None)
        q, k, v = self._qkv(mixed)
        if kernels.fla_step(h):  # in place in the pool, by slot
            o = kernels.gated_delta_step(q, k, v, g, beta, state_buf, slots)
        elif rows is not None:  # CPU float32 state (``StateRows``)
            o = gated_delta_step_in_place(q, k, v, g, beta, rows.views, state_buf, slots)
        else:
            state = state_buf.index_select(0, slots).float()  # a copy, updated in place
            o, state = gated_delta_step(q, k, v, g, beta, state)
            state_buf.index_copy_(0, slots, state.to(state_buf.dtype))
        return self._out(o, z, h.dtype)
