"""``StateRows``: a view of each decode row's temporal state where it lives in the pool, so a
decode step updates and reads the batch's recurrent state in place instead of copying it out and
back.

A decode step of a Mamba2 layer updates every row's state with ``torch._foreach_*`` ops over
these views and reads it for its output with ``torch._foreach_mm`` over the rows' state
matrices (``LayerRows.matrices``): one call each for the whole batch, the work per row done in
C++, nothing gathered. Scattering an updated copy back with ``index_copy_`` cost more than the
rest of the state's update together on the CPU (it moves the largest tensor of the step at a
third of ``copy_``'s speed), and gathering the batch's states for one batched product as much
again as the products. A gated DeltaNet layer reads its updated states by one gather: its read
is a small product a head, too many for one call a matrix to pay (measured: no faster).

Built once per decode batch (the engine keeps it while the batch's turns are the same); the views
stay valid because the pools never reallocate their tensors. Only for float32 state on the CPU:
updated in place, a lower-precision state would round after each op (the gathered path computes
in float32 and rounds once), and on CUDA the fused kernels or a per-row launch would be the cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch


class LayerRows:
    """One recurrent layer's views of the batch's rows: ``views[b]`` is row ``b``'s slot of the
    layer's temporal-state buffer."""

    __slots__ = ("views", "_matrices")

    def __init__(self, views: list[torch.Tensor]) -> None:
        self.views = views
        self._matrices: dict[int, list[torch.Tensor]] = {}

    def matrices(self, groups: int) -> list[torch.Tensor]:
        """Each row's state as ``groups`` matrices ``[rest, last dim]`` (row by row, group by
        group), views made on first use and kept with the rows."""
        found = self._matrices.get(groups)
        if found is None:
            n = self.views[0].shape[-1]
            found = [m for view in self.views for m in view.view(groups, -1, n).unbind(0)]
            self._matrices[groups] = found
        return found


class StateRows(NamedTuple):
    ssm: list[LayerRows]  # [recurrent layer]: the rows' slots of its ``LayerBuffers.ssm``

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
        return cls(ssm=[LayerRows([buf[s] for s in slots]) for buf in ssm_buffers])
