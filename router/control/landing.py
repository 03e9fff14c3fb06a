"""``Landing``: the end of a move whose sessions landed on their target, with exactly one copy
of each session left, whatever fails (part of ``router.control.migration``).

The target has opened the sessions (and, with checkpoints on, stored their first checkpoints);
the source still holds them, marked moving. Nothing has pinned them to the target yet, so no turn
can have run there. Then:
- the source releases them (``finish_export(moved=True)``): they are the target's;
- the source is dead (its call says so): its copies died with it; they are the target's;
- the source is alive but failed the call (an application error, or no answer within the retry
  budget): the source says which it still holds (``list_sessions``; if it cannot, it is taken to
  hold them all, as a failed call that touched nothing does). Those go back: the target releases
  its copies (reason ``migrated``: their state is on the source), and they are the source's,
  refused with the source's error (the caller unmarks them there). The others are the target's.
A target that dies while it releases its copies takes them with it: one copy is left either way.
Sessions that landed but that ``MovingSessions.land`` did not pin are ``strays``: those closed by
their client meanwhile are released on the target; with a target declared dead meanwhile, the
caller decides (a migration has no copy left, a failover tries another target).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from replica.actor.client import ReplicaClient
from replica.api import ActorError, PoolSnapshot, ReleaseReason
from router.control.api import ReplicaHealth
from router.control.registry import ReplicaRegistry

log = logging.getLogger(__name__)

# (replica id, method, call): its answer, or an ActorError once it failed (``Migrator.call``)
ReplicaCall = Callable[[str, str, Callable[[ReplicaClient], Awaitable[Any]]], Awaitable[Any]]


class Landing:
    def __init__(self, replicas: ReplicaRegistry, on: ReplicaCall) -> None:
        self.replicas = replicas
        self.on = on

    async def finish(
        self, landed: Sequence[str], source: str, target: str
    ) -> tuple[list[str], dict[str, ActorError]]:
        """Release ``landed`` on ``source`` now that ``target`` holds them; returns those that
        are the target's now, and those that stay the source's (with why)."""
        ids = list(landed)
        if not ids:
            return [], {}
        finished = await self.on(
            source, "finish_export", lambda r: r.finish_export(session_ids=ids, moved=True)
        )
        if not isinstance(finished, ActorError):
            self._take(source, finished)
            return ids, {}
        if self._gone(source):
            return ids, {}
        held = await self.on(source, "list_sessions", lambda r: r.list_sessions())
        if isinstance(held, ActorError):
            if self._gone(source):
                return ids, {}
            held = set(ids)  # it cannot tell: its failed call touched nothing
        back = [sid for sid in ids if sid in held]
        if back:
            log.error(
                "%s failed to release %d sessions that landed on %s (%s): they stay on %s",
                source,
                len(back),
                target,
                finished.message,
                source,
            )
            await self._release_on_target(back, target)
        return [sid for sid in ids if sid not in held], dict.fromkeys(back, finished)

    async def strays(self, ids: Sequence[str], target: str) -> list[str]:
        """``ids`` landed on ``target`` but were not pinned there: returns them all when the
        target is dead (its copies are gone with it; the caller decides), else releases the
        target's copies of those closed meanwhile and returns none."""
        if not ids:
            return []
        if self._gone(target):
            return list(ids)
        log.info("%d sessions closed while they moved to %s: released there", len(ids), target)
        await self._release_on_target(list(ids), target, ReleaseReason.CLOSED)
        return []

    async def _release_on_target(
        self, ids: list[str], target: str, reason: ReleaseReason = ReleaseReason.MIGRATED
    ) -> None:
        closed = await self.on(
            target,
            "close_sessions",
            lambda r: r.close_sessions(session_ids=ids, reason=reason),
        )
        if not isinstance(closed, ActorError):
            self._take(target, closed.snapshot)
        elif not self._gone(target):
            log.error("%s kept %d sessions it was to give back: %s", target, len(ids), closed)

    def _take(self, replica_id: str, snapshot: PoolSnapshot) -> None:
        entry = self.replicas.get(replica_id)
        if entry is not None:
            entry.take(snapshot)

    def _gone(self, replica_id: str) -> bool:
        entry = self.replicas.get(replica_id)
        return entry is None or entry.health == ReplicaHealth.DEAD
