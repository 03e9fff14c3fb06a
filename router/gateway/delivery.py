"""``Delivery``: turn events from the replicas to this gateway's calls.

Token delivery costs no round trip per token: for each replica the gateway keeps one
long-lived output stream (``ReplicaClient.read_outputs``: a socket of its own to the replica, or
Ray's streaming call) whose items carry everything the engine produced for this
gateway's sessions since the last item (``replica.api.DeliveryEntry``); the pump hands each
event, and each token row (``replica.api.TokenRows``: the engine's steps carry one record of
all their turns' tokens, fanned out to sessions here) as a ``TokenEntry``, to the inbox of its
session (``router.gateway.inbox``), if a call of this gateway streams that session now, and does
nothing else per token (``hand_out``). A call whose session moved (``move``) waits on
its new replica; news of the old one no longer concerns it.

The calls streaming a session follow it when its old replica ends, so no client hangs on a turn
that will never end: one that died (its stream broke, or ``replica_lost`` from any failed call:
the router is told, and its failover says which sessions were restored elsewhere from their
checkpoints) or one that was drained and stopped (its stream ended: ``replica_ended``,
autoscaling). What this gateway knows of that replica (routes, batched calls) goes, and each call
streaming a session from it gets ``router.gateway.inbox.ReplicaLost``: where the session goes on
elsewhere (restored, or moved off before), at its committed tokens, a turn in flight there ends
UNAVAILABLE (Generate: retry it) or INTERRUPTED (Converse, which goes on); where the router
says its state is gone, ABORTED. A session the router cannot place yet (it restarts, or its
failover has not ended) is not taken for gone: its turn ends UNAVAILABLE, retry it.
"""

from __future__ import annotations

import asyncio
import logging

from replica.api import ActorError, DeliveryEntry, StatusCode
from router.control.api import Route
from router.control.client import RouterClient
from router.gateway.inbox import Inbox, ReplicaLost
from router.gateway.replica_calls import ReplicaCallsByReplica
from router.gateway.route_cache import RouteCache

log = logging.getLogger(__name__)


