"""The chunked SSD scan of Mamba2 (the "ssd_minimal" algorithm) over a batch of sequences."""

from __future__ import annotations

import torch
import torch.nn.functional as F


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


def expand_groups(t: torch.Tensor, n_heads: int) -> torch.Tensor:
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
    initial_state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked SSD scan (Mamba2 "ssd_minimal") of a batch of sequences, without the ``D`` term.

    Shapes: ``x [b, L, h, p]``, ``dt [b, L, h]``, ``A [h]``, ``B``/``C [b, L, g, n]``,
    ``initial_state [b, h, p, n]``. Returns ``y [b, L, h, p]`` and final states ``[b, h, p, n]``
    (float32). Rows are independent; a row whose trailing ``dt`` is zero ends in the state it had
    after its last non-zero step.
    """
    batch, length, n_heads, _ = x.shape
    chunk_size = min(chunk_size, length)
    dt = dt.float()
    B = expand_groups(B.float(), n_heads)
    C = expand_groups(C.float(), n_heads)
    xdt = x.float() * dt[..., None]
    adt = A.float() * dt  # [b, L, h]

    n_chunks = -(-length // chunk_size)
    pad = n_chunks * chunk_size - length
    if pad:  # zero input and zero decay: padded steps leave the state unchanged
        xdt, B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (xdt, B, C))
        adt = F.pad(adt, (0, 0, 0, pad))
    xdt = xdt.view(batch, n_chunks, chunk_size, n_heads, -1)  # b c l h p
    B = B.view(batch, n_chunks, chunk_size, n_heads, -1)  # b c l h n
    C = C.view(batch, n_chunks, chunk_size, n_heads, -1)
    adt = adt.view(batch, n_chunks, chunk_size, n_heads).permute(0, 3, 1, 2)  # b h c l
    a_cum = torch.cumsum(adt, dim=-1)

    # 1. Within each chunk.
    decay = torch.exp(segsum(adt))  # b h c l s
    scores = torch.einsum("bclhn,bcshn->bhcls", C, B) * decay
    y_diag = torch.einsum("bhcls,bcshp->bclhp", scores, xdt)

    # 2. The state each chunk contributes at its end.
    decay_to_end = torch.exp(a_cum[..., -1:] - a_cum)  # b h c l
    chunk_states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, decay_to_end, xdt)

    # 3. Recurrence across chunks from each row's initial state.
    init = initial_state.to(device=x.device, dtype=torch.float32)[:, None]
    chunk_states = torch.cat([init, chunk_states], dim=1)  # b z h p n
    decay_chunk = torch.exp(segsum(F.pad(a_cum[..., -1], (1, 0))))  # b h z z
    states = torch.einsum("bhcz,bzhpn->bchpn", decay_chunk, chunk_states)
    states, final_state = states[:, :-1], states[:, -1]

    # 4. Each chunk's start state read out through C.
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, states, torch.exp(a_cum))

    y = (y_diag + y_off).reshape(batch, n_chunks * chunk_size, n_heads, -1)[:, :length]
    return y, final_state
