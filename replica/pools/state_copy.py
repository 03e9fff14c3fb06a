"""Moving sessions' state between pools: ``StateCopier.copy`` sets ``dst[:, d] = src[:, s]`` for
every layer of two ``[layers, slots, *state]`` tensors (a mamba pool's conv or SSM state, a KV
pool's K or V paged as ``[layers, pages, page_size, ...]``), whatever devices they live on;
``copy_state`` does it for every kind of a tier's ``StateTensors`` at the sessions' ``Places``.

The bytes cross memory once, as in a plain copy, never through a batch-sized temporary:
- a slot whose state (per layer) is large (``direct_bytes``, e.g. a real model's SSM state or a
  KV page of a real model) is one contiguous run on both sides, copied directly (on CUDA: one DMA
  straight into pinned memory); consecutive slots that stay consecutive (pages allocated
  together) merge into one run;
- small per-slot states (KV pages of a few tokens, a small model's state) are gathered, every
  layer of a chunk of slots at once, into one reusable staging buffer (``index_select(out=...)``)
  and scattered from there (``index_copy_``); on the CPU the chunk stays in cache between the
  two, on CUDA the staging buffer is pinned and is where a chunk crosses PCIe (the device side
  gathers or scatters a device chunk);
- when one side's slots are one run (a dense record of exported sessions), that side needs no
  staging: the other side's slots are gathered straight into it, or scattered straight from it.
The Python loops run over chunks of at least ``direct_bytes`` or a staging buffer's worth, never
over small rows. Copies are synchronous: a returned copy is complete.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from replica.pools.kv_pool import KVTokenPool
from replica.pools.mamba_pool import MambaPool

CPU_DIRECT_BYTES = 64 * 1024  # a run this large costs far more to move than to issue
CUDA_DIRECT_BYTES = 2 * 1024 * 1024  # each synchronous DMA this large runs near PCIe speed
CPU_STAGING_BYTES = 512 * 1024  # stays in the CPU's cache between the gather and the scatter
CUDA_STAGING_BYTES = 32 * 1024 * 1024  # large enough that each PCIe transfer runs at full speed


def contiguous_runs(src: torch.Tensor, dst: torch.Tensor) -> list[tuple[int, int, int]]:
    """``(src start, dst start, length)`` of the runs in which both slot lists count up by one
    (slots allocated together usually do), so each run is one contiguous copy."""
    breaks = ((src[1:] - src[:-1] != 1) | (dst[1:] - dst[:-1] != 1)).nonzero().flatten() + 1
    starts = [0, *breaks.tolist(), src.numel()]
    firsts_src, firsts_dst = src[starts[:-1]].tolist(), dst[starts[:-1]].tolist()
    lengths = [b - a for a, b in zip(starts, starts[1:])]
    return list(zip(firsts_src, firsts_dst, lengths))


def _one_run(slots: torch.Tensor) -> bool:
    """Whether ``slots`` count up by one from their first."""
    n = slots.numel()
    return (
        n > 0
        and int(slots[-1]) - int(slots[0]) == n - 1
        and bool((slots[1:] - slots[:-1] == 1).all())
    )


class StateTensors(NamedTuple):
    """A tier's state tensors: ``conv``/``ssm`` ``[layers, slots, *state]``, ``k``/``v``
    ``[layers, pages, page_size, heads, head_dim]`` (views of the pools' tensors)."""

    conv: torch.Tensor
    ssm: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor

    @classmethod
    def of(cls, mamba: MambaPool, kv: KVTokenPool) -> StateTensors:
        def paged(t: torch.Tensor) -> torch.Tensor:
            return t.view(t.shape[0], t.shape[1] // kv.page_size, kv.page_size, *t.shape[2:])

        return cls(mamba.conv_all, mamba.ssm_all, paged(kv.k_all), paged(kv.v_all))

    @classmethod
    def by_token(cls, mamba: MambaPool, kv: KVTokenPool) -> StateTensors:
        """The pools' tensors with K/V addressed by token slot (``[layers, tokens, ...]``)."""
        return cls(mamba.conv_all, mamba.ssm_all, kv.k_all, kv.v_all)

    def transient(self, slots: int, pages: int) -> StateTensors:
        """Empty CPU tensors shaped like these, for ``slots`` mamba slots and ``pages`` pages."""
        return StateTensors(
            *(
                torch.empty((t.shape[0], n, *t.shape[2:]), dtype=t.dtype)
                for t, n in zip(self, (slots, slots, pages, pages))
            )
        )


class Places(NamedTuple):
    """Where a batch of sessions' state lies in one tier: mamba slots, KV pages (in order; KV
    token slots for ``StateTensors.by_token``)."""

    mamba: torch.Tensor
    pages: torch.Tensor

    @classmethod
    def dense(cls, slots: int, pages: int) -> Places:
        return cls(torch.arange(slots), torch.arange(pages))


class StateCopier:
    """Copies slots' state between pools through one staging buffer (pinned on CUDA)."""

    def __init__(
        self,
        cuda: bool = False,
        staging_bytes: int | None = None,
        direct_bytes: int | None = None,
    ) -> None:
        size = staging_bytes or (CUDA_STAGING_BYTES if cuda else CPU_STAGING_BYTES)
        self.direct_bytes = direct_bytes or (CUDA_DIRECT_BYTES if cuda else CPU_DIRECT_BYTES)
        self.staging = torch.empty(size, dtype=torch.uint8, pin_memory=cuda)

    def copy(
        self,
        src: torch.Tensor,
        src_slots: torch.Tensor,
        dst: torch.Tensor,
        dst_slots: torch.Tensor,
    ) -> int:
        """``dst[:, dst_slots] = src[:, src_slots]`` (all layers); returns the bytes copied.

        ``src`` and ``dst`` have the same layer count, dtype and per-slot state shape, and are
        two tensors (a copy within one pool gathers, then scatters: its gathers would write into
        a view of their own source); the slot lists have the same length and ``dst_slots`` has
        no repeats."""
        if src.shape[0] != dst.shape[0] or src.shape[2:] != dst.shape[2:] or src.dtype != dst.dtype:
            raise ValueError(f"cannot copy {tuple(src.shape)} {src.dtype} into {tuple(dst.shape)}")
        if src_slots.numel() != dst_slots.numel():
            raise ValueError(f"{src_slots.numel()} source slots for {dst_slots.numel()} targets")
        if src_slots.numel() == 0 or src.shape[0] == 0:
            return 0
        if src.untyped_storage().data_ptr() == dst.untyped_storage().data_ptr():
            raise ValueError("a copy within one pool's tensor: gather, then scatter")
        slot_bytes = math.prod(src.shape[2:]) * src.element_size()
        if slot_bytes >= self.direct_bytes:
            runs = contiguous_runs(src_slots.cpu(), dst_slots.cpu())
            for layer in range(src.shape[0]):
                for s, d, n in runs:
                    dst[layer, d : d + n].copy_(src[layer, s : s + n])
        elif not self._copy_one_run(src, src_slots, dst, dst_slots):
            self._copy_staged(src, src_slots, dst, dst_slots)
        return src.shape[0] * len(src_slots) * slot_bytes

    @staticmethod
    def _copy_one_run(
        src: torch.Tensor, src_slots: torch.Tensor, dst: torch.Tensor, dst_slots: torch.Tensor
    ) -> bool:
        """Gather straight into ``dst`` when ``dst_slots`` is one run on ``src``'s device, or
        scatter straight from ``src`` when ``src_slots`` is one run; False when neither is."""
        layers, width = src.shape[0], math.prod(src.shape[2:])
        if src.device == dst.device and _one_run(dst_slots):
            first = int(dst_slots[0])
            out = dst.view(layers, dst.shape[1], width)[:, first : first + dst_slots.numel()]
            idx = src_slots.to(src.device)
            torch.index_select(src.view(layers, src.shape[1], width), 1, idx, out=out)
            return True
        if _one_run(src_slots):
            first = int(src_slots[0])
            part = src.view(layers, src.shape[1], width)[:, first : first + src_slots.numel()]
            dst.view(layers, dst.shape[1], width).index_copy_(
                1, dst_slots.to(dst.device), part.to(dst.device)
            )
            return True
        return False

    def _copy_staged(
        self, src: torch.Tensor, src_slots: torch.Tensor, dst: torch.Tensor, dst_slots: torch.Tensor
    ) -> None:
        layers, width = src.shape[0], math.prod(src.shape[2:])
        slot_bytes = layers * width * src.element_size()  # one slot, every layer
        if slot_bytes > self.staging.numel():  # many layers: hold one slot of each, once
            self.staging = torch.empty(
                slot_bytes, dtype=torch.uint8, pin_memory=self.staging.is_pinned()
            )
        chunk = self.staging.numel() // slot_bytes
        src3 = src.view(layers, src.shape[1], width)
        dst3 = dst.view(layers, dst.shape[1], width)
        src_idx, dst_idx = src_slots.to(src.device), dst_slots.to(dst.device)
        for start in range(0, src_idx.numel(), chunk):
            s, d = src_idx[start : start + chunk], dst_idx[start : start + chunk]
            part = self.staging[: s.numel() * slot_bytes].view(src.dtype).view(layers, -1, width)
            if src.device == part.device:
                torch.index_select(src3, 1, s, out=part)
            else:
                part.copy_(src3.index_select(1, s))
            dst3.index_copy_(1, d, part if dst.device == part.device else part.to(dst.device))

    def copy_state(self, src: StateTensors, at: Places, dst: StateTensors, to: Places) -> int:
        """Every state kind of the sessions at ``at`` in ``src`` to ``to`` in ``dst``."""
        kinds = (at.mamba, at.mamba, at.pages, at.pages), (to.mamba, to.mamba, to.pages, to.pages)
        return sum(self.copy(*args) for args in zip(src, kinds[0], dst, kinds[1]))
