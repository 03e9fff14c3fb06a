"""``Opener``: placing new sessions, waiting for room, and opens whose caller has gone.

An open picks a replica with ``router.control.placement`` among the router's views, opens the
session there and pins it; when no replica has room it waits for room (every release and snapshot
wakes it) up to ``open_timeout_s`` or what is left of the caller's deadline, then answers
RESOURCE_EXHAUSTED with why. A replica that fails the open because it is dead (its engine died,
or the actor) is declared dead and the next one is tried; one that does not answer for now is
skipped (the next one is tried); one whose open raised (an application error) stays in service
and the open fails INTERNAL, whatever it may have opened released.

An open is idempotent per session id (the gateway chooses it): a retry while it runs waits for
the same result. A caller that goes away (its call cancelled, its deadline passed) abandons its
open, so that the open leaves no session behind: an open still waiting for room gives up at its
next look, and one that lands anyway is released at once (reason ``aborted``). Abandoned ids are
remembered (bounded, least recently abandoned first out), so an abandon that overtakes its open
still counts.

Restores come first: a failover claims room for the sessions it has still to place
(``claim_room``, from the moment the replica is dead), and new opens wait while the room in view
is no more than what is claimed, so that the room a release or a replacement replica makes goes
to sessions that hold state, not to new ones (which are refused RESOURCE_EXHAUSTED at their
timeout, as on any full cluster). With room to spare, opens go on as ever.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from cachetools import LRUCache

from replica.api import ActorError, ReleaseReason, StatusCode
from router.call_errors import CallFailure, FailureKind, log_failure
from router.control.api import ReplicaHealth, ReplicaView, Route
from router.control.placement import candidates, choose_replica
from router.control.registry import ReplicaRegistry
from router.control.room_report import room_report
from router.control.table import BlankOpen, ReplicaEntry, SessionTable

log = logging.getLogger(__name__)

MAX_ABANDONED = 100_000


class Opener:
    def __init__(
        self,
        replicas: ReplicaRegistry,
        sessions: SessionTable,
        view: Callable[[str], ReplicaView],
        on_dead: Callable[[str, str], Awaitable[None]],
        open_timeout_s: float,
    ) -> None:
        self.replicas = replicas
        self.sessions = sessions
        self.view = view
        self.on_dead = on_dead
        self.open_timeout_s = open_timeout_s
        self.running: dict[str, asyncio.Future] = {}  # session id -> its open's result
        self._abandoned: LRUCache[str, bool] = LRUCache(MAX_ABANDONED)
        self._room = asyncio.Condition()
        self._claims: dict[str, int] = {}  # claimant (a dead replica) -> sessions it has to place

    def abandoned(self, session_id: str) -> bool:
        return session_id in self._abandoned

    async def notify_room(self) -> None:
        """Room may have appeared (a release, a snapshot, a new replica): waiting opens look."""
        async with self._room:
            self._room.notify_all()

    async def claim_room(self, claimant: str, sessions: int) -> None:
        """``claimant`` (a failover) has ``sessions`` sessions to place: new opens leave them
        that much room (0 ends the claim; idempotent)."""
        if sessions > 0:
            self._claims[claimant] = sessions
        elif self._claims.pop(claimant, None) is not None:
            await self.notify_room()

    @property
    def room_claimed(self) -> int:
        """Sessions of failovers waiting for room now."""
        return sum(self._claims.values())

    async def wait_for_room(self, timeout_s: float) -> None:
        """Wait until room may have appeared, or ``timeout_s`` has passed."""
        try:
            async with self._room:
                await asyncio.wait_for(self._room.wait(), timeout=timeout_s)
        except asyncio.TimeoutError:
            pass

    async def open(
        self,
        session_id: str,
        idle_timeout_s: float,
        tenant: str,
        gateway_id: str,
        wait_s: float | None,
        lease_s: float,
        prefix: str | list[int] | None = None,
    ) -> Route | ActorError:
        """Place the session ``session_id`` (starting from ``prefix``, text or token ids: a
        replica holding the longest cached prefix of token ids is preferred); waits for room
        up to ``open_timeout_s`` or ``wait_s``, whichever is shorter. A retry while it runs
        gets the same result; an open abandoned by its caller leaves no session behind
        (CANCELLED)."""
        if session_id in self.running:
            return await asyncio.shield(self.running[session_id])
        if wait_s is not None and wait_s <= 0:
            return _abandoned_error()  # the caller's deadline passed on the way here
        opening = self.running[session_id] = asyncio.get_running_loop().create_future()
        try:
            wait = self.open_timeout_s if wait_s is None else min(wait_s, self.open_timeout_s)
            args = (idle_timeout_s, tenant, gateway_id, lease_s, prefix)
            result = await self._place(session_id, time.monotonic() + wait, *args)
            if not isinstance(result, ActorError) and self.abandoned(session_id):
                await self._release(session_id)  # it landed after its caller left
                result = _abandoned_error()
            opening.set_result(result)
            return result
        finally:
            del self.running[session_id]
            if not opening.done():
                opening.cancel()

    async def abandon(self, session_id: str) -> None:
        """The caller of the open of ``session_id`` has gone (cancelled, deadline passed): the
        open must leave no session behind, whether it waits, runs or has already landed."""
        self._abandoned[session_id] = True
        if session_id in self.running:
            await self.notify_room()  # a waiting open looks again, and gives up
        elif session_id in self.sessions:
            await self._release(session_id)

    async def _release(self, session_id: str) -> None:
        entry = self.replicas.get(self.sessions.get(session_id).replica_id)
        self.sessions.forget(session_id)
        if entry is not None:
            await self._close_on(entry, session_id)
        await self.notify_room()

    async def _close_on(self, entry: ReplicaEntry, session_id: str) -> None:
        """Release ``session_id`` on ``entry``'s replica (reason ``aborted``; idempotent)."""
        try:
            closed = await entry.replica.close_sessions(
                session_ids=[session_id], reason=ReleaseReason.ABORTED
            )
        except Exception as exc:  # noqa: BLE001 - a dead replica holds nothing
            log.warning("release of a session that cannot be kept failed: %s", exc)
        else:
            if not isinstance(closed, ActorError):
                entry.take(closed.snapshot)

    async def _place(
        self,
        session_id: str,
        deadline: float,
        idle_timeout_s: float,
        tenant: str,
        gateway_id: str,
        lease_s: float,
        prefix: str | list[int] | None,
    ) -> Route | ActorError:
        refused: dict[str, int] = {}
        prefix_ids = prefix if isinstance(prefix, list) else None
        while True:
            if self.abandoned(session_id):
                return _abandoned_error()
            views = [self.view(rid) for rid in self.replicas]
            reserved = {rid: e.reserved + refused.get(rid, 0) for rid, e in self.replicas.items()}
            replica_id = None
            if self._room_left(views, reserved):  # else restores come first
                replica_id = choose_replica(views, reserved, prefix_ids=prefix_ids)
            if replica_id is not None:
                route = await self._open_on(
                    replica_id, session_id, idle_timeout_s, tenant, gateway_id, lease_s, prefix
                )
                if not isinstance(route, ActorError):
                    return route
                if route.code != StatusCode.RESOURCE_EXHAUSTED:
                    return route
                refused[replica_id] = 10**6  # full after all: skip it until its next snapshot
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                why = room_report(views, reserved).message()
                if not self._room_left(views, reserved):
                    why = (
                        f"{self.room_claimed} sessions of a failed replica take the room first "
                        f"(its restores come before new sessions); retry shortly ({why})"
                    )
                return ActorError(StatusCode.RESOURCE_EXHAUSTED, why)
            try:
                async with self._room:
                    await asyncio.wait_for(self._room.wait(), timeout=left)
            except asyncio.TimeoutError:
                pass
            refused.clear()

    def _room_left(self, views: list[ReplicaView], reserved: dict[str, int]) -> bool:
        """Whether the room in view is more than what failovers claim for their sessions."""
        claimed = self.room_claimed
        return not claimed or sum(r.new_sessions for r in candidates(views, reserved)) > claimed

    async def _open_on(
        self,
        replica_id: str,
        session_id: str,
        idle_timeout_s: float,
        tenant: str,
        gateway_id: str,
        lease_s: float,
        prefix: str | list[int] | None = None,
    ) -> Route | ActorError:
        entry = self.replicas[replica_id]
        entry.reserved += 1  # in flight: not in any snapshot yet
        try:
            opened = await entry.replica.open_session(
                session_id=session_id,
                idle_timeout_s=idle_timeout_s,
                gateway_id=gateway_id,
                tenant=tenant,
                lease_s=lease_s,
                prefix=prefix,
            )
        except Exception as exc:  # noqa: BLE001 - read by kind: only a dead replica is fenced
            failure = CallFailure.of("open_session", f"replica {replica_id}", exc)
            log_failure(log, failure)
            entry.call_errors[failure.method, failure.kind.value] += 1
            if failure.kind is FailureKind.APPLICATION:
                await self._close_on(entry, session_id)  # in case it opened before it raised
                return failure.actor_error()
            if failure.kind is FailureKind.TRANSIENT:  # try the others; it is not fenced
                return ActorError(StatusCode.RESOURCE_EXHAUSTED, failure.message())
            opened = ActorError(StatusCode.ABORTED, failure.message())
        finally:
            entry.reserved -= 1
        if isinstance(opened, ActorError) and opened.code == StatusCode.ABORTED:
            await self.on_dead(replica_id, opened.message)  # e.g. its engine died
            return ActorError(StatusCode.RESOURCE_EXHAUSTED, f"replica {replica_id} failed; retry")
        if isinstance(opened, ActorError):
            return opened
        if self.replicas.get(replica_id) is not entry or entry.health == ReplicaHealth.DEAD:
            # declared dead while the open was in flight (a stopped replica answers once
            # continued): its failover has taken its sessions already, so a pin now would
            # name a replica that is gone, for good
            await self._close_on(entry, session_id)
            return ActorError(StatusCode.RESOURCE_EXHAUSTED, f"replica {replica_id} failed; retry")
        entry.take(opened.snapshot)  # counts the new session
        blank = BlankOpen(idle_timeout_s, entry.store_epoch) if prefix is None else None
        self.sessions.pin(session_id, replica_id, tenant, blank)
        return Route(session_id, replica_id, entry.handle, opened.info, tenant)


def _abandoned_error() -> ActorError:
    return ActorError(StatusCode.CANCELLED, "the caller of this open went away; nothing was kept")
