"""The feed-forward block: gated (SwiGLU) or plain, with SiLU or squared-ReLU activations."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def activation(name: str, x: torch.Tensor) -> torch.Tensor:
    """``silu`` or ``relu2`` (squared ReLU, Nemotron-H)."""
    if name == "relu2":
        return torch.square(F.relu(x))
    return F.silu(x)


class MLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` when ``gated``, else ``down(act(up(x)))``.

    The gate and up projections are one matrix ``gate_up_proj`` (gate rows first), so one matmul
    serves both. ``gate_scale`` and ``down_scale`` are Falcon-H1's MLP multipliers: the gate
    projection's output and the block's output are multiplied by them.
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        act: str = "silu",
        gated: bool = True,
        bias: bool = False,
        gate_scale: float = 1.0,
        down_scale: float = 1.0,
    ) -> None:
        super().__init__()
        self.act = act
        self.gated = gated
        self.gate_scale = gate_scale
        self.down_scale = down_scale
        width = 2 * intermediate_size if gated else intermediate_size
        self.gate_up_proj = nn.Linear(hidden_size, width, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.gate_up_proj(x)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            if self.gate_scale != 1.0:
                gate = gate * self.gate_scale
            h = activation(self.act, gate) * up
        else:
            h = activation(self.act, h)
        out = self.down_proj(h)
        return out * self.down_scale if self.down_scale != 1.0 else out
