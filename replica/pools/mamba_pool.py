"""``MambaPool``: the recurrent state of every mamba layer, one slot per sequence state.

Per mamba layer a conv state ``[slots, conv_dim, d_conv-1]`` and an SSM state
``[slots, n_heads, head_dim, d_state]``. A freshly allocated slot holds zero state, so a new
sequence starts from the model's initial state. ``copy(src, dst)`` copies every layer's state,
which is how a turn snapshot is taken and restored. Double free and freeing a slot that was
never allocated raise ``SlotStateError``.

With ``scratch``, one more slot (``scratch_slot``, index ``slots``) lies beyond the allocator:
never handed out or counted, it is where the padding rows of a decode batch padded to a fixed size
read and write (its contents are meaningless).
"""

from __future__ import annotations

import torch

from replica.model.config import ModelConfig
from replica.pools.slot_allocator import SlotAllocator


class MambaPool:
    def __init__(
        self,
        model: ModelConfig,
        slots: int,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        name: str = "mamba",
        pin_memory: bool = False,
        scratch: bool = False,
    ) -> None:
        self.slots = slots
        self.device = device
        self.scratch_slot = slots if scratch else None
        n, held = model.num_mamba_layers, slots + scratch
        # One tensor per state kind for all layers, so zeroing or copying a batch of slots is one
        # op, not one per layer; ``conv[i]`` and ``ssm[i]`` are per-layer views the model uses.
        self.conv_all, self.ssm_all = (
            torch.zeros((n, held, *shape), dtype=dtype, device=device, pin_memory=pin_memory)
            for shape in (model.conv_state_shape, model.ssm_state_shape)
        )
        self.conv = list(self.conv_all.unbind(0))
        self.ssm = list(self.ssm_all.unbind(0))
        self.allocator = SlotAllocator(slots, name)

    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    def can_alloc(self, n: int) -> bool:
        return self.allocator.can_alloc(n)

    def alloc(self, n: int, zeroed: bool = True) -> torch.Tensor:
        """Take ``n`` slots, zeroed unless the caller overwrites them at once (``zeroed=False``).
        All-or-nothing; raises ``PoolExhaustedError`` when full."""
        idx = self.allocator.alloc(n)
        if n and zeroed:
            self.zero(idx)
        return idx

    def free(self, idx: torch.Tensor | list[int] | int) -> None:
        self.allocator.free(idx)

    def zero(self, idx: torch.Tensor) -> None:
        dev_idx = idx.to(self.device)
        self.conv_all.index_fill_(1, dev_idx, 0)
        self.ssm_all.index_fill_(1, dev_idx, 0)

    def copy(self, src: torch.Tensor | int, dst: torch.Tensor | int) -> None:
        """Copy the state of slots ``src`` into slots ``dst`` (same length), every layer."""
        if isinstance(src, int) and isinstance(dst, int):  # a turn's snapshot: two views a kind
            for states in (self.conv_all, self.ssm_all):
                states[:, dst].copy_(states[:, src])
            return
        src_t = torch.as_tensor(src, dtype=torch.int64, device=self.device).reshape(-1)
        dst_t = torch.as_tensor(dst, dtype=torch.int64, device=self.device).reshape(-1)
        self.conv_all.index_copy_(1, dst_t, self.conv_all.index_select(1, src_t))
        self.ssm_all.index_copy_(1, dst_t, self.ssm_all.index_select(1, src_t))

    def check_integrity(self) -> None:
        self.allocator.check_integrity()
