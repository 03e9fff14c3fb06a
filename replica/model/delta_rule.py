"""The gated delta rule (Gated DeltaNet's recurrence): chunked for prefill, one step for decode.

Per value head the state ``S [k_dim, v_dim]`` evolves, for each token, as

    S <- exp(g) * S;   S <- S + k (beta * (v - S^T k))^T;   o = S^T q

with ``g <= 0`` the log decay and ``beta`` in (0, 1) the write strength. A token with ``g = 0``
and ``beta = 0`` leaves the state unchanged, which is how padding is made inert. Inputs are
float32 with ``q``/``k`` already normalised, scaled and expanded to the value heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int,
    initial_state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence over whole chunks at once (the WY / UT-transform form).

    ``q``/``k [b, L, h, dk]``, ``v [b, L, h, dv]``, ``g``/``beta [b, L, h]``,
    ``initial_state [b, h, dk, dv]``. Returns ``o [b, L, h, dv]`` and the final state.

    Within a chunk with cumulative log decay ``G``, the corrections ``u_s = beta_s (v_s -
    S_{s-1}^T k_s)`` solve a unit lower-triangular system ``(I + A) u = beta v - W S0`` where
    ``A[s, r] = beta_s exp(G_s - G_r) k_s.k_r`` (r < s); the chunk's outputs and end state are
    then matmuls with ``u``. Only the state crosses chunk boundaries, so the loop is over chunks.
    """
    batch, length, heads, dk = k.shape
    dv = v.shape[-1]
    c = min(chunk_size, length)
    n = -(-length // c)
    pad = n * c - length
    # [b, h, n, c, d] and [b, h, n, c]; padded steps have beta = g = 0, so they are inert
    q, k, v = (
        F.pad(t, (0, 0, 0, 0, 0, pad)).transpose(1, 2).reshape(batch, heads, n, c, -1)
        for t in (q, k, v)
    )
    g, beta = (
        F.pad(t, (0, 0, 0, pad)).transpose(1, 2).reshape(batch, heads, n, c) for t in (g, beta)
    )
    G = g.cumsum(-1)
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, -torch.inf).exp()

    k_beta = k * beta[..., None]
    A = (k_beta @ k.transpose(-1, -2)) * decay  # the diagonal is ignored (unit triangular)
    u0 = torch.linalg.solve_triangular(A, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(
        A, k_beta * G.exp()[..., None], upper=False, unitriangular=True
    )
    attn = (q @ k.transpose(-1, -2)) * decay  # within the chunk, the diagonal included
    q_decayed = q * G.exp()[..., None]
    k_to_end = k * (G[..., -1:] - G).exp()[..., None]
    chunk_decay = G[..., -1].exp()[..., None, None]  # [b, h, n, 1, 1]

    state = initial_state.float()
    out = torch.empty(batch, heads, n, c, dv, dtype=torch.float32, device=q.device)
    for i in range(n):
        u = u0[:, :, i] - w[:, :, i] @ state
        out[:, :, i] = q_decayed[:, :, i] @ state + attn[:, :, i] @ u
        state = state * chunk_decay[:, :, i] + k_to_end[:, :, i].transpose(-1, -2) @ u
    out = out.reshape(batch, heads, n * c, dv)[:, :, :length].transpose(1, 2)
    return out, state


def gated_delta_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row: ``q``/``k [b, h, dk]``, ``v [b, h, dv]``, ``g``/``beta [b, h]``,
    ``state [b, h, dk, dv]`` (updated in place). Returns ``o [b, h, dv]`` and the state."""
    b, h, dk, dv = state.shape
    flat = state.mul_(g.exp()[..., None, None]).view(b * h, dk, dv)
    out, delta = _read(q, k, v, beta, flat)
    flat.baddbmm_(k.reshape(b * h, dk, 1), delta.reshape(b * h, 1, dv))
    return out, state


def gated_delta_step_in_place(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    rows: list[torch.Tensor],
    state_buf: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """:func:`gated_delta_step` on the states where they live: ``rows[b]`` is the float32 view
    of ``state_buf[slots[b]]`` (``StateRows``), updated in place. Returns ``o [b, h, dv]``."""
    torch._foreach_mul_(rows, g.exp()[..., None, None].unbind(0))
    state = state_buf.index_select(0, slots)  # the decayed states, read once
    b, h, dk, dv = state.shape
    out, delta = _read(q, k, v, beta, state.view(b * h, dk, dv))
    torch._foreach_addcmul_(rows, k[..., None].unbind(0), delta[:, :, None].unbind(0))
    return out


def _read(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, flat: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """From the decayed states ``flat [b*h, dk, dv]``: the output and the write ``delta``."""
    b, h, dk = k.shape
    # S^T k and S^T q in one pass over the state; then o = (S + k delta^T)^T q needs no second
    read = torch.bmm(torch.stack([k, q], dim=2).view(b * h, 2, dk), flat).view(b, h, 2, -1)
    delta = (v - read[:, :, 0]) * beta[..., None]
    return read[:, :, 1] + delta * (k * q).sum(-1, keepdim=True), delta
