"""``SessionRecord``: a replica's one record of a session, and where its state lives between turns.

Who owns what: between turns the record owns the session's slots (``seq`` on the GPU, or
``host`` while parked); while a turn runs, the turn (``turn``, a ``Req``) owns them. A session
marked ``moving`` is being exported to another replica: it takes no new turn until the move is
finished or given up.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from replica.api import ReleaseReason
from replica.pools.host_pool import HostSlots
from replica.pools.hybrid_pool import SeqSlots
from replica.sessions.request import Req


class StateLocation(str, enum.Enum):
    """Where a session's state lives between turns."""

    GPU = "gpu"  # resident: ``SessionRecord.seq`` (req row, mamba slots, KV pages of its row)
    HOST = "host"  # parked: ``SessionRecord.host`` (host_mamba slot, host KV pages)


@dataclass(slots=True, eq=False)
class SessionRecord:
    """The replica's one record of a session: the slots it holds between turns (``turn`` is the
    running turn that owns them now), who it belongs to and where its events go. Exactly one of
    ``seq`` (resident) and ``host`` (parked) is set; a running turn's session is resident."""

    session_id: str
    seq: SeqSlots | None
    idle_timeout_s: float
    last_active: float
    tenant: str = ""  # the owner; kept so a restarted router can rebuild its table
    gateway_id: str = ""  # the gateway whose stream gets this session's turn events
    committed_len: int = 0  # tokens folded into the state; KV positions 0..committed_len-1
    pending_ids: tuple[int, ...] = ()  # produced tokens not yet folded (fed first next turn)
    # the tokens folded into the state (committed_len of them), what a cached state of it is
    # keyed by; None when this replica does not know them (a session imported from another)
    folded_ids: tuple[int, ...] | None = ()
    cached_tokens: int = 0  # of its open with a prefix: the prefix tokens a cached state gave
    turn: Req | None = None
    close_reason: ReleaseReason | None = None  # set when a close waits for the turn to end
    host: HostSlots | None = None  # while parked: its state in the host tier
    moving_since: float | None = None  # clock time it was marked moving to another replica
    # its last turn named the state it continued (a chat turn), as its next will: a turn end
    # that a failover loses is found then, so the end is not held for its checkpoint
    names_state: bool = False

    @property
    def moving(self) -> bool:
        return self.moving_since is not None

    @property
    def committed_tokens(self) -> int:
        return self.committed_len + len(self.pending_ids)

    @property
    def parked(self) -> bool:
        return self.host is not None

    @property
    def location(self) -> StateLocation:
        return StateLocation.HOST if self.parked else StateLocation.GPU

    @property
    def req_pool_idx(self) -> int:
        if self.seq is None:
            raise RuntimeError(f"session {self.session_id} is parked: it holds no req row")
        return self.seq.req_pool_idx
