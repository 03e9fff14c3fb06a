"""flash-linear-attention's gated delta step in place in the pool against the PyTorch step: one
check for the CPU tests (Triton's interpreter) and the GPU tests."""

from __future__ import annotations

import torch

from replica.model import kernels
from replica.model.delta_rule import gated_delta_step

SLOTS = [5, 1, 8, 8, 8, 8, 8]  # two real rows, then five padding rows on one slot
OTHERS = [0, 2, 3, 4, 6, 7]  # slots no row names


def check_gated_delta_step_in_place(device: str, heads: int, dk: int, dv: int, tol: float) -> None:
    """The real rows get the PyTorch step's output and state in their slots, no other slot
    moves, and the inert rows (the same input, ``g`` and ``beta`` 0) leave their shared slot
    bit for bit and agree."""
    gen = torch.Generator().manual_seed(5)
    rows = len(SLOTS)
    q, k = (torch.randn(rows, heads, dk, generator=gen) for _ in range(2))
    k = torch.nn.functional.normalize(k, dim=-1)
    v = torch.randn(rows, heads, dv, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(rows, heads, generator=gen))
    beta = torch.rand(rows, heads, generator=gen)
    q[2:], k[2:], v[2:], g[2:], beta[2:] = q[2], k[2], v[2], 0.0, 0.0
    pool = torch.randn(9, heads, dk, dv, generator=gen)
    q, k, v, g, beta, pool = (t.to(device) for t in (q, k, v, g, beta, pool))
    assert kernels.fla_step(q)
    got_pool = pool.clone()
    got = kernels.gated_delta_step(q, k, v, g, beta, got_pool, torch.tensor(SLOTS, device=device))
    want, want_state = gated_delta_step(q[:2], k[:2], v[:2], g[:2], beta[:2], pool[SLOTS[:2]])
    torch.testing.assert_close(got[:2], want, atol=tol, rtol=tol)
    torch.testing.assert_close(got_pool[SLOTS[:2]], want_state, atol=tol, rtol=tol)
    assert torch.equal(got_pool[SLOTS[2]], pool[SLOTS[2]]), "inert rows changed their slot"
    assert torch.equal(got_pool[OTHERS], pool[OTHERS]), "a slot outside the batch changed"
    assert all(torch.equal(row, got[2]) for row in got[3:])
