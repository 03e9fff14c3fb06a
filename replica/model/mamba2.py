"""The Mamba2 mixer, with its conv and SSM state in externally owned slot buffers.

Two paths. :meth:`Mamba2Mixer.extend` runs a batch of right-padded chunks (one per sequence) with
the chunked SSD algorithm from the state in each sequence's slot: padding is made inert (its
``dt`` is 0, so it adds no input and no decay; the conv is causal) and each row's final conv state
is read at its own last real positions. :meth:`Mamba2Mixer.decode` runs one token of each of a
batch of sequences with the single-step recurrence, updating each row's state in its slot (in
place by mamba-ssm's kernel or when given its ``StateRows``, else on a copy written back).
The SSM runs in float32 whatever the model dtype; on CUDA, mamba-ssm's kernels when installed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from replica.model import kernels
from replica.model.config import ModelConfig
from replica.model.conv import conv_extend, conv_step
from replica.model.layers import GatedRMSNorm
from replica.model.ssd import ssd_chunk_scan
from replica.model.state_rows import LayerRows


class Mamba2Mixer(nn.Module):
    """Parameter names follow transformers' Mamba2 mixers (``BambaMixer`` and its kin).

    The output meets the gate ``z`` as ``cfg.mamba_norm`` says; Falcon-H1's projection
    multipliers (``cfg.multipliers.ssm_projection``) scale the sections of ``in_proj``'s output.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.mamba_n_heads
        self.head_dim = cfg.mamba_d_head
        self.n_groups = cfg.mamba_n_groups
        self.d_state = cfg.mamba_d_state
        self.chunk_size = cfg.mamba_chunk_size
        self.intermediate = cfg.mamba_intermediate_size
        self.conv_dim = cfg.conv_dim
        lo, hi = cfg.time_step_limit
        self.dt_limit = None if (lo, hi) == (0.0, float("inf")) else (lo, hi)
        gs = self.n_groups * self.d_state
        self.sections = [self.intermediate, self.intermediate, gs, gs, self.n_heads]
        proj = sum(self.sections)
        self.in_proj = nn.Linear(cfg.hidden_size, proj, bias=cfg.mamba_proj_bias)
        self.conv1d = nn.Conv1d(
            self.conv_dim,
            self.conv_dim,
            cfg.mamba_d_conv,
            groups=self.conv_dim,
            bias=cfg.mamba_conv_bias,
        )
        self.dt_bias = nn.Parameter(torch.ones(self.n_heads))
        self.A_log = nn.Parameter(torch.zeros(self.n_heads))
        self.D = nn.Parameter(torch.ones(self.n_heads))
        self.norm = None
        if cfg.mamba_norm != "gate":
            group = self.intermediate // self.n_groups
            before = cfg.mamba_norm == "norm_then_gate"
            self.norm = GatedRMSNorm(self.intermediate, group, cfg.rms_norm_eps, before)
        self.out_proj = nn.Linear(self.intermediate, cfg.hidden_size, bias=cfg.mamba_out_proj_bias)
        # Falcon-H1's muP vector, built per device on first use (like transformers', float32)
        scales = cfg.multipliers.ssm_projection
        self.proj_scales = None if all(s == 1.0 for s in scales) else scales
        self._proj_scale: torch.Tensor | None = None

    def init_dynamics(self) -> None:
        """The usual Mamba2 init: ``A = -(1..n_heads)``, ``D = 1``, time steps log-spaced in
        [0.001, 0.1] (``dt_bias`` their inverse softplus)."""
        n = self.n_heads
        with torch.no_grad():
            self.A_log.copy_(torch.log(torch.arange(1, n + 1, dtype=torch.float32)))
            self.D.fill_(1.0)
            dt = torch.exp(torch.linspace(math.log(1e-3), math.log(1e-1), n))
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def _project(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        zxbcdt = self.in_proj(h)
        if self.proj_scales is not None:
            if self._proj_scale is None or self._proj_scale.device != h.device:
                sizes = torch.tensor(self.sections)
                scale = torch.tensor(self.proj_scales).repeat_interleave(sizes)
                self._proj_scale = scale.to(h.device)
            zxbcdt = zxbcdt * self._proj_scale
        return zxbcdt.split([self.intermediate, self.conv_dim, self.n_heads], dim=-1)

    def _dt(self, dt: torch.Tensor) -> torch.Tensor:
        dt = F.softplus(dt.float() + self.dt_bias.float())
        if self.dt_limit is not None:
            dt = dt.clamp(self.dt_limit[0], self.dt_limit[1])
        return dt

    def _out(self, y: torch.Tensor, gate: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if self.norm is None:
            y = y * F.silu(gate.float())
        else:
            y = self.norm(y, gate)
        return self.out_proj(y.to(dtype))

    def extend(
        self,
        h: torch.Tensor,
        conv_buf: torch.Tensor,
        ssm_buf: torch.Tensor,
        lengths: torch.Tensor,
        slots: torch.Tensor,
        fresh: torch.Tensor,
    ) -> torch.Tensor:
        """Mix ``h [B, L, hidden]`` (row ``b``: ``lengths[b]`` real tokens, then padding).

        ``slots [B]`` (distinct) hold each row's conv/SSM state, ``fresh [B]`` (bool) marks rows
        that start from zero state whatever their slot holds. Each row's final state is written
        back into its slot. Outputs at padded positions are meaningless.
        """
        batch, length, _ = h.shape
        gate, xbc, dt = self._project(h)
        xbc = conv_extend(
            xbc, lengths, conv_buf, slots, fresh, self.conv1d.weight, self.conv1d.bias
        )
        gs = self.n_groups * self.d_state
        x, B, C = xbc.split([self.intermediate, gs, gs], dim=-1)
        A = -torch.exp(self.A_log.float())
        x = x.reshape(batch, length, self.n_heads, self.head_dim)
        B = B.reshape(batch, length, self.n_groups, self.d_state)
        C = C.reshape(batch, length, self.n_groups, self.d_state)
        real = torch.arange(length, device=h.device)[None, :] < lengths[:, None]  # [B, L]
        dt = torch.where(real[..., None], self._dt(dt), 0.0)  # padding: no input, no decay
        init = ssm_buf.index_select(0, slots).float()
        init = torch.where(fresh[:, None, None, None], torch.zeros_like(init), init)
        if kernels.mamba_ssm(h):
            y, final = kernels.mamba_chunk_scan(x, dt, A, B, C, self.chunk_size, init)
        else:
            y, final = ssd_chunk_scan(x, dt, A, B, C, self.chunk_size, init)
        ssm_buf.index_copy_(0, slots, final.to(ssm_buf.dtype))
        y = y + self.D.float()[:, None] * x.float()
        return self._out(y.reshape(batch, length, self.intermediate), gate, h.dtype)

    def decode(
        self,
        h: torch.Tensor,
        conv_buf: torch.Tensor,
        ssm_buf: torch.Tensor,
        slots: torch.Tensor,
        rows: LayerRows | None = None,
        inert: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One step for each row of ``h [B, hidden]``; row ``b`` uses and updates ``slots[b]``.

        Slots must be distinct within the batch, but for ``inert`` rows (``[B]`` bool, a padded
        batch's rows on the scratch slot): their SSM step has a zero time step, so it leaves
        their slot's SSM state as it was (the kernel updates the pool in place, row by row in
        parallel, and rows sharing a slot must not change what another reads). ``rows``, when
        given, are the views of ``ssm_buf[slots]`` (``StateRows``): the PyTorch path then
        updates and reads the SSM state where it lives. Every operation is row-wise, so a row's
        result does not depend on the other rows.
        """
        batch = h.shape[0]
        gate, xbc, dt = self._project(h)
        xbc = conv_step(xbc, conv_buf, slots, self.conv1d.weight, self.conv1d.bias)
        gs = self.n_groups * self.d_state
        x, B, C = xbc.split([self.intermediate, gs, gs], dim=-1)
        x = x.float().reshape(batch, self.n_heads, self.head_dim)
        B = B.float().reshape(batch, self.n_groups, self.d_state)
        C = C.float().reshape(batch, self.n_groups, self.d_state)
        dt = self._dt(dt)  # [B, h]
        if inert is not None:
            dt = dt.masked_fill(inert[:, None], 0.0)  # S <- exp(0) S + 0: the slot as it was
        A = -torch.exp(self.A_log.float())
        if kernels.mamba_ssm(h):
            y = kernels.selective_state_update(ssm_buf, x, dt, A, B, C, self.D.float(), slots)
        else:
            y = self._ssm_step(x, dt, A, B, C, ssm_buf, slots, rows)
            y = torch.addcmul(y, self.D.float()[:, None], x)
        return self._out(y.reshape(batch, self.intermediate), gate, h.dtype)

    def _ssm_step(
        self,
        x: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        ssm_buf: torch.Tensor,
        slots: torch.Tensor,
        rows: LayerRows | None,
    ) -> torch.Tensor:
        """``S <- exp(dt A) S + (dt x) B^T`` in each row's slot, then ``y = S C`` ``[B, h, p]``."""
        batch, n = x.shape[0], self.d_state
        decay = torch.exp(dt * A)[:, :, None, None]  # [B, h, 1, 1]
        dtx = dt[:, :, None] * x  # [B, h, p]
        if rows is not None:
            # in place in the pool, every row in one call per op; the heads of a group share B
            # (one group: broadcast over the heads, no copy)
            per_head = (
                B if self.n_groups == 1 else B.repeat_interleave(self.n_heads // self.n_groups, 1)
            )
            views = rows.views
            torch._foreach_mul_(views, decay.unbind(0))
            torch._foreach_addcmul_(views, dtx[..., None].unbind(0), per_head[:, :, None].unbind(0))
            return _read_rows(rows, C, self.n_heads, self.head_dim)
        # on a copy, one matrix per group (no per-head copies of B), then written back
        state = ssm_buf.index_select(0, slots).float()
        groups = batch * self.n_groups
        state.mul_(decay)
        flat = state.view(groups, -1, n)
        flat.baddbmm_(dtx.view(groups, -1, 1), B.reshape(groups, 1, n))
        ssm_buf.index_copy_(0, slots, state.to(ssm_buf.dtype))
        # as C^T S^T: with the state as the right operand, CPU BLAS runs it ~8x faster than S C
        y = torch.bmm(C.reshape(groups, 1, n), state.view(groups, -1, n).transpose(1, 2))
        return y.view(batch, self.n_heads, self.head_dim)


def _read_rows(rows: LayerRows, C: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """``y = S C`` ``[B, h, p]`` from each row's state where it lives: one matrix-vector
    product a row and group, all in one call (``torch._foreach_mm``), reads it once, where
    gathering the batch's states for one batched product would read and write them first
    (about twice the time on the CPU)."""
    batch, groups, n = C.shape
    y = torch._foreach_mm(rows.matrices(groups), C.reshape(batch * groups, n, 1).unbind(0))
    return torch.stack(y).view(batch, heads, head_dim)
