"""Grouped-query attention with partial RoPE, its K/V living in token-slot buffers.

Keys are stored after rotation, so a slot's K never changes once written. The attention math is
written out (no fused kernel) so that its result for one query row does not depend on how many
other rows or padded keys share the call beyond float rounding.
"""

from __future__ import annotations

import torch
from torch import nn

from replica.model.config import ModelConfig
from replica.model.layers import apply_rotary


def gqa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor, scale: float
) -> torch.Tensor:
    """Softmax attention with grouped KV heads.

    ``q [N, Hq, Lq, D]``, ``k``/``v [N, Hkv, T, D]``, ``valid [N, Lq, T]`` (bool, True where the
    query may attend; every query row needs at least one). Query head ``h`` uses KV head
    ``h // (Hq / Hkv)``. Returns ``[N, Hq, Lq, D]``.
    """
    n, hq, lq, d = q.shape
    hkv, t = k.shape[1], k.shape[2]
    rep = hq // hkv
    scores = torch.matmul(q.reshape(n, hkv, rep * lq, d), k.transpose(-1, -2)) * scale
    scores = scores.view(n, hkv, rep, lq, t).masked_fill(~valid[:, None, None], -torch.inf)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    out = torch.matmul(probs.view(n, hkv, rep * lq, t), v)
    return out.view(n, hq, lq, d)


class Attention(nn.Module):
    """Bamba's attention layer; parameter names follow transformers' ``BambaAttention``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.n_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = self.head_dim**-0.5
        hidden, bias = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(hidden, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.n_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, hidden, bias=bias)

    def _qkv(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = h.shape[0]
        q = self.q_proj(h).view(rows, self.n_heads, self.head_dim)
        k = self.k_proj(h).view(rows, self.n_kv_heads, self.head_dim)
        v = self.v_proj(h).view(rows, self.n_kv_heads, self.head_dim)
        cos, sin = cos[:, None, :], sin[:, None, :]
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def extend(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        kv_slots: torch.Tensor,
        real: torch.Tensor,
        new_slots: torch.Tensor,
        valid: torch.Tensor,
    ) -> torch.Tensor:
        """Right-padded chunks of ``B`` sequences, ``h [B, L, hidden]``.

        ``kv_slots [B, T]`` the slots of each row's positions (padding replaced by a valid slot
        index), ``real [B, L]`` the real (not padded) tokens, ``new_slots`` the slots of the real
        tokens in row-major order (written here), ``valid [B, L, T]`` which keys each query sees.
        """
        batch, length = h.shape[:2]
        q, k, v = self._qkv(h.reshape(batch * length, -1), cos.flatten(0, 1), sin.flatten(0, 1))
        flat_real = real.reshape(-1)
        k_buf[new_slots] = k[flat_real].to(k_buf.dtype)
        v_buf[new_slots] = v[flat_real].to(v_buf.dtype)
        shape = (batch, kv_slots.shape[1], self.n_kv_heads, self.head_dim)
        flat = kv_slots.reshape(-1)
        keys = k_buf.index_select(0, flat).view(shape).to(q.dtype).permute(0, 2, 1, 3)
        values = v_buf.index_select(0, flat).view(shape).to(q.dtype).permute(0, 2, 1, 3)
        q = q.view(batch, length, self.n_heads, self.head_dim).permute(0, 2, 1, 3)
        out = gqa_attention(q, keys, values, valid, self.scale)  # [B, Hq, L, D]
        return self.o_proj(out.permute(0, 2, 1, 3).reshape(batch, length, -1))

    def decode(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
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
        q, k, v = self._qkv(h, cos, sin)
        k_buf[new_slots] = k.to(k_buf.dtype)
        v_buf[new_slots] = v.to(v_buf.dtype)
        # index_select of the flattened slots: several times faster than advanced indexing
        shape = (batch, kv_slots.shape[1], self.n_kv_heads, self.head_dim)
        flat = kv_slots.reshape(-1)
        keys = k_buf.index_select(0, flat).view(shape).to(q.dtype).permute(0, 2, 1, 3)
        values = v_buf.index_select(0, flat).view(shape).to(q.dtype).permute(0, 2, 1, 3)
        out = gqa_attention(q[:, :, None, :], keys, values, valid[:, None, :], self.scale)
        return self.o_proj(out.reshape(batch, -1))
