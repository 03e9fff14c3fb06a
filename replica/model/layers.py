"""Small building blocks of the hybrid model: RMSNorm, gated RMSNorm and partial RoPE.

The numerics follow transformers' modeling files (normalisation in float32, weight applied after
casting back to the input dtype; RoPE angles in float32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dimension.

    With ``unit_offset`` the scale is ``1 + weight`` and applied in float32 (Qwen3-Next, whose
    norms are stored centred on zero).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, unit_offset: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.unit_offset = unit_offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.unit_offset:
            return (h * (1.0 + self.weight.float())).to(dtype)
        return self.weight * h.to(dtype)


class GatedRMSNorm(nn.Module):
    """RMSNorm over groups of ``group_size`` channels, gated by ``silu(gate)``; float32 inside.

    ``norm_before_gate`` False: normalise ``x * silu(gate)`` (Mamba2 of Bamba, Granite,
    Nemotron-H); True: normalise ``x``, then multiply by ``silu(gate)`` (Falcon-H1's option, and
    the gated DeltaNet with one group per value head).
    """

    def __init__(
        self, hidden_size: int, group_size: int, eps: float = 1e-6, norm_before_gate: bool = False
    ) -> None:
        super().__init__()
        if hidden_size % group_size:
            raise ValueError(f"group_size {group_size} must divide hidden_size {hidden_size}")
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.group_size = group_size
        self.eps = eps
        self.norm_before_gate = norm_before_gate

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        g = F.silu(gate.float())
        if not self.norm_before_gate:
            h = h * g
        *prefix, last = h.shape
        grouped = h.view(*prefix, last // self.group_size, self.group_size)
        grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        h = self.weight * grouped.view(*prefix, last).to(dtype)
        return (h * g).to(dtype) if self.norm_before_gate else h


class RotaryEmbedding:
    """Cos/sin tables of (partial) rotary position embedding, computed per call from positions.

    Only the first ``rotary_dim = int(head_dim * partial_rotary_factor)`` channels of each head are
    rotated (GPT-NeoX "rotate half" layout within those channels). The inverse frequencies are
    kept in float32 outside the module tree, so casting the model to a low precision dtype does
    not round them.
    """

    def __init__(self, head_dim: int, partial_rotary_factor: float, theta: float) -> None:
        self.rotary_dim = int(head_dim * partial_rotary_factor)
        if self.rotary_dim % 2 or self.rotary_dim <= 0:
            raise ValueError(f"rotary dim {self.rotary_dim} must be even and positive")
        exponent = (
            torch.arange(0, self.rotary_dim, 2, dtype=torch.float, device="cpu") / self.rotary_dim
        )
        self.inv_freq = 1.0 / (theta**exponent)

    def __call__(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions`` of any shape ``[...]`` -> ``(cos, sin)`` of shape ``[..., rotary_dim]``."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` channels of ``x`` (``cos``/``sin`` broadcast to it)."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    return torch.cat((x_rot * cos + _rotate_half(x_rot) * sin, x_pass), dim=-1)
