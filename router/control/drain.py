"""``Drainer``: the admin calls that take sessions off replicas: DrainReplica, ResumeReplica and
MigrateSession.

``drain(replica_id, migrate=False)``: the replica takes no new session; it keeps the ones it has
until they end. ``drain(replica_id, migrate=True)`` also moves every session it holds to the
other replicas (``Migrator``): idle and parked ones at once, each running turn's session as soon
as that turn ends; sessions that find no room wait for room. It answers when the replica holds
no session, or when ``timeout_s`` has passed, with how many moved and how many are left; the
replica stays draining either way (a later drain moves the rest; ``resume`` takes it back).
Draining a replica already draining is allowed, and moves what it still holds. A replica that
dies during a drain (a call to it finds it dead) fails over (``router.control.failover``); the
drain answers once that has ended, from its outcome, never from the dead replica's last snapshot:
``sessions_migrated`` counts the sessions the drain moved and those restored elsewhere,
``sessions_left`` those lost (without a checkpoint), and the replica is DEAD.

``migrate_session(session_id, target)`` moves one session (to ``target``, or where placement
chooses), once its running turn has ended.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from replica.api import ActorError, MigrationReason, StatusCode, clip_id
from router.control.api import Drained, ReplicaHealth, ReplicaView, Route
from router.control.migration import Migrator
from router.control.registry import ReplicaRegistry
from router.control.table import ReplicaEntry

NO_ROOM_RETRY_S = 1.0  # how long a drain whose sessions found no room waits before trying again


class Drainer:
    def __init__(
        self,
        replicas: ReplicaRegistry,
        migrator: Migrator,
        view: Callable[[str], ReplicaView],
        wait_for_room: Callable[[float], Awaitable[None]],
        drain_timeout_s: float,
    ) -> None:
        self.replicas = replicas
        self.migrator = migrator
        self.view = view
        self.wait_for_room = wait_for_room
        self.drain_timeout_s = drain_timeout_s

    def _entry(self, replica_id: str) -> ReplicaEntry | ActorError:
        entry = self.replicas.get(replica_id)
        if entry is None:
            return ActorError(
                StatusCode.NOT_FOUND, f"no replica {clip_id(replica_id)!r}; see ListReplicas"
            )
        return entry

    async def drain(
        self, replica_id: str, migrate: bool = False, timeout_s: float | None = None
    ) -> Drained | ActorError:
        entry = self._entry(replica_id)
        if isinstance(entry, ActorError):
            return entry
        if entry.health == ReplicaHealth.DEAD:
            return Drained(self.view(replica_id))
        await self._set_draining(entry, True)
        migrated = 0
        if migrate:
            wait = self.drain_timeout_s if timeout_s is None else timeout_s
            migrated = await self._move_all(replica_id, entry, time.monotonic() + wait)
        if entry.health == ReplicaHealth.DEAD:  # it died during the drain: it failed over
            dead = self.view(replica_id)  # the serve process may forget it meanwhile
            outcome = await asyncio.shield(entry.failover) if entry.failover else None
            restored, lost = (len(outcome.restored), len(outcome.lost)) if outcome else (0, 0)
            if replica_id in self.replicas:
                dead = self.view(replica_id)
            return Drained(dead, migrated + restored, lost)
        view = self.view(replica_id)
        held = view.snapshot.open_sessions if view.snapshot else view.sessions_pinned
        return Drained(view, migrated, held)

    async def _move_all(self, replica_id: str, entry: ReplicaEntry, deadline: float) -> int:
        """Move every session off the replica until it holds none or ``deadline`` passes."""
        migrated = 0
        while entry.health == ReplicaHealth.DRAINING:
            held = await self.migrator.call(
                replica_id, "list_sessions", lambda r: r.list_sessions()
            )
            left_s = deadline - time.monotonic()
            if isinstance(held, ActorError) or not held or left_s <= 0:
                break
            moved = await self.migrator.move(
                list(held), replica_id, MigrationReason.DRAIN, wait_s=left_s
            )
            migrated += len(moved.migrated)
            if not moved.migrated and entry.health == ReplicaHealth.DRAINING:
                # no room anywhere, or turns outlasting the bound
                await self.wait_for_room(min(NO_ROOM_RETRY_S, max(0.0, left_s)))
        if entry.health != ReplicaHealth.DEAD:
            snapshot = await self.migrator.call(
                replica_id, "snapshot", lambda r: r.snapshot(exact=True)
            )
            if not isinstance(snapshot, ActorError):
                entry.take(snapshot)
        return migrated

    async def resume(self, replica_id: str) -> ReplicaView | ActorError:
        """Take a draining replica back: it is a placement candidate again."""
        entry = self._entry(replica_id)
        if isinstance(entry, ActorError):
            return entry
        if entry.health == ReplicaHealth.DEAD:
            return ActorError(
                StatusCode.FAILED_PRECONDITION,
                f"replica {replica_id} is dead and cannot be resumed; a replacement takes its "
                "place (see ListReplicas)",
            )
        await self._set_draining(entry, False)
        return self.view(replica_id)

    async def _set_draining(self, entry: ReplicaEntry, draining: bool) -> None:
        rid = entry.desc.replica_id
        snapshot = await self.migrator.call(rid, "drain", lambda r: r.drain(draining=draining))
        if not isinstance(snapshot, ActorError):
            entry.take(snapshot)  # placement reads the replica's draining flag from it
        self.replicas.set_draining(entry, draining)

    async def migrate_session(
        self,
        session_id: str,
        target: str | None,
        wait_s: float | None,
        route: Callable[[str, Any], Awaitable[Route | ActorError]],
        with_info: Callable[[Route | ActorError], Awaitable[Route | ActorError]],
    ) -> Route | ActorError:
        """Move one session to ``target`` (None: placement chooses) once its running turn has
        ended (waiting at most ``wait_s``, default ``drain_timeout_s``); answers its route now,
        with its facts. ``route(session_id, None)`` is the router's admin route lookup."""
        if target is not None:
            entry = self._entry(target)
            if isinstance(entry, ActorError):
                return entry
            if entry.health != ReplicaHealth.HEALTHY:
                return ActorError(
                    StatusCode.FAILED_PRECONDITION,
                    f"replica {target} is {entry.health.name.lower()}: it takes no sessions",
                )
        wait = self.drain_timeout_s if wait_s is None else wait_s
        where = await route(session_id, None)
        if isinstance(where, ActorError) or where.replica_id == target:
            return await with_info(where)
        moved = await self.migrator.move(
            [session_id], where.replica_id, MigrationReason.ADMIN, target, wait
        )
        if session_id in moved.left:
            return moved.left[session_id]
        return await with_info(await route(session_id, None))
