"""``DecodeInputs``: the index tensors of the decode batch, kept between steps while its turns
are the same (rebuilt when a turn joins, ends or is interrupted).

The rows of ``req_to_token``, the mamba slots and the positions of the batch live on the pool's
device; a step of the same turns only advances the positions (a turn's KV is reserved for its
whole turn at admission, so its next position's slot is already in its row). The views of the
turns' recurrent state in the pool (``StateRows``) are built with them. With padding
(``DecodeShapes``) the batch has ``pad`` more rows after the turns': position 0 on, the scratch
req row (every position maps to the KV scratch slot) and the scratch mamba slot, so they move no
session's state. Owned by the ``ModelRunner``, on the engine thread.
"""

from __future__ import annotations

import torch

from replica.engine.decode_shapes import DecodeShapes
from replica.model.state_rows import StateRows
from replica.sessions.request import Req


class DecodeInputs:
    def __init__(
        self,
        reqs: list[Req],
        ssm: list[torch.Tensor],
        shapes: DecodeShapes,
        scratch: tuple[int, int],
        device: torch.device,
    ) -> None:
        """``scratch``: the pools' scratch req row and mamba slot (for padding rows)."""
        self.reqs = list(reqs)
        self.shapes = shapes
        self.pad = shapes.batch(len(reqs)) - len(reqs)
        positions = [req.folded_len for req in reqs]
        self.width = max(positions) + 1  # KV columns the longest row reads, its new token's too
        self.positions = torch.tensor(positions + [0] * self.pad, dtype=torch.long, device=device)
        rows = [r.slots.req_pool_idx for r in reqs] + [scratch[0]] * self.pad
        self.rows = torch.tensor(rows, device=device)
        slots = [r.slots.mamba_pool_idx for r in reqs] + [scratch[1]] * self.pad
        self.mamba_slots = torch.tensor(slots, device=device)
        self.state_rows = StateRows.build(ssm, slots)

    def same(self, reqs: list[Req]) -> bool:
        """Whether ``reqs`` are this batch's turns, in order (identity, compared in C)."""
        return self.reqs == reqs

    @property
    def columns(self) -> int:
        """The KV columns the step reads (``width``, padded)."""
        return self.shapes.width(self.width)

    def ids(self, reqs: list[Req]) -> torch.Tensor:
        """Each turn's last generated token, then the padding rows' (0), on the host."""
        return torch.tensor([req.output_ids[-1] for req in reqs] + [0] * self.pad)

    def advance(self) -> None:
        """Every row folded its token in: one position on."""
        self.positions = self.positions + 1
        self.width += 1
