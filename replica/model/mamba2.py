"""The Mamba2 mixer of Bamba, with its conv and SSM state in externally owned slot buffers.

Two paths. :meth:`Mamba2Mixer.extend` runs a batch of right-padded chunks (one per sequence) with
the chunked SSD algorithm from the state in each sequence's slot: padding is made inert (its
``dt`` is 0, so it adds no input and no decay; the conv is causal) and each row's final conv state
is read at its own last real positions. :meth:`Mamba2Mixer.decode` runs one token of each of a
batch of sequences with the single-step recurrence, gathering and scattering states by slot.
The SSM runs in float32 whatever the model dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from replica.model.config import ModelConfig
from replica.model.layers import GatedRMSNorm
from replica.model.ssd import expand_groups, ssd_chunk_scan


class Mamba2Mixer(nn.Module):
    """Bamba's Mamba2 mixer; parameter names follow transformers' ``BambaMixer``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.mamba_n_heads
        self.head_dim = cfg.mamba_d_head
        self.n_groups = cfg.mamba_n_groups
        self.d_state = cfg.mamba_d_state
        self.d_conv = cfg.mamba_d_conv
        self.chunk_size = cfg.mamba_chunk_size
        self.intermediate = cfg.mamba_intermediate_size
        self.conv_dim = cfg.conv_dim
        lo, hi = cfg.time_step_limit
        self.dt_limit = None if (lo, hi) == (0.0, float("inf")) else (lo, hi)
        if cfg.mamba_expand * cfg.hidden_size != self.intermediate:
            raise ValueError(
                f"mamba_expand * hidden_size ({cfg.mamba_expand * cfg.hidden_size}) must equal "
                f"mamba_n_heads * mamba_d_head ({self.intermediate})"
            )
        proj = self.intermediate + self.conv_dim + self.n_heads
        self.in_proj = nn.Linear(cfg.hidden_size, proj, bias=cfg.mamba_proj_bias)
        self.conv1d = nn.Conv1d(
            self.conv_dim,
            self.conv_dim,
            cfg.mamba_d_conv,
            groups=self.conv_dim,
            bias=cfg.mamba_conv_bias,
        )
        self.dt_bias = nn.Parameter(torch.ones(self.n_heads))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, self.n_heads + 1, dtype=torch.float)))
        self.D = nn.Parameter(torch.ones(self.n_heads))
        self.norm = GatedRMSNorm(
            self.intermediate, self.intermediate // self.n_groups, eps=cfg.rms_norm_eps
        )
        self.out_proj = nn.Linear(self.intermediate, cfg.hidden_size, bias=cfg.mamba_proj_bias)

    def _dt(self, dt: torch.Tensor) -> torch.Tensor:
        dt = F.softplus(dt.float() + self.dt_bias.float())
        if self.dt_limit is not None:
            dt = dt.clamp(self.dt_limit[0], self.dt_limit[1])
        return dt

    def extend(
        self,
        h: torch.Tensor,
        lengths: torch.Tensor,
        conv_buf: torch.Tensor,
        ssm_buf: torch.Tensor,
        slots: torch.Tensor,
        fresh: torch.Tensor,
    ) -> torch.Tensor:
        """Mix ``h [B, L, hidden]`` (row ``b``: ``lengths[b]`` real tokens, then padding).

        ``slots [B]`` (distinct) hold each row's conv/SSM state, ``fresh [B]`` (bool) marks rows
        that start from zero state whatever their slot holds. Each row's final state is written
        back into its slot. Outputs at padded positions are meaningless.
        """
        batch, length, _ = h.shape
        k1 = self.d_conv - 1
        gate, xbc, dt = self.in_proj(h).split(
            [self.intermediate, self.conv_dim, self.n_heads], dim=-1
        )
        real = torch.arange(length, device=h.device)[None, :] < lengths[:, None]  # [B, L]

        prev = conv_buf.index_select(0, slots).to(xbc.dtype)  # [B, conv_dim, k1]
        prev = torch.where(fresh[:, None, None], torch.zeros_like(prev), prev)
        window = torch.cat([prev, xbc.transpose(1, 2)], dim=-1)  # [B, conv_dim, k1 + L]
        # the last k1 inputs of row b end at its last real token: window[:, :, len_b : len_b + k1]
        idx = lengths[:, None] + torch.arange(k1, device=h.device)[None, :]  # [B, k1]
        last = window.gather(2, idx[:, None, :].expand(batch, self.conv_dim, k1))
        conv_buf[slots] = last.to(conv_buf.dtype)
        w = self.conv1d.weight
        xbc = F.conv1d(window.to(w.dtype), w, self.conv1d.bias, groups=self.conv_dim)
        xbc = F.silu(xbc).transpose(1, 2).to(h.dtype)  # [B, L, conv_dim]

        gs = self.n_groups * self.d_state
        x, B, C = xbc.split([self.intermediate, gs, gs], dim=-1)
        A = -torch.exp(self.A_log.float())
        x = x.reshape(batch, length, self.n_heads, self.head_dim)
        dt = torch.where(real[..., None], self._dt(dt), 0.0)  # padding: no input, no decay
        init = ssm_buf.index_select(0, slots).float()
        init = torch.where(fresh[:, None, None, None], torch.zeros_like(init), init)
        y, final = ssd_chunk_scan(
            x,
            dt,
            A,
            B.reshape(batch, length, self.n_groups, self.d_state),
            C.reshape(batch, length, self.n_groups, self.d_state),
            self.chunk_size,
            init,
        )
        ssm_buf[slots] = final.to(ssm_buf.dtype)
        y = y + self.D.float()[:, None] * x.float()
        y = self.norm(y.reshape(batch, length, self.intermediate), gate)
        return self.out_proj(y.to(h.dtype))

    def decode(
        self,
        h: torch.Tensor,
        conv_buf: torch.Tensor,
        ssm_buf: torch.Tensor,
        slots: torch.Tensor,
    ) -> torch.Tensor:
        """One step for each row of ``h [B, hidden]``; row ``b`` uses and updates ``slots[b]``.

        Slots must be distinct within the batch. Every operation is row-wise, so a row's result
        does not depend on the other rows.
        """
        batch = h.shape[0]
        gate, xbc, dt = self.in_proj(h).split(
            [self.intermediate, self.conv_dim, self.n_heads], dim=-1
        )
        w = self.conv1d.weight[:, 0, :]  # [conv_dim, d_conv]
        window = torch.cat([conv_buf.index_select(0, slots).to(xbc.dtype), xbc[:, :, None]], -1)
        conv_buf[slots] = window[:, :, 1:].to(conv_buf.dtype)
        xbc = (window.to(w.dtype) * w).sum(-1)
        if self.conv1d.bias is not None:
            xbc = xbc + self.conv1d.bias
        xbc = F.silu(xbc).to(h.dtype)

        gs = self.n_groups * self.d_state
        x, B, C = xbc.split([self.intermediate, gs, gs], dim=-1)
        x = x.float().reshape(batch, self.n_heads, self.head_dim)
        B = expand_groups(B.float().reshape(batch, self.n_groups, self.d_state), self.n_heads)
        C = expand_groups(C.float().reshape(batch, self.n_groups, self.d_state), self.n_heads)
        dt = self._dt(dt)  # [B, h]
        dA = torch.exp(dt * -torch.exp(self.A_log.float()))
        state = ssm_buf.index_select(0, slots).float()  # [B, h, p, n]
        state = state * dA[:, :, None, None] + (dt[:, :, None] * x)[..., None] * B[:, :, None, :]
        ssm_buf[slots] = state.to(ssm_buf.dtype)
        y = torch.matmul(state, C[..., None])[..., 0] + self.D.float()[:, None] * x
        y = self.norm(y.reshape(batch, self.intermediate), gate)
        return self.out_proj(y.to(h.dtype))
