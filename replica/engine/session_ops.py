"""``SessionOps``: the engine's session-level operations: open, close, look up, release idle
sessions, park idle ones, and note state changes for checkpoints.

The engine builds it over the parts it owns (the session table, the scheduler, the stream
leases, the checkpoint log) and delegates to it. It holds whether the replica is draining (a
draining replica opens no session). Its methods run on the engine thread, between steps, like
every engine method.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from replica.api import (
    ContextOverflowError,
    InvalidRequestError,
    ReleaseReason,
    ReplicaDrainingError,
    SessionInfo,
    SessionMovingError,
    SessionStates,
)
from replica.checkpoints.log import CheckpointBatch, CheckpointLog
from replica.config import ReplicaConfig
from replica.sessions.table import SessionRecord, SessionTable

if TYPE_CHECKING:
    from replica.engine.scheduler import Scheduler
    from replica.sessions.stream_leases import StreamLeases
    from replica.sessions.transfer import StateTransfer


class SessionOps:
    def __init__(
        self,
        config: ReplicaConfig,
        vocab_size: int,
        replica_id: str,
        sessions: SessionTable,
        scheduler: Scheduler,
        leases: StreamLeases,
        checkpoints: CheckpointLog | None,
        transfer: StateTransfer,
        cancel: Callable[[str, str], bool],
    ) -> None:
        """``checkpoints`` None: checkpoints are off; ``cancel(session_id, why)``: the engine's,
        which ends the session's turn (a close cancels it first)."""
        self.config = config
        self.vocab_size = vocab_size
        self.replica_id = replica_id
        self.sessions = sessions
        self.scheduler = scheduler
        self.leases = leases
        self.checkpoints = checkpoints
        self.transfer = transfer
        self.cancel = cancel
        self.draining = False

    def open_session(
        self,
        session_id: str,
        idle_timeout_s: float = 0.0,
        tenant: str = "",
        gateway_id: str = "",
        prefix_ids: Sequence[int] | None = None,
    ) -> SessionInfo:
        """Open a session (its slots are reserved now); the idle timeout is capped by the
        replica's. ``gateway_id`` is where its turn events go until a turn says otherwise.
        ``prefix_ids``: the session starts holding them (``committed_tokens``), from the longest
        cached state that begins them (``cached_tokens``); ids outside the vocabulary are
        ``InvalidRequestError``, a prefix longer than the context ``ContextOverflowError``."""
        if self.draining:
            raise ReplicaDrainingError(f"replica {self.replica_id} is draining")
        if prefix_ids is not None:
            self.check_prefix(prefix_ids)
        cap = self.config.session_idle_timeout_s
        timeout = min(idle_timeout_s, cap) if idle_timeout_s > 0 else cap
        prefix = None if prefix_ids is None else tuple(prefix_ids)
        return self.info(self.sessions.open(session_id, timeout, tenant, gateway_id, prefix))

    def check_prefix(self, prefix_ids: Sequence[int]) -> None:
        vocab, limit = self.vocab_size, self.config.pools.max_context
        bad = [t for t in prefix_ids if not (type(t) is int and 0 <= t < vocab)]
        if bad:
            raise InvalidRequestError(
                f"prefix token ids {bad[:8]} are outside the vocabulary 0..{vocab - 1}"
            )
        if len(prefix_ids) > limit:
            raise ContextOverflowError(
                f"the prefix has {len(prefix_ids)} tokens, more than the context of {limit}; "
                "shorten it"
            )

    def fork_session(self, parent_id: str, child_id: str, gateway_id: str = "") -> SessionInfo:
        """Open ``child_id`` with ``parent_id``'s committed state (a turn running on the parent
        is not part of it); the child's turn events go to ``gateway_id``."""
        if self.draining:
            raise ReplicaDrainingError(f"replica {self.replica_id} is draining")
        return self.info(self.sessions.fork(parent_id, child_id, gateway_id))

    def close_session(
        self, session_id: str, reason: ReleaseReason = ReleaseReason.CLOSED, force: bool = False
    ) -> bool:
        """Release the session; a turn in flight is cancelled first. Idempotent. A session
        moving to another replica is refused (``SessionMovingError``) unless ``force``."""
        slot = self.sessions.sessions.get(session_id)
        if slot is not None and slot.moving and not force:
            raise SessionMovingError(f"session {session_id} is moving to another replica")
        self.cancel(session_id, "session closed")
        return self.sessions.release_session(session_id, reason)

    def info(self, slot: SessionRecord) -> SessionInfo:
        return SessionInfo(
            slot.session_id,
            slot.committed_tokens,
            self.config.pools.max_context,
            self.scheduler.find(slot.session_id)[0] is not None,
            slot.idle_timeout_s,
            slot.parked,
            slot.cached_tokens,
        )

    def session_info(self, session_id: str) -> SessionInfo:
        return self.info(self.sessions.get(session_id))

    def session_tenants(self) -> dict[str, str]:
        """Every open session and its tenant (what a restarted router rebuilds its table from)."""
        return {
            s.session_id: s.tenant
            for s in self.sessions.sessions.values()
            if s.close_reason is None
        }

    def blank_sessions(self) -> dict[str, float]:
        """The open sessions that hold nothing yet (no token committed), and their idle
        timeouts: a failover that finds no checkpoint of one may open it again, empty."""
        return {
            s.session_id: s.idle_timeout_s
            for s in self.sessions.sessions.values()
            if s.close_reason is None and s.committed_tokens == 0
        }

    def moving_sessions(self) -> list[str]:
        """The open sessions marked moving to another replica (``SessionMoves.mark``)."""
        return [s.session_id for s in self.sessions.sessions.values() if s.moving]

    def release_idle(self) -> list[str]:
        """Release the sessions idle past their timeout, except those with a turn waiting and
        those a stream holds open (``leases``); returns their ids."""
        self.leases.prune(self.sessions.sessions)
        busy = {req.session_id for req in self.scheduler.waiting}
        expired = [
            sid
            for sid in self.sessions.idle_expired()
            if not (sid in busy or self.leases.held(sid))
        ]
        for sid in expired:
            self.sessions.release_session(sid, ReleaseReason.IDLE_TIMEOUT)
        return expired

    def park_idle(self) -> int:
        """Park the sessions idle for ``park_after_idle_s`` (when set); returns how many."""
        if not self.config.park_after_idle_s:
            return 0
        return self.sessions.residency.park_idle(self.config.park_after_idle_s)

    def close_all(self, reason: ReleaseReason = ReleaseReason.CLOSED) -> None:
        for session_id in list(self.sessions.sessions):
            self.close_session(session_id, reason, force=True)

    def checkpoint_changed(self, slots: Iterable[SessionRecord]) -> None:
        """Sessions whose state changed: checkpointed after this step (when checkpoints are
        on)."""
        if self.checkpoints is not None:
            self.checkpoints.changed(slots)

    def checkpoint_all(self) -> int:
        """Note every open session changed (a new store follows, which holds none of them): each
        is checkpointed after this step, or at its turn's end; returns how many."""
        if self.checkpoints is None:
            return 0
        slots = list(self.sessions.sessions.values())
        self.checkpoints.renew(slots)
        return len(slots)

    def take_checkpoints(self) -> CheckpointBatch | None:
        """What the steps since the last call leave to checkpoint (None: checkpoints off)."""
        if self.checkpoints is None:
            return None
        return self.checkpoints.take(self._export_checkpoint)

    def _export_checkpoint(
        self, slots: Sequence[SessionRecord], kv_from: dict[str, int] | None = None
    ) -> SessionStates:
        """A checkpoint record, with what is left of each session's stream lease: a failover
        holds a session a stream held where it lands (``SessionMoves.import_``)."""
        leases = self.leases.remaining([s.session_id for s in slots])
        return self.transfer.export(slots, leases, kv_from)
