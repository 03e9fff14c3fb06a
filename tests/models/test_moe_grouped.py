"""The routed experts as one grouped GEMM give, bit for bit, what one matmul per expert gives:
tokens routed to every expert, to a few (experts with no rows), gated and plain experts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from replica.model.config_parts import MoEConfig
from replica.model.mlp import activation
from replica.model.moe import MoE


def per_expert(moe: MoE, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Each token's experts one by one, in expert order (the definition)."""
    out = torch.zeros_like(x)
    for e in range(moe.gate_up.shape[0]):
        token, slot = (idx == e).nonzero(as_tuple=True)
        if len(token):
            h = F.linear(x[token], moe.gate_up[e])
            if moe.gated:
                gate, up = h.chunk(2, dim=-1)
                h = activation(moe.act, gate) * up
            else:
                h = activation(moe.act, h)
            out.index_add_(0, token, F.linear(h, moe.down[e]) * weights[token, slot][:, None])
    return out


@pytest.mark.parametrize("tokens", [1, 3, 16, 70])
@pytest.mark.parametrize("gated, act", [(True, "silu"), (False, "relu2")])
def test_grouped_experts_equal_one_matmul_per_expert(tokens, gated, act):
    torch.manual_seed(tokens)
    moe = MoE(32, MoEConfig(num_experts=8, top_k=2, intermediate_size=24), act, gated, False)
    for p in moe.parameters():
        p.data.normal_()
    x = torch.randn(tokens, 32)
    with torch.inference_mode():
        weights, idx = moe.route(x)
        got = moe.experts(x, weights, idx)
        want = per_expert(moe, x, weights, idx)
    assert len(idx.unique()) < 8 or tokens > 3  # the small batches leave experts without rows
    torch.testing.assert_close(got, want, atol=0, rtol=0)
