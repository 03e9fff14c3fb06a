"""``LeaseRenewer``: this gateway's hold on the sessions whose Converse streams it serves.

A Converse session lives exactly as long as its stream, so its idle timeout must not release it
while the stream is open, however quiet the client. The open grants the replica-side lease
(``lease_s``); every ``RENEW_S`` the gateway renews it for all of a replica's streamed sessions
in one call. If this gateway dies, renewals stop and each session's own idle timeout applies
again ``LEASE_S`` later, so a dead gateway cannot pin slots; a dead client is found by gRPC
keepalive, which ends its stream, and the stream's end releases the session. A session that has
moved to another replica (it takes what is left of its lease along) is looked up again
(``relocate``) and renewed where it is now; so is one whose replica died (a failover places it
elsewhere, held there for one ``LEASE_S``), as soon as it lands.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable

from router.control.api import Route

log = logging.getLogger(__name__)

LEASE_S = 15.0
RENEW_S = 3.0


class LeaseRenewer:
    def __init__(self, relocate: Callable[[Route], Awaitable[Route | object]]) -> None:
        self.relocate = relocate
        self._held: dict[str, Route] = {}  # session id -> its route, while its stream is open
        self._task: asyncio.Task | None = None
        self._following: set[asyncio.Task] = set()

    def hold(self, route: Route) -> None:
        self._held[route.session_id] = route

    def drop(self, session_id: str) -> None:
        self._held.pop(session_id, None)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for task in list(self._following):
            task.cancel()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(RENEW_S)
            await self.renew()

    async def renew(self) -> None:
        """One renewal: a ``hold_sessions`` call per replica with streamed sessions."""
        by_replica: dict[str, list[Route]] = defaultdict(list)
        for route in self._held.values():
            by_replica[route.replica_id].append(route)
        calls = [
            routes[0].replica.hold_sessions(
                session_ids=[r.session_id for r in routes], lease_s=LEASE_S
            )
            for routes in by_replica.values()
        ]
        moved = []
        results = await asyncio.gather(*calls, return_exceptions=True)
        for routes, result in zip(by_replica.values(), results):
            if isinstance(result, Exception):  # a dead replica: its failover places them
                log.info("stream lease renewal failed: %s", result)
                self._follow_later([r.session_id for r in routes])
            elif isinstance(result, list):
                moved += result
        for session_id in moved:
            await self._follow(session_id)

    def _follow_later(self, session_ids: list[str]) -> None:
        """Follow each session in the background: its route waits for the failover to place
        it, and the lease is renewed there as soon as it lands (a restored session is held
        for one ``LEASE_S`` where it lands, ``router.control.failover``)."""
        for session_id in session_ids:
            task = asyncio.get_running_loop().create_task(self._follow(session_id))
            self._following.add(task)
            task.add_done_callback(self._following.discard)

    async def _follow(self, session_id: str) -> None:
        """A held session its replica no longer has: renew it where it is now, if anywhere."""
        route = self._held.get(session_id)
        if route is None:
            return
        where = await self.relocate(route)
        if isinstance(where, Route) and self._held.get(session_id) is route:
            self._held[session_id] = where
            try:
                await where.replica.hold_sessions(session_ids=[session_id], lease_s=LEASE_S)
            except Exception as exc:  # noqa: BLE001 - the next round renews it, or follows it
                log.info("stream lease of %s on %s: %s", session_id, where.replica_id, exc)
