"""``SessionsAPI``: the replica actor's calls about sessions (mixed into ``ReplicaActor``): open,
close, turns, interrupts and cancels, stream leases, and looking sessions up. Each runs on the
engine thread between steps; refusals come back as ``ActorError`` values.
"""

from __future__ import annotations

from typing import Any

from replica.api import (
    ActorError,
    Closed,
    Opened,
    ReleaseReason,
    SamplingParams,
    SessionInfo,
    SessionMovingError,
    StatusCode,
)


class SessionsAPI:
    engine: Any
    tokenizer: Any

    async def _call(self, fn, *args) -> Any:  # provided by ReplicaActor
        raise NotImplementedError

    async def open_session(
        self,
        session_id: str,
        idle_timeout_s: float = 0.0,
        gateway_id: str = "",
        tenant: str = "",
        lease_s: float = 0.0,
    ) -> Opened | ActorError:
        """Open a session; the reply carries the snapshot taken right after, so the router's
        view of this replica's room is never older than its own placements. ``lease_s`` > 0:
        a stream holds it open (see ``hold_sessions``) from the start."""

        def open_one() -> Opened:
            info = self.engine.open_session(session_id, idle_timeout_s, tenant, gateway_id)
            if lease_s > 0:
                self.engine.leases.hold([session_id], lease_s)
            return Opened(info, self.engine.snapshot())

        return await self._call(open_one)

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

        return await self._call(close_all)

    async def submit_turn(
        self,
        gateway_id: str,
        session_id: str,
        text: str | None,
        token_ids: list[int] | None,
        sampling: SamplingParams,
    ) -> int | ActorError:
        """Queue a turn; returns its turn id. Its events go to ``gateway_id``'s stream."""
        if text is not None and token_ids is not None:
            return ActorError(StatusCode.INVALID_ARGUMENT, "give either text or tokens, not both")
        ids = self.tokenizer.encode(text) if text is not None else list(token_ids or [])
        return await self._call(
            lambda: self.engine.submit(session_id, ids, sampling, gateway_id).rid
        )

    async def hold_sessions(self, session_ids: list[str], lease_s: float) -> list[str] | ActorError:
        """Suspend the idle timeout of these sessions for ``lease_s`` seconds: their Converse
        streams are open (the gateway renews this well within ``lease_s``). Returns those not
        open here (they moved to another replica, or ended)."""

        def hold() -> list[str]:
            self.engine.leases.hold(session_ids, lease_s)
            return [sid for sid in session_ids if sid not in self.engine.sessions.sessions]

        return await self._call(hold)

    async def interrupt(self, session_id: str) -> bool | ActorError:
        return await self._call(self.engine.interrupt, session_id)

    async def cancel(
        self, session_id: str, why: str = "cancelled by the client", turn_id: int | None = None
    ) -> bool | ActorError:
        return await self._call(self.engine.cancel, session_id, why, turn_id)

    async def get_session(self, session_id: str) -> SessionInfo | ActorError:
        return await self._call(self.engine.session_info, session_id)

    async def list_sessions(self) -> dict[str, str] | ActorError:
        """Every session the replica holds, with its tenant."""
        return await self._call(self.engine.session_tenants)
