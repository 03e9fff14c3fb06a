"""``StateRows``: a view of each decode row's temporal state where it lives in the pool, so a
decode step updates the batch's recurrent state in place instead of copying it out and back.

A decode step of a recurrent mixer updates every row's state with ``torch._foreach_*`` ops over
these views (one call for the whole batch, the work per row done in C++) and reads it for its
output with one product per row: nothing is gathered (an ``index_select`` of the batch's states
for one batched product cost as much again as the products). Scattering the updated copy back with
``index_copy_`` cost more than the rest of the state's update together on the CPU (it moves the
largest tensor of the step at a third of ``copy_``'s speed).

Built once per decode batch (the engine keeps it while the batch's turns are the same); the views
stay valid because the pools never reallocate their tensors. Only for float32 state on the CPU:
updated in place, a lower-precision state would round after each op (the gathered path computes
in float32 and rounds once), and on CUDA the fused kernels or a per-row launch would be the cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch


class StateRows(NamedTuple):
    ssm: list[list[torch.Tensor]]  # [recurrent layer][row]: that row's slot of ``LayerBuffers.ssm``

    @classmethod
    def build(
        cls, ssm_buffers: Sequence[torch.Tensor], slots: Sequence[int] | torch.Tensor
    ) -> StateRows | None:
        """The views of ``slots`` in each layer's temporal-state buffer, or None when the state
        is updated by copy instead (not float32, or not on the CPU, or no layers). Slots are
        distinct but for a padded batch's scratch slot (its contents are meaningless). A tensor
        of slots is read on the host only when the views are built (never on CUDA)."""
        if not ssm_buffers or any(
            buf.dtype != torch.float32 or buf.device.type != "cpu" for buf in ssm_buffers
        ):
            return None
        if isinstance(slots, torch.Tensor):
            slots = slots.tolist()
        return cls(ssm=[[buf[s] for s in slots] for buf in ssm_buffers])
