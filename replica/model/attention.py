"""Grouped-query attention with (partial) RoPE, its K/V living in token-slot buffers.

Keys are stored after rotation, so a slot's K never changes once written. Each call gathers the
K/V of its rows' positions by slot and runs PyTorch's fused scaled-dot-product attention with a
boolean mask; rows are independent, so one row's result does not depend on the other rows or on
how many padded keys share the call beyond float rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from replica.model.config import ModelConfig
from replica.model.layers import RMSNorm, apply_rotary


def gqa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    valid: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Softmax attention with grouped KV heads.

    ``q [N, Hq, Lq, D]``, ``k``/``v [N, Hkv, T, D]`` (may be strided views), ``valid [N, Lq, T]``
    (bool, True where the query may attend; every query row needs at least one), or None for the
    plain causal mask (``Lq == T``), which lets the kernel skip the masked half. Query head ``h``
    uses KV head ``h // (Hq / Hkv)``. Returns ``[N, Hq, Lq, D]``.
    """
    mask = None if valid is None else valid[:, None]
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=valid is None, scale=scale, enable_gqa=True
    )


class Attention(nn.Module):
    """Attention with its K/V in token-slot buffers; plain (Bamba, Granite, Nemotron-H, Falcon-H1)
    or gated with per-head q/k norms (Qwen3-Next).

    ``qkv_proj`` is transformers' ``q_proj``, ``k_proj`` and ``v_proj`` stacked (one matmul). With
    ``attention_output_gate`` the query projection is twice as wide, each head's query followed by
    its gate, and the output is multiplied by ``sigmoid(gate)`` before ``o_proj``. Keys are scaled
    by Falcon-H1's key multiplier before rotation; ``cos``/``sin`` None means no rotary embedding.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.n_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = self.head_dim**-0.5 if cfg.attention_scale is None else cfg.attention_scale
        self.output_gate = cfg.attention_output_gate
        self.key_scale = cfg.multipliers.key
        hidden, bias = cfg.hidden_size, cfg.attention_bias
        q_width = self.n_heads * self.head_dim * (2 if self.output_gate else 1)
        self.split = [q_width, self.n_kv_heads * self.head_dim, self.n_kv_heads * self.head_dim]
        self.qkv_proj = nn.Linear(hidden, sum(self.split), bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, hidden, bias=bias)
        self.q_norm = self.k_norm = None
        if cfg.attention_qk_norm:
            eps, offset = cfg.rms_norm_eps, cfg.norm_unit_offset
            self.q_norm = RMSNorm(self.head_dim, eps, unit_offset=offset)
            self.k_norm = RMSNorm(self.head_dim, eps, unit_offset=offset)

    def _qkv(
        self, h: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``h [rows, hidden]`` -> rotated ``q [rows, Hq, D]``, ``k``, ``v [rows, Hkv, D]`` and
        the output gate ``[rows, Hq * D]`` (None without one)."""
        rows = h.shape[0]
        q, k, v = self.qkv_proj(h).split(self.split, dim=-1)
        gate = None
        if self.output_gate:
            q, gate = q.view(rows, self.n_heads, 2 * self.head_dim).chunk(2, dim=-1)
            gate = gate.reshape(rows, -1)
        q = q.reshape(rows, self.n_heads, self.head_dim)
        k = k.view(rows, self.n_kv_heads, self.head_dim)
        v = v.view(rows, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.key_scale != 1.0:
            k = k * self.key_scale
        if cos is not None:
            cos, sin = cos[:, None, :], sin[:, None, :]
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return q, k, v, gate

    def _out(self, out: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return self.o_proj(out)

    def extend(
        self,
        h: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        kv_slots: torch.Tensor,
        real: torch.Tensor,
        new_slots: torch.Tensor,
        valid: torch.Tensor | None,
    ) -> torch.Tensor:
        """Right-padded chunks of ``B`` sequences, ``h [B, L, hidden]``.

        ``kv_slots [B, T]`` the slots of each row's positions (padding replaced by a valid slot
        index), ``real [B, L]`` the real (not padded) tokens, ``new_slots`` the slots of the real
        tokens in row-major order (written here), ``valid [B, L, T]`` which keys each query sees
        (None: the plain causal mask, every row fresh and unpadded).
        """
        batch, length = h.shape[:2]
        flat_cos = None if cos is None else cos.flatten(0, 1)
        flat_sin = None if sin is None else sin.flatten(0, 1)
        q, k, v, gate = self._qkv(h.reshape(batch * length, -1), flat_cos, flat_sin)
        flat_real = real.reshape(-1)
        k_buf[new_slots] = k[flat_real].to(k_buf.dtype)
        v_buf[new_slots] = v[flat_real].to(v_buf.dtype)
        shape = (batch, kv_slots.shape[1], self.n_kv_heads, self.head_dim)
        flat = kv_slots.reshape(-1)
        keys = k_buf.index_select(0, flat).view(shape).to(q.dtype).permute(0, 2, 1, 3)
        values = v_buf.index_select(0, flat).view(shape).to(q.dtype).permute(0, 2, 1, 3)
        q = q.view(batch, length, self.n_heads, self.head_dim).permute(0, 2, 1, 3)
        out = gqa_attention(q, keys, values, valid, self.scale)  # [B, Hq, L, D]
        out = out.permute(0, 2, 1, 3).reshape(batch * length, -1)
        return self._out(out, gate).view(batch, length, -1)

    def decode(
        self,
        h: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        kv_slots: torch.Tensor,
        new_slots: torch.Tensor,
        valid: torch.Tensor,
    ) -> torch.Tensor:
        """One token per row of ``h [B, hidden]``.

        ``kv_slots [B, T]`` (padding already replaced by a valid slot index), ``new_slots [B]``
        the slots of the new tokens (written here), ``valid [B, T]`` which keys each row sees.
        """
        batch = h.shape[0]
        q, k, v, gate = self._qkv(h, cos, sin)
        k_buf[new_slots] = k.to(k_buf.dtype)
        v_buf[new_slots] = v.to(v_buf.dtype)
        # index_select of the flattened slots: several times faster than advanced indexing
        shape = (batch, kv_slots.shape[1], self.n_kv_heads, self.head_dim)
        flat = kv_slots.reshape(-1)
        keys = k_buf.index_select(0, flat).view(shape).to(q.dtype).permute(0, 2, 1, 3)
        values = v_buf.index_select(0, flat).view(shape).to(q.dtype).permute(0, 2, 1, 3)
        # the query heads that share a KV head as that head's queries: each key is read once
        # (as KV heads, sdpa reads it once per query head; 2-3x the time on the CPU)
        q = q.reshape(batch, self.n_kv_heads, self.n_heads // self.n_kv_heads, self.head_dim)
        out = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=valid[:, None, None, :], scale=self.scale
        )
        return self._out(out.reshape(batch, -1), gate)