class Delivery:
    def __init__(
        self,
        gateway_id: str,
        router: RouterClient,
        routes: RouteCache,
        calls: ReplicaCallsByReplica,
    ) -> None:
        self.gateway_id = gateway_id
        self.router = router
        self.routes = routes
        self.calls = calls
        self._inboxes: dict[str, Inbox] = {}
        self._pumps: dict[str, asyncio.Task] = {}

    def claim(self, route: Route) -> Inbox | None:
        """The inbox of ``route``'s session for one call; None when another call of this gateway
        already streams that session (a turn is in flight)."""
        if route.session_id in self._inboxes:
            return None
        self.watch(route)
        inbox = self._inboxes[route.session_id] = Inbox(route.session_id, route.replica_id)
        return inbox

    def move(self, inbox: Inbox, route: Route) -> None:
        """The inbox's session is on ``route``'s replica now: its events come from there."""
        if inbox.replica_id != route.replica_id:
            inbox.left.add(inbox.replica_id)
            inbox.replica_id = route.replica_id
            self.watch(route)

    def release(self, inbox: Inbox) -> None:
        if self._inboxes.get(inbox.session_id) is inbox:
            del self._inboxes[inbox.session_id]

    def watch(self, route: Route) -> None:
        """Make sure this gateway streams the outputs of ``route``'s replica."""
        pump = self._pumps.get(route.replica_id)
        if pump is None or pump.done():
            loop = asyncio.get_running_loop()
            self._pumps[route.replica_id] = loop.create_task(self._pump(route))

    async def _pump(self, route: Route) -> None:
        inboxes = self._inboxes
        try:
            await route.replica.read_outputs(
                gateway_id=self.gateway_id, on_entries=lambda entries: hand_out(entries, inboxes)
            )
            await self.replica_ended(route.replica_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the replica died
            log.error("output stream of replica %s broke: %s", route.replica_id, exc)
            await self.replica_lost(route.replica_id, f"output stream broke: {type(exc).__name__}")

    def streaming_on(self, replica_id: str) -> list[Inbox]:
        """The inboxes of this gateway's calls streaming sessions of ``replica_id``, now or
        before their session moved (a turn may still run there)."""
        return [
            inbox
            for inbox in self._inboxes.values()
            if inbox.replica_id == replica_id or replica_id in inbox.left
        ]

    async def replica_lost(self, replica_id: str, why: str) -> None:
        """This gateway saw a replica fail: tell the router, then end the calls streaming its
        sessions here as the router's failover says (restored elsewhere, or gone)."""
        self._forget_calls(replica_id)
        outcome = await self.router.replica_failed(replica_id=replica_id, why=why)
        await self._end_streams_on(
            replica_id, {} if isinstance(outcome, ActorError) else outcome.restored
        )

    async def replica_ended(self, replica_id: str) -> None:
        """A replica's output stream ended: it shut down (drained and stopped), so the sessions
        still streamed from it here had moved away, or are gone with it."""
        log.info("replica %s shut down: its output stream ended", replica_id)
        self._forget_calls(replica_id)
        await self._end_streams_on(replica_id, {})

    def _forget_calls(self, replica_id: str) -> None:
        self.routes.drop_replica(replica_id)
        self.calls.forget(replica_id)

    async def _end_streams_on(self, replica_id: str, restored: dict[str, int]) -> None:
        """End the calls streaming sessions of ``replica_id``, which ended: a turn in flight
        there will never end. Each session goes on where the router has it now, at its
        committed tokens (``restored`` from its checkpoint, session id -> committed tokens, or
        moved off before, read from its new replica), or its state is gone."""
        for inbox in self.streaming_on(replica_id):
            committed = restored.get(inbox.session_id)
            if committed is None:
                committed = await self._committed_elsewhere(inbox.session_id, replica_id)
            unplaced = committed if isinstance(committed, ActorError) else None
            inbox.put(ReplicaLost(replica_id, committed if unplaced is None else None, unplaced))

    async def _committed_elsewhere(self, session_id: str, replica_id: str) -> int | ActorError:
        """The committed tokens of a session the router has on another replica than
        ``replica_id``; else the router's word (ABORTED: gone, NOT_FOUND: closed), or
        UNAVAILABLE when nobody can say yet (the router restarts, the session is not placed,
        the replica it went to does not answer): never taken for gone."""
        where = await self.router.route(session_id=session_id, tenant=None)
        if isinstance(where, ActorError):
            return where
        if where.replica_id == replica_id:
            return ActorError(StatusCode.UNAVAILABLE, f"it is still on {replica_id}")
        try:
            info = await where.replica.get_session(session_id=session_id)
        except Exception as exc:  # noqa: BLE001 - that replica is going too: its failover says
            log.info("session %s on %s: %s", session_id, where.replica_id, exc)
            return ActorError(StatusCode.UNAVAILABLE, f"{where.replica_id} did not answer")
        return info if isinstance(info, ActorError) else info.committed_tokens

    def stop(self) -> None:
        for task in self._pumps.values():
            task.cancel()


def hand_out(entries: list[DeliveryEntry], inboxes: dict[str, Inbox]) -> None:
    """Put each of a stream item's entries into the inbox of its session's call, where there is
    one (session id -> inbox): a token row as a ``TokenEntry`` of one token, an event as it is.
    The one place a replica's output is handled per session (the engine and the replica handle
    a step's tokens as one record)."""
    for entry in entries:
        if type(entry) is tuple:  # TokenRows
            for sid, turn, token, text in zip(*entry):
                inbox = inboxes.get(sid)
                if inbox is not None:
                    inbox.put([sid, turn, [token], text])
        else:
            inbox = inboxes.get(entry.session_id)
            if inbox is not None:
                inbox.put(entry)
