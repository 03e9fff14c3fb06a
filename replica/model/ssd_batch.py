"""The Mamba2 mixer over a batch of right-padded chunks of different lengths (batched prefill).

Each row ``b`` of ``h [B, L, hidden]`` holds ``lengths[b]`` real tokens followed by padding. The
padding is made inert: its ``dt`` is set to zero, so it adds nothing to the SSM state
(``x * dt = 0``) and does not decay it (``exp(A * 0) = 1``); the final state of a row is therefore
its state after its last real token. The conv is causal, so padding after the real tokens cannot
change their outputs, and each row's final conv state is read at its own last real positions.
Row ``b`` starts from zero state when ``fresh[b]``, else from the state in ``slots[b]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from replica.model.mamba2 import Mamba2Mixer, _expand_groups, segsum


def ssd_chunk_scan_batch(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    initial_state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`replica.model.mamba2.ssd_chunk_scan` with a leading batch dimension.

    Shapes: ``x [b, L, h, p]``, ``dt [b, L, h]``, ``A [h]``, ``B``/``C [b, L, g, n]``,
    ``initial_state [b, h, p, n]``. Returns ``y [b, L, h, p]`` and final states ``[b, h, p, n]``
    (float32). Rows are independent; a row whose trailing ``dt`` is zero ends in the state it had
    after its last non-zero step.
    """
    batch, length, n_heads, _ = x.shape
    chunk_size = min(chunk_size, length)
    dt = dt.float()
    B = _expand_groups(B.float(), n_heads)
    C = _expand_groups(C.float(), n_heads)
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


def mixer_extend_batch(
    mixer: Mamba2Mixer,
    h: torch.Tensor,
    lengths: torch.Tensor,
    conv_buf: torch.Tensor,
    ssm_buf: torch.Tensor,
    slots: torch.Tensor,
    fresh: torch.Tensor,
) -> torch.Tensor:
    """Mix ``h [B, L, hidden]`` (row ``b``: ``lengths[b]`` real tokens, then padding).

    ``slots [B]`` (distinct) hold each row's conv/SSM state, ``fresh [B]`` (bool) marks rows that
    start from zero state whatever their slot holds. Each row's final state is written back into
    its slot. Outputs at padded positions are meaningless.
    """
    batch, length, _ = h.shape
    k1 = mixer.d_conv - 1
    gate, xbc, dt = mixer.in_proj(h).split(
        [mixer.intermediate, mixer.conv_dim, mixer.n_heads], dim=-1
    )
    real = torch.arange(length, device=h.device)[None, :] < lengths[:, None]  # [B, L]

    prev = conv_buf.index_select(0, slots).to(xbc.dtype)  # [B, conv_dim, k1]
    prev = torch.where(fresh[:, None, None], torch.zeros_like(prev), prev)
    window = torch.cat([prev, xbc.transpose(1, 2)], dim=-1)  # [B, conv_dim, k1 + L]
    # the last k1 inputs of row b end at its last real token: window[:, :, len_b : len_b + k1]
    idx = lengths[:, None] + torch.arange(k1, device=h.device)[None, :]  # [B, k1]
    last = window.gather(2, idx[:, None, :].expand(batch, mixer.conv_dim, k1))
    conv_buf[slots] = last.to(conv_buf.dtype)
    w = mixer.conv1d.weight
    xbc = F.conv1d(window.to(w.dtype), w, mixer.conv1d.bias, groups=mixer.conv_dim)
    xbc = F.silu(xbc).transpose(1, 2).to(h.dtype)  # [B, L, conv_dim]

    gs = mixer.n_groups * mixer.d_state
    x, B, C = xbc.split([mixer.intermediate, gs, gs], dim=-1)
    A = -torch.exp(mixer.A_log.float())
    x = x.reshape(batch, length, mixer.n_heads, mixer.head_dim)
    dt = torch.where(real[..., None], mixer._dt(dt), 0.0)  # padding: no input, no decay
    init = ssm_buf.index_select(0, slots).float()
    init = torch.where(fresh[:, None, None, None], torch.zeros_like(init), init)
    y, final = ssd_chunk_scan_batch(
        x,
        dt,
        A,
        B.reshape(batch, length, mixer.n_groups, mixer.d_state),
        C.reshape(batch, length, mixer.n_groups, mixer.d_state),
        mixer.chunk_size,
        init,
    )
    ssm_buf[slots] = final.to(ssm_buf.dtype)
    y = y + mixer.D.float()[:, None] * x.float()
    y = mixer.norm(y.reshape(batch, length, mixer.intermediate), gate)
    return mixer.out_proj(y.to(h.dtype))
