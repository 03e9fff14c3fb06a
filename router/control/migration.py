"""``Migrator``: moving live sessions from one replica to others, the pin switched atomically.

A move of sessions off ``source``:
1. the table marks each one moving (``SessionEntry.moving``): a route asked for meanwhile waits;
2. the source marks them moving too (``mark_moving``): they take no new turn, and a gateway that
   calls the source about one is answered UNAVAILABLE and asks the router, which waits;
3. the idle and parked ones are exported at once, in one batch per target (placement chooses
   the targets unless the caller named one); a session whose turn runs is exported when that
   turn has ended (waiting at most ``wait_s``);
4. each batch goes from the source's object store straight to its target: the target's
   ``import_sessions`` is handed the export's ObjectRef, so the bytes never pass through the
   router or a gateway;
5. once the target answers (with checkpoints on, after its first checkpoint of each session is
   stored there), the source releases the sessions that landed (reason ``migrated``), then they
   are pinned to the target (one table write, atomic for every reader) and the routes waiting
   for them are woken; those that did not land stay on the source, unmarked, and say why in
   ``Moved.left``. A release on the source that fails leaves one copy (``Landing``): the
   target's if the source died, else the source's (the target releases its copy).
A failure at any step leaves each session pinned where its only copy is (the source, unless the
target confirmed the import and the source let go): a target that dies mid-import takes nothing
with it. Moves of one session never overlap: a second waits for the first.
Only a dead replica is declared dead (``router.call_errors``): a call that raised (an application
error) leaves its sessions where they are with INTERNAL; an import that could not fetch the
export (the source's object was lost) blames the source, never the target.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from replica.actor.client import ReplicaClient
from replica.api import ActorError, Exported, Imported, MigrationReason, StatusCode
from router.call_errors import CallFailure, FailureKind, log_failure, object_lost, retrying
from router.control.api import ReplicaHealth, ReplicaView
from router.control.landing import Landing
from router.control.moving import MovingSessions
from router.control.placement import choose_replica
from router.control.registry import ReplicaRegistry
from router.control.table import SessionTable

log = logging.getLogger(__name__)

T = TypeVar("T")

NO_ROOM = ActorError(
    StatusCode.RESOURCE_EXHAUSTED,
    "no other replica has room for the session; add replicas or free room, then retry",
)


@dataclass(frozen=True, slots=True)
class Moved:
    """The outcome of a move: sessions now on another replica, and those left (and why)."""

    migrated: tuple[str, ...] = ()
    left: dict[str, ActorError] = field(default_factory=dict)


class Migrator:
    def __init__(
        self,
        replicas: ReplicaRegistry,
        sessions: SessionTable,
        view: Callable[[str], ReplicaView],
        on_dead: Callable[[str, str], Awaitable[Any]],
        incarnation: str,
    ) -> None:
        """``incarnation``: the router's, which its imports carry (a replica refuses the moves
        of a router it no longer reports to)."""
        self.incarnation = incarnation
        self.replicas = replicas
        self.sessions = sessions
        self.view = view
        self.on_dead = on_dead
        self.claims = MovingSessions(sessions, replicas)
        self.landing = Landing(replicas, self.call)

    async def move(
        self,
        session_ids: Sequence[str],
        source: str,
        reason: MigrationReason,
        target: str | None = None,
        wait_s: float = 0.0,
    ) -> Moved:
        """Move the sessions among ``session_ids`` pinned to ``source`` to ``target`` (None:
        placement chooses); a session whose turn runs moves once the turn has ended, if that
        is within ``wait_s``. Sessions not pinned to ``source`` are left (NOT_FOUND)."""
        claimed = await self.claims.claim(session_ids, source)
        left = {
            sid: ActorError(StatusCode.NOT_FOUND, f"session {sid} is not on {source}")
            for sid in session_ids
            if sid not in claimed
        }
        try:
            marked = await self.call(
                source, "mark_moving", lambda r: r.mark_moving(session_ids=list(claimed))
            )
            if isinstance(marked, ActorError):
                return Moved((), {**left, **dict.fromkeys(claimed, marked)})
            left.update({sid: _closed(sid) for sid in marked.missing})
            jobs = [self._move_idle(marked.exported, source, reason, target)]
            jobs += [self._move_busy(sid, source, reason, target, wait_s) for sid in marked.busy]
            migrated: list[str] = []
            for moved in await asyncio.gather(*jobs):
                migrated += moved.migrated
                left.update(moved.left)
            return Moved(tuple(migrated), left)
        finally:
            self.claims.release(claimed)

    async def _move_busy(
        self, sid: str, source: str, reason: MigrationReason, target: str | None, wait_s: float
    ) -> Moved:
        """Move one session once its running turn has ended."""
        still = await self.call(
            source,
            "wait_turns_ended",
            lambda r: r.wait_turns_ended(session_ids=[sid], wait_s=wait_s),
        )
        if isinstance(still, ActorError) or still:
            await self.call(
                source, "finish_export", lambda r: r.finish_export(session_ids=[sid], moved=False)
            )
            why = still if isinstance(still, ActorError) else _still_busy(sid)
            return Moved((), {sid: why})
        return await self._move_idle((sid,), source, reason, target)

    async def _move_idle(
        self, ids: Sequence[str], source: str, reason: MigrationReason, target: str | None
    ) -> Moved:
        """Move idle sessions in one batch per target; those a target refuses for lack of room
        try the other replicas."""
        pending, excluded, migrated, left = list(ids), {source}, [], {}
        while pending:
            groups = self.assign(pending, target, excluded)
            placed = {sid for sids in groups.values() for sid in sids}
            left.update({sid: NO_ROOM for sid in pending if sid not in placed})
            outcomes = await asyncio.gather(
                *(self._move_group(sids, source, tid, reason) for tid, sids in groups.items())
            )
            pending = []
            for tid, (landed, refused) in zip(groups, outcomes):
                migrated += landed
                for sid, why in refused.items():
                    retry = target is None and why.code == StatusCode.RESOURCE_EXHAUSTED
                    if retry:
                        pending.append(sid)
                        excluded.add(tid)
                    else:
                        left[sid] = why
        if left:
            await self.call(
                source,
                "finish_export",
                lambda r: r.finish_export(session_ids=list(left), moved=False),
            )
        return Moved(tuple(migrated), left)

    def assign(
        self, ids: Sequence[str], target: str | None, excluded: set[str]
    ) -> dict[str, list[str]]:
        """Targets for ``ids``: ``target``, or placement's choice among the healthy replicas
        not ``excluded``, each choice counted as a reservation for the next."""
        if target is not None:
            return {target: list(ids)} if target not in excluded else {}
        views = [self.view(rid) for rid in self.replicas if rid not in excluded]
        reserved = {rid: e.reserved for rid, e in self.replicas.items()}
        groups: dict[str, list[str]] = {}
        for sid in ids:
            chosen = choose_replica(views, reserved)
            if chosen is None:
                break
            groups.setdefault(chosen, []).append(sid)
            reserved[chosen] = reserved.get(chosen, 0) + 1
        return groups

    async def _move_group(
        self, ids: list[str], source: str, target: str, reason: MigrationReason
    ) -> tuple[list[str], dict[str, ActorError]]:
        """Export ``ids`` from ``source``, import them on ``target``, pin those that landed and
        release them on the source; returns (landed, refused with why)."""
        src, dst = self.replicas.get(source), self.replicas.get(target)
        if src is None or dst is None:
            return [], dict.fromkeys(ids, _gone(target))
        exported_ref, states_ref = src.replica.export_sessions(session_ids=ids)
        try:
            exported: Exported | ActorError = await exported_ref
        except Exception as exc:  # noqa: BLE001 - read by kind: only a dead source is fenced
            why = await self._failed(source, "export_sessions", exc)
            return [], dict.fromkeys(ids, why)
        if isinstance(exported, ActorError):
            return [], dict.fromkeys(ids, exported)
        refused = {sid: _still_busy(sid) for sid in exported.busy}
        refused.update({sid: _closed(sid) for sid in exported.missing})
        if not exported.exported:
            return [], refused
        dst.reserved += len(exported.exported)
        try:
            imported: Imported | ActorError = await dst.replica.import_sessions(
                parts=[states_ref], router=self.incarnation
            )
        except Exception as exc:  # noqa: BLE001 - blamed on the side that failed
            if object_lost(exc):  # the export is gone: finish_export finds out if the source is
                log.error("import on %s could not fetch the export of %s: %s", target, source, exc)
                src.call_errors["export_sessions", "object_lost"] += 1
                imported = ActorError(
                    StatusCode.UNAVAILABLE,
                    f"the sessions' state exported by {source} was lost on the way; retry",
                )
            else:
                imported = await self._failed(target, "import_sessions", exc)
        finally:
            dst.reserved -= len(exported.exported)
        if isinstance(imported, ActorError):
            return [], {**refused, **dict.fromkeys(exported.exported, imported)}
        dst.take(imported.snapshot)
        refused.update(imported.refused)
        opened = [info.session_id for info in imported.opened]
        if dst.health == ReplicaHealth.DEAD:
            # declared dead mid-import (it stalled): the sessions stay on their source, and the
            # target's copies go when it comes back (a fenced replica's sessions are released)
            return [], {**refused, **dict.fromkeys(opened, _gone(target))}
        landed, back = await self.landing.finish(opened, source, target)
        pinned = self.claims.land(landed, target)
        lost = await self.landing.strays([s for s in landed if s not in pinned], target)
        if lost:  # the target died after the source let go: no copy is left
            log.error("%s died as %d sessions landed on it: lost", target, len(lost))
            self.sessions.abort(lost)
        refused.update(back)
        src.migrated[reason.value] += len(pinned)
        return pinned, refused

    async def call(
        self, replica_id: str, method: str, call: Callable[[ReplicaClient], Awaitable[T]]
    ) -> T | ActorError:
        """``call(replica)``, the replica's ``method``; an ActorError when the replica is gone
        or fails it."""
        entry = self.replicas.get(replica_id)
        if entry is None:
            return _gone(replica_id)
        try:  # each of these calls may be repeated: one that did not answer is made again
            return await retrying(lambda: call(entry.replica))
        except Exception as exc:  # noqa: BLE001 - read by kind: only a dead replica is fenced
            return await self._failed(replica_id, method, exc)

    async def _failed(self, replica_id: str, method: str, exc: BaseException) -> ActorError:
        """``method`` on ``replica_id`` raised ``exc``: logged; the replica declared dead only
        when it is; what the sessions of the call are left with."""
        failure = CallFailure.of(method, f"replica {replica_id}", exc)
        log_failure(log, failure)
        entry = self.replicas.get(replica_id)
        if entry is not None:
            entry.call_errors[method, failure.kind.value] += 1
        if failure.kind is not FailureKind.DEAD:
            return failure.actor_error()
        await self.on_dead(replica_id, f"{method} failed: {failure.cause}")
        return _gone(replica_id)


def _gone(replica_id: str) -> ActorError:
    return ActorError(
        StatusCode.UNAVAILABLE, f"replica {replica_id} is gone or failed the move; retry"
    )


def _closed(session_id: str) -> ActorError:
    return ActorError(StatusCode.NOT_FOUND, f"session {session_id} was closed; nothing to move")


def _still_busy(session_id: str) -> ActorError:
    return ActorError(
        StatusCode.UNAVAILABLE,
        f"session {session_id} is still running a turn; it moves once the turn has ended: retry",
    )
