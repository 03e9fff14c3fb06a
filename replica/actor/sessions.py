"""``SessionCalls``: the replica actor's calls about sessions: opens (one by one from the router,
batched from gateways: ``replica.actor.batch_calls``), forks, closes, and looking sessions up.

Each runs on the engine thread between steps (``EngineHost.call``); refusals come back as
``ActorError`` values. Turns and leases are ``replica.actor.turns.TurnCalls``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replica.actor.batch_calls import open_batch
from replica.actor.engine_host import EngineHost
from replica.api import (
    ActorError,
    Closed,
    OpenArgs,
    Opened,
    OpenedBatch,
    ReleaseReason,
    SessionInfo,
    SessionMovingError,
)
from replica.failpoints import CallFaults

if TYPE_CHECKING:
    from replica.engine.engine import Engine


class SessionCalls:
    def __init__(self, engine: Engine, host: EngineHost, call_faults: CallFaults) -> None:
        self.engine = engine
        self.host = host
        self.call_faults = call_faults

    async def open_sessions(self, requests: list[OpenArgs]) -> OpenedBatch | ActorError:
        """Open sessions, each ``(session_id, idle_timeout_s, gateway_id, tenant, lease_s[,
        prefix])`` (``lease_s`` > 0: a stream holds it open, see ``hold_sessions``; ``prefix``:
        the text or token ids it starts holding, from a cached state); each is opened or
        refused on its own. The reply carries the snapshot taken after the last, so the caller's
        view of this replica's room is never older than its own placements."""
        self.call_faults.trip("open_sessions")
        return await self.host.call(open_batch, self.engine, requests)

    async def open_session(
        self,
        session_id: str,
        idle_timeout_s: float = 0.0,
        gateway_id: str = "",
        tenant: str = "",
        lease_s: float = 0.0,
        prefix: str | list[int] | None = None,
    ) -> Opened | ActorError:
        """``open_sessions`` of one session (``prefix``: what it starts holding)."""
        batch = await self.open_sessions(
            [(session_id, idle_timeout_s, gateway_id, tenant, lease_s, prefix)]
        )
        if isinstance(batch, ActorError):
            return batch
        result = batch.results[0]
        return result if isinstance(result, ActorError) else Opened(result, batch.snapshot)

    async def fork_session(
        self, parent_id: str, child_id: str, gateway_id: str = ""
    ) -> Opened | ActorError:
        """Open ``child_id`` with ``parent_id``'s committed state, on this replica (same tenant,
        same idle timeout); the reply carries the snapshot taken right after."""

        def fork() -> Opened:
            info = self.engine.fork_session(parent_id, child_id, gateway_id)
            return Opened(info, self.engine.snapshot())

        return await self.host.call(fork)

    async def close_sessions(
        self, session_ids: list[str], reason: ReleaseReason = ReleaseReason.CLOSED
    ) -> Closed | ActorError:
        """Release sessions (idempotent); the reply carries the snapshot taken right after.
        A session moving to another replica is not released here (``Closed.moving``)."""

        def close_all() -> Closed:
            was_open, moving = [], []
            for sid in session_ids:
                try:
                    was_open.append(self.engine.close_session(sid, reason))
                except SessionMovingError:
                    was_open.append(False)
                    moving.append(sid)
            return Closed(tuple(was_open), self.engine.snapshot(), tuple(moving))

        return await self.host.call(close_all)

    async def get_session(self, session_id: str) -> SessionInfo | ActorError:
        return await self.host.call(self.engine.session_info, session_id)

    async def list_sessions(self) -> dict[str, str] | ActorError:
        """Every session the replica holds, with its tenant."""
        return await self.host.call(self.engine.session_ops.session_tenants)

    async def blank_sessions(self) -> dict[str, float] | ActorError:
        """The open sessions that hold nothing yet, with their idle timeouts."""
        return await self.host.call(self.engine.session_ops.blank_sessions)

    async def moving_sessions(self) -> list[str] | ActorError:
        """The open sessions marked moving to another replica."""
        return await self.host.call(self.engine.session_ops.moving_sessions)
