"""``DirectOpener``: opens in one hop. The gateway places the session itself and opens it on the
replica while the router pins it, both calls in flight at once; the open's reply waits for both.

Placement is the router's (``router.control.placement.choose_replica``) over this gateway's view
of the replicas (``ClusterView.placement_views``: the router's views, polled every second, with
the snapshots this gateway's own calls brought back), net of the opens this gateway has in flight.
Views go stale between polls, and other gateways place too, but the replica has the last word: it
refuses a session it has no room for (or while it drains). Whatever does not work out this way
(no replica with room in view, a refusal, a replica that died, a pin the router refused because
it knows that replica dead, a replica that did not answer for now) returns None: the caller then
opens through the router, which waits for room up to ``--open-timeout-s``. A session that landed
but cannot be kept is released. Only a dead replica is reported lost; one whose open raised (an
application error) stays in service, and the open fails INTERNAL (``Refused``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from replica.api import ActorError, ReleaseReason, SessionInfo
from router.call_errors import CallFailure, FailureKind
from router.control.api import Route
from router.control.placement import choose_replica
from router.gateway.background import Background
from router.gateway.cluster_view import ClusterView
from router.gateway.convert import Refused
from router.gateway.replica_calls import ReplicaCallsByReplica
from router.gateway.router_updates import RouterUpdates

log = logging.getLogger(__name__)


class DirectOpener:
    def __init__(
        self,
        gateway_id: str,
        cluster: ClusterView,
        calls: ReplicaCallsByReplica,
        updates: RouterUpdates,
        background: Background,
        on_lost: Callable[[str, str], Awaitable[None]],
        on_failure: Callable[[str, str, BaseException], CallFailure],
    ) -> None:
        self.gateway_id = gateway_id
        self.cluster = cluster
        self.calls = calls
        self.updates = updates
        self.background = background
        self.on_lost = on_lost
        self.on_failure = on_failure  # reads, logs and counts a call that raised
        self.in_flight: Counter[str] = Counter()  # opens on their way, by replica

    async def open(
        self,
        session_id: str,
        idle_timeout_s: float,
        tenant: str,
        lease_s: float,
        prefix: str | list[int] | None = None,
    ) -> Route | None:
        """The session opened and pinned (holding ``prefix``, text or token ids: placed where
        the longest cached prefix of token ids is), or None: open it through the router
        instead. Raises ``Refused`` (INTERNAL) when the replica raised on the open."""
        prefix_ids = prefix if isinstance(prefix, list) else None
        views = self.cluster.placement_views()
        replica_id = choose_replica(views, self.in_flight, prefix_ids=prefix_ids)
        handle = self.cluster.handles.get(replica_id) if replica_id is not None else None
        if handle is None:
            return None
        calls = self.calls.of(replica_id, handle)
        args = (session_id, idle_timeout_s, self.gateway_id, tenant, lease_s, prefix)
        opened = calls.open(args)
        blank_idle_s = idle_timeout_s if prefix is None else None
        pinned = self.updates.pin(session_id, replica_id, tenant, blank_idle_s)
        self.in_flight[replica_id] += 1
        try:
            await asyncio.wait((opened, pinned))
        except asyncio.CancelledError:  # the caller left: whatever lands is released
            self.background.spawn(
                self._settle(replica_id, handle, session_id, opened, pinned, False)
            )
            raise
        finally:
            self.in_flight[replica_id] -= 1
        info = await self._settle(replica_id, handle, session_id, opened, pinned)
        if isinstance(info, CallFailure):
            raise Refused(info.status(), info.message())
        if info is None:
            return None
        return Route(session_id, replica_id, handle, info, tenant)

    async def _settle(
        self,
        replica_id: str,
        handle: Any,
        session_id: str,
        opened: asyncio.Future,
        pinned: asyncio.Future,
        keep: bool = True,
    ) -> SessionInfo | CallFailure | None:
        """Once both calls are done: the session's info when it landed and is pinned (and
        ``keep``: its caller is still there); else None, with the session released on the
        replica and unpinned at the router; or the open's ``CallFailure`` when the replica
        raised (an application error: whatever it may have opened is released too). The
        release goes to ``handle``, the one the open went to: the view's handles may have
        lost the replica meanwhile (a restarted router lists it once it registers again)."""
        await asyncio.wait((opened, pinned))
        failure = None
        if opened.exception() is not None:
            failure = self.on_failure("open_sessions", replica_id, opened.exception())
            if failure.kind is FailureKind.DEAD:
                await self.on_lost(replica_id, f"open_sessions failed: {failure.cause}")
            info = None
        else:
            result = opened.result()
            if isinstance(result, ActorError):  # the whole call was refused: its engine died
                await self.on_lost(replica_id, f"open_sessions refused: {result.message}")
                info = None
            else:
                info, snapshot = result
                self.cluster.note(snapshot)
                self.updates.snapshot(snapshot)
                info = None if isinstance(info, ActorError) else info
        ok = pinned.exception() is None and pinned.result() is True
        if info is not None and ok and keep:
            return info
        if info is not None or (failure is not None and failure.kind is not FailureKind.DEAD):
            calls = self.calls.of(replica_id, handle)
            await _quietly(calls.close(session_id, ReleaseReason.ABORTED))
        if ok:
            self.updates.forget(session_id, replica_id)
        if failure is not None and failure.kind is FailureKind.APPLICATION:
            return failure
        return None


async def _quietly(call: Awaitable) -> None:
    try:
        await call
    except Exception as exc:  # noqa: BLE001 - a dead replica holds nothing
        log.info("release of an open that could not be kept failed: %s", exc)
