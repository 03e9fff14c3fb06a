"""The index tensors one forward call shares across its layers: who sits where, which keys each
query sees, and which state slots each row reads and writes."""

from __future__ import annotations

from typing import NamedTuple

import torch

from replica.model.state_rows import StateRows


class ExtendBatch(NamedTuple):
    """Right-padded chunks of ``B`` sequences, ``L`` = the longest chunk, ``T`` = the longest
    ``start + length``. Built by :meth:`build`, which checks the caller's arguments."""

    ids: torch.Tensor  # [B, L] token ids (padding 0)
    positions: torch.Tensor  # [B, L] absolute positions
    lengths: torch.Tensor  # [B] real tokens per row
    real: torch.Tensor  # [B, L] bool, not padding
    fresh: torch.Tensor  # [B] bool, the row starts from zero recurrent state
    mamba_slots: torch.Tensor  # [B] recurrent-state slot per row
    kv: torch.Tensor  # [B, T] KV slot of each position (padding: slot 0, never valid)
    new_slots: torch.Tensor  # KV slots of the real new tokens, row-major
    valid: torch.Tensor  # [B, L, T] bool, key t visible to query l
    causal: bool  # every row starts at 0 with the same length: ``valid`` is the causal mask

    @classmethod
    def build(
        cls,
        input_ids: list[torch.Tensor],
        start_pos: list[int],
        mamba_slots: torch.Tensor,
        kv_slots: list[torch.Tensor],
        device: torch.device,
    ) -> ExtendBatch:
        batch = len(input_ids)
        if batch == 0 or len(start_pos) != batch or len(kv_slots) != batch:
            raise ValueError("forward_extend_batch needs one start_pos and kv_slots per sequence")
        if int(mamba_slots.shape[0]) != batch:
            raise ValueError(f"mamba_slots has {mamba_slots.shape[0]} entries, expected {batch}")
        for ids, start, slots in zip(input_ids, start_pos, kv_slots, strict=True):
            if ids.shape[0] == 0:
                raise ValueError("forward_extend_batch needs at least one token per sequence")
            if slots.shape[0] != start + ids.shape[0]:
                raise ValueError(
                    f"kv_slots has {slots.shape[0]} entries, expected start_pos + L = "
                    f"{start + ids.shape[0]}"
                )
        pad = torch.nn.utils.rnn.pad_sequence
        ids = pad([t.to(device=device, dtype=torch.long) for t in input_ids], batch_first=True)
        slots = [t.to(device=device, dtype=torch.long) for t in kv_slots]
        kv = pad(slots, batch_first=True)
        new_slots = torch.cat([t[s:] for t, s in zip(slots, start_pos, strict=True)])
        lengths = torch.tensor([t.shape[0] for t in input_ids], device=device)
        starts = torch.tensor(start_pos, dtype=torch.long, device=device)
        offsets = torch.arange(ids.shape[1], device=device)
        positions = starts[:, None] + offsets[None, :]
        keys = torch.arange(kv.shape[1], device=device)[None, None, :]
        valid = (keys <= positions[..., None]) & (keys < (starts + lengths)[:, None, None])
        return cls(
            ids=ids,
            positions=positions,
            lengths=lengths,
            real=offsets[None, :] < lengths[:, None],
            fresh=starts == 0,
            mamba_slots=mamba_slots.to(device=device, dtype=torch.long),
            kv=kv,
            new_slots=new_slots,
            valid=valid,
            causal=not any(start_pos) and len({t.shape[0] for t in input_ids}) == 1,
        )


class DecodeBatch(NamedTuple):
    """One new token for each of ``B`` sequences; ``T`` = the longest KV length."""

    ids: torch.Tensor  # [B]
    positions: torch.Tensor  # [B]
    mamba_slots: torch.Tensor  # [B]
    kv: torch.Tensor  # [B, T] KV slots (entries beyond a row's length replaced by slot 0)
    new_slots: torch.Tensor  # [B] KV slot of each new token
    valid: torch.Tensor  # [B, T] bool
    rows: StateRows | None  # each row's temporal state in place (None: gathered by slot)
    inert: torch.Tensor | None  # [B] bool, the padding rows: their step leaves the SSM state

    @classmethod
    def build(
        cls,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mamba_slots: torch.Tensor,
        kv_slots: torch.Tensor,
        kv_lens: torch.Tensor,
        rows: StateRows | None,
        device: torch.device,
        padding_slot: int | None = None,
    ) -> DecodeBatch:
        """``padding_slot``: the mamba slot a padded batch's padding rows share (none: no
        padding rows)."""
        kv_slots = kv_slots.to(device=device, dtype=torch.long)
        kv_lens = kv_lens.to(device=device, dtype=torch.long)
        valid = torch.arange(kv_slots.shape[1], device=device)[None, :] < kv_lens[:, None]
        mamba_slots = mamba_slots.to(device=device, dtype=torch.long)
        return cls(
            ids=input_ids.to(device),
            positions=positions.to(device),
            mamba_slots=mamba_slots,
            kv=kv_slots.masked_fill(~valid, 0),
            new_slots=kv_slots.gather(1, (kv_lens - 1)[:, None])[:, 0],
            valid=valid,
            rows=rows,
            inert=None if padding_slot is None else mamba_slots == padding_slot,
        )
