"""``RouterReporter``: what a replica tells the router on its own initiative.

About every ``interval_s`` it pushes the engine's latest ``PoolSnapshot`` and the sessions the
replica released on its own (idle timeouts); when the router does not know the replica (a
restarted router), it registers again with the sessions it holds and their tenants, so the
router can rebuild its table. When the engine dies it reports the death at once (retrying while
the router restarts) and reports nothing more: a dead replica never looks healthy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from replica.actor.router_reports import RouterReports
from replica.api import PoolSnapshot

log = logging.getLogger(__name__)

DEATH_REPORT_S = 60.0  # how long a replica whose engine died keeps trying to tell the router


class RouterReporter:
    def __init__(
        self,
        replica_id: str,
        router: Any,
        latest_snapshot: Callable[[], PoolSnapshot],
        registration: Callable[[], Awaitable[tuple | None]],
        interval_s: float = 1.0,
        drop_snapshots: bool = False,
    ) -> None:
        """``router``: the router's handle; ``registration()`` gives ``register_replica``'s
        arguments after the replica id (handle, description, session tenants, snapshot,
        checkpoint store, the idle timeouts of the sessions that hold nothing yet, the sessions
        marked moving out), or None
        while the replica may not register itself yet; ``drop_snapshots`` is the failpoint."""
        self.replica_id = replica_id
        self.router = RouterReports(router)
        self.latest_snapshot = latest_snapshot
        self.registration = registration
        self.interval_s = interval_s
        self.drop_snapshots = drop_snapshots
        self.dead = False
        self._released: list[str] = []  # released on the replica's own account, to report
        # the incarnation of the router this replica reports to (None: none answered yet); set
        # before the replica registers with a restarted router, so that a move the dead router
        # sent, landing after the registration, is refused (``MoveCalls.import_sessions``)
        self.router_incarnation: str | None = None

    def note_released(self, session_ids: list[str]) -> None:
        self._released.extend(session_ids)

    async def run(self) -> None:
        while not self.dead:
            if not self.drop_snapshots:
                try:
                    await self._report()
                except Exception as exc:  # noqa: BLE001 - the router may be restarting
                    log.warning("snapshot report to the router failed: %s", exc)
            await asyncio.sleep(self.interval_s)

    async def _report(self) -> None:
        released, self._released = self._released, []
        try:
            reply = await self.router.report(snapshot=self.latest_snapshot(), released=released)
        except Exception:
            self._released = released + self._released  # tell the router next time
            raise
        self.router_incarnation = reply.router
        if not reply.known and not self.dead:
            # a router that does not know this replica (it restarted) dropped ``released``: tell
            # it again once registered, or a gateway's pin of one of them that lands later
            # would stay in its table with no session behind it
            self._released = released + self._released
            arguments = await self.registration()
            if arguments is None:  # not yet: see ``Registration.arguments``
                return
            handle, desc, tenants, snapshot, checkpoints, blank, moving = arguments
            await self.router.register_replica(
                replica_id=self.replica_id,
                handle=handle,
                desc=desc,
                tenants=tenants,
                snapshot=snapshot,
                checkpoints=checkpoints,
                blank=blank,
                moving=moving,
            )

    async def report_death(self, why: str) -> None:
        """Stop reporting, and tell the router this replica is dead."""
        self.dead = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEATH_REPORT_S
        while True:
            try:
                await self.router.replica_failed(replica_id=self.replica_id, why=why, wait=False)
                return
            except Exception as exc:  # noqa: BLE001 - the router may be restarting
                if loop.time() > deadline:
                    log.error("could not tell the router that the engine died: %s", exc)
                    return
                await asyncio.sleep(0.5)
