"""``Req``: one turn of a session while it runs, and what it owns; ``SamplingParams``.

Ownership: between ``StreamingSession.restore_to_req`` and the end of the turn
(``save_from_req`` or ``rollback``) the request owns the session's req row, mamba slots and KV
pages; outside that window its slot fields are ``None``/empty and it owns nothing.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

from replica.errors import InvalidRequestError
from replica.pools.hybrid_pool import SeqSlots

_rids = itertools.count()


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_new_tokens: int = 16
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0  # 0 or 1: off
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise InvalidRequestError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if not 0.0 <= self.temperature <= 100.0 or self.temperature != self.temperature:
            raise InvalidRequestError(f"temperature must be in [0, 100], got {self.temperature}")
        if not 0.0 <= self.top_p <= 1.0 or self.top_p != self.top_p:
            raise InvalidRequestError(f"top_p must be in [0, 1], got {self.top_p}")
        if not 0 <= self.seed < 2**64:
            raise InvalidRequestError(f"seed must be in [0, 2**64), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class FinishReason(enum.IntEnum):
    """Values match ``session_router.v1.FinishReason``."""

    UNSPECIFIED = 0
    STOP = 1
    LENGTH = 2
    INTERRUPTED = 3


@dataclass(eq=False, slots=True)
class Req:
    session_id: str
    input_ids: list[int]  # tokens this turn folds into the state (the session's pending first)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    rid: int = field(default_factory=lambda: next(_rids))
    # Slots owned while the turn runs.
    req_pool_idx: int | None = None
    mamba_pool_idx: int | None = None
    mamba_track_buffer: tuple[int, ...] = ()
    prefix_len: int = 0  # tokens folded into the session's state before this turn
    folded_len: int = 0  # tokens folded into the state now (KV written, mamba state updated)
    kv_len: int = 0  # positions with KV slots in req_to_token (reserved for the whole turn)
    output_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None

    @property
    def owns_slots(self) -> bool:
        return self.req_pool_idx is not None

    @property
    def turn_folded(self) -> int:
        """Tokens of this turn folded in so far: input first, then generated tokens."""
        return self.folded_len - self.prefix_len

    def seq_slots(self) -> SeqSlots:
        if self.req_pool_idx is None or self.mamba_pool_idx is None:
            raise RuntimeError(f"request {self.rid} owns no slots")
        return SeqSlots(self.req_pool_idx, self.mamba_pool_idx, self.mamba_track_buffer)

    def clear_slots(self) -> None:
        self.req_pool_idx = None
        self.mamba_pool_idx = None
        self.mamba_track_buffer = ()
        self.kv_len = 0
