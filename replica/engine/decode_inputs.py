"""``DecodeInputs``: the index tensors of the decode batch, kept between steps while its turns
are the same (rebuilt when a turn joins, ends or is interrupted).

The rows of ``req_to_token``, the mamba slots and the positions of the batch live on the pool's
device; a step of the same turns only advances the positions (a turn's KV is reserved for its
whole turn at admission, so its next position's slot is already in its row). The views of the
turns' recurrent state in the pool (``StateRows``) are built with them. Owned by the
``ModelRunner``, on the engine thread.
"""

from __future__ import annotations

import torch

from replica.model.state_rows import StateRows
from replica.sessions.request import Req


class DecodeInputs:
    def __init__(self, reqs: list[Req], ssm: list[torch.Tensor], device: torch.device) -> None:
        self.reqs = list(reqs)
        positions = [req.folded_len for req in reqs]
        self.width = max(positions) + 1  # KV columns the longest row reads, its new token's too
        self.positions = torch.tensor(positions, dtype=torch.long, device=device)
        self.rows = torch.tensor([r.slots.req_pool_idx for r in reqs], device=device)
        slots = [r.slots.mamba_pool_idx for r in reqs]
        self.mamba_slots = torch.tensor(slots, device=device)
        self.state_rows = StateRows.build(ssm, slots)

    def same(self, reqs: list[Req]) -> bool:
        """Whether ``reqs`` are this batch's turns, in order (identity, compared in C)."""
        return self.reqs == reqs

    def advance(self) -> None:
        """Every row folded its token in: one position on."""
        self.positions = self.positions + 1
        self.width += 1
