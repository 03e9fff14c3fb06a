"""``Req``: one turn of a session while it runs, and the slots it owns meanwhile.

Ownership: between ``SessionTable.restore_to_req`` and the end of the turn
(``save_from_req`` or ``rollback``) the request owns the session's slots (``seq``: its req row and
mamba slots) and the KV pages of positions ``0..kv_len-1``; outside that window ``seq`` is None
and it owns nothing.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from replica.api import SamplingParams
from replica.pools.hybrid_pool import SeqSlots

_rids = itertools.count()


def _builtin_sampling() -> SamplingParams:
    """What ``GenerationDefaults().apply`` gives an empty ``SamplingParams`` (a turn's sampling
    is always concrete: the engine fills it in before the turn is made)."""
    return SamplingParams(max_new_tokens=16, temperature=0.0, top_p=1.0, top_k=0)


@dataclass(eq=False, slots=True)
class Req:
    session_id: str
    input_ids: list[int]  # tokens this turn folds into the state (the session's pending first)
    sampling: SamplingParams = field(default_factory=_builtin_sampling)
    rid: int = field(default_factory=lambda: next(_rids))
    seq: SeqSlots | None = None  # the session's slots, owned while the turn runs
    prefix_len: int = 0  # tokens folded into the session's state before this turn
    folded_len: int = 0  # tokens folded into the state now (KV written, mamba state updated)
    kv_len: int = 0  # positions with KV slots in req_to_token (reserved for the whole turn)
    output_ids: list[int] = field(default_factory=list)

    @property
    def slots(self) -> SeqSlots:
        """The slots the running turn owns; raises when it owns none."""
        if self.seq is None:
            raise RuntimeError(f"request {self.rid} owns no slots")
        return self.seq

    @property
    def turn_folded(self) -> int:
        """Tokens of this turn folded in so far: input first, then generated tokens."""
        return self.folded_len - self.prefix_len

    def release_slots(self) -> None:
        """Hand the slots back to the session (ownership moves; nothing is freed here)."""
        self.seq = None
        self.kv_len = 0
