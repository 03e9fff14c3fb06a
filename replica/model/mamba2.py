"""The Mamba2 mixer of Bamba, with its conv and SSM state in externally owned slot buffers.

Two paths: :meth:`Mamba2Mixer.extend` runs one sequence's chunk of tokens with the chunked SSD
algorithm from the state in its slot; :meth:`Mamba2Mixer.decode` runs one token of each of a batch
of sequences with the single-step recurrence, gathering and scattering states by slot index.
The SSM runs in float32 whatever the model dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from replica.config import ModelConfig
from replica.model.layers import GatedRMSNorm


def segsum(x: torch.Tensor) -> torch.Tensor:
    """``out[..., i, j] = sum(x[..., j+1 : i+1])`` for ``i >= j``, ``-inf`` above the diagonal.

    Built from masked cumulative sums (not differences of cumsums), which keeps it exact for the
    long decaying sums the SSD needs.
    """
    t = x.shape[-1]
    xe = x[..., None].expand(*x.shape, t)
    strict = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=-1)
    out = torch.cumsum(xe.masked_fill(~strict, 0.0), dim=-2)
    lower = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=0)
    return out.masked_fill(~lower, -torch.inf)


def _expand_groups(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``[..., groups, d]`` -> ``[..., n_heads, d]``; head ``h`` uses group ``h // (n_heads/g)``."""
    *prefix, g, d = t.shape
    return t[..., None, :].expand(*prefix, g, n_heads // g, d).reshape(*prefix, n_heads, d)


def ssd_chunk_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked SSD scan of one sequence (Mamba2 "ssd_minimal"), without the ``D`` skip term.

    Shapes: ``x [L, h, p]``, ``dt [L, h]`` (already softplus'ed and clamped), ``A [h]``
    (negative), ``B``/``C [L, g, n]``, ``initial_state [h, p, n]`` (zeros when None).
    Returns ``y [L, h, p]`` and the final state ``[h, p, n]``, both float32.
    """
    length, n_heads, _ = x.shape
    chunk_size = min(chunk_size, length)  # the same scan; no padding of short inputs
    x = x.float()
    dt = dt.float()
    B = _expand_groups(B.float(), n_heads)
    C = _expand_groups(C.float(), n_heads)
    xdt = x * dt[..., None]
    adt = A.float() * dt  # [L, h]

    n_chunks = -(-length // chunk_size)
    pad = n_chunks * chunk_size - length
    if pad:  # zero input and zero decay: padded steps leave the state unchanged
        xdt, B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (xdt, B, C))
        adt = F.pad(adt, (0, 0, 0, pad))
    xdt = xdt.view(n_chunks, chunk_size, n_heads, -1)  # c l h p
    B = B.view(n_chunks, chunk_size, n_heads, -1)  # c l h n
    C = C.view(n_chunks, chunk_size, n_heads, -1)
    adt = adt.view(n_chunks, chunk_size, n_heads).permute(2, 0, 1)  # h c l
    a_cum = torch.cumsum(adt, dim=-1)

    # 1. Within each chunk: attention-like C B^T weighted by the decay between positions.
    decay = torch.exp(segsum(adt))  # h c l s
    scores = torch.einsum("clhn,cshn->hcls", C, B) * decay
    y_diag = torch.einsum("hcls,cshp->clhp", scores, xdt)

    # 2. The state each chunk contributes at its end.
    decay_to_end = torch.exp(a_cum[..., -1:] - a_cum)  # h c l
    chunk_states = torch.einsum("clhn,hcl,clhp->chpn", B, decay_to_end, xdt)

    # 3. Recurrence across chunks, from the initial state: the state at the start of each chunk.
    if initial_state is None:
        init = torch.zeros_like(chunk_states[:1])
    else:
        init = initial_state.to(device=x.device, dtype=torch.float32)[None]
    chunk_states = torch.cat([init, chunk_states], dim=0)  # z h p n, z = c + 1
    decay_chunk = torch.exp(segsum(F.pad(a_cum[..., -1], (1, 0))))  # h z z
    states = torch.einsum("hcz,zhpn->chpn", decay_chunk, chunk_states)
    states, final_state = states[:-1], states[-1]

    # 4. Each chunk's start state read out through C, decayed to each position.
    y_off = torch.einsum("clhn,chpn,hcl->clhp", C, states, torch.exp(a_cum))

    y = (y_diag + y_off).reshape(n_chunks * chunk_size, n_heads, -1)[:length]
    return y, final_state


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
        conv_buf: torch.Tensor,
        ssm_buf: torch.Tensor,
        slot: int,
        fresh: bool,
    ) -> torch.Tensor:
        """Mix ``h [L, hidden]`` (one sequence) continuing from the state in ``slot``.

        ``fresh=True`` starts from zero state whatever the slot holds. The final conv and SSM
        state are written back into ``slot``.
        """
        length = h.shape[0]
        k1 = self.d_conv - 1
        gate, xbc, dt = self.in_proj(h).split(
            [self.intermediate, self.conv_dim, self.n_heads], dim=-1
        )
        if fresh:
            prev = xbc.new_zeros(self.conv_dim, k1)
        else:
            prev = conv_buf[slot].to(xbc.dtype)
        window = torch.cat([prev, xbc.t()], dim=-1)  # [conv_dim, k1 + L]
        conv_buf[slot] = window[:, -k1:]
        w = self.conv1d.weight
        xbc = F.conv1d(window[None].to(w.dtype), w, self.conv1d.bias, groups=self.conv_dim)
        xbc = F.silu(xbc[0]).t().to(h.dtype)  # [L, conv_dim]

        gs = self.n_groups * self.d_state
        x, B, C = xbc.split([self.intermediate, gs, gs], dim=-1)
        A = -torch.exp(self.A_log.float())
        x = x.reshape(length, self.n_heads, self.head_dim)
        y, final = ssd_chunk_scan(
            x,
            self._dt(dt),
            A,
            B.reshape(length, self.n_groups, self.d_state),
            C.reshape(length, self.n_groups, self.d_state),
            self.chunk_size,
            None if fresh else ssm_buf[slot],
        )
        ssm_buf[slot] = final
        y = y + self.D.float()[:, None] * x.float()
        y = self.norm(y.reshape(length, self.intermediate), gate)
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
        B = _expand_groups(B.float().reshape(batch, self.n_groups, self.d_state), self.n_heads)
        C = _expand_groups(C.float().reshape(batch, self.n_groups, self.d_state), self.n_heads)
        dt = self._dt(dt)  # [B, h]
        dA = torch.exp(dt * -torch.exp(self.A_log.float()))
        state = ssm_buf.index_select(0, slots).float()  # [B, h, p, n]
        state = state * dA[:, :, None, None] + (dt[:, :, None] * x)[..., None] * B[:, :, None, :]
        ssm_buf[slots] = state.to(ssm_buf.dtype)
        y = torch.matmul(state, C[..., None])[..., 0] + self.D.float()[:, None] * x
        y = self.norm(y.reshape(batch, self.intermediate), gate)
        return self.out_proj(y.to(h.dtype))
