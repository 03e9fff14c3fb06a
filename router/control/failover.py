"""``Failover``: a dead replica's sessions restored on live replicas from their checkpoints.

When a replica is declared dead (its process died, its engine loop died, it stopped answering):
0. its checkpoint store is fenced: it keeps what it holds from then on (a replica declared dead
   may be alive, stopped then continued, and release its sessions meanwhile);
1. each of its sessions is marked moving in the table: routes asked for meanwhile wait;
2. its checkpoint store is asked for their latest checkpoints (after the dead replica's
   checkpoint stream has ended, so that every checkpoint it wrote is in);
3. they are imported on live replicas with room, chosen by placement, one batch per target; a
   target fetches each checkpoint straight from the object store. Sessions that find no room
   wait for room (a replacement replica joins empty) up to ``wait_s``;
4. a session with no checkpoint there that was opened empty after that store began to follow
   the replica committed nothing a client saw (a turn's end waits for its checkpoint): it is
   opened again, empty, with the same id, tenant and idle timeout (``BlankReopen``);
5. the restored and reopened sessions are pinned to their new replicas; the others (no
   checkpoint and not blank, the store unreachable, or no room in time) become ABORTED
   tombstones; then the store is ended. Sessions their clients closed during the failover are
   neither restored (a copy that landed meanwhile is released) nor lost. Nothing is pinned to
   a target declared dead as its sessions land (``MovingSessions.land``): they try another.
The ``FailoverOutcome`` is what gateways end the calls in flight with: UNAVAILABLE ("retry the
turn; the session continues at committed_tokens N") for a restored session, ABORTED for a lost
one. There is one failover per dead replica; every caller gets its outcome.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import ray

from replica.api import ActorError, MigrationReason, StatusCode
from replica.checkpoints.files import CheckpointFiles
from router.call_errors import CallFailure, FailureKind, log_failure, object_lost
from router.control.api import FailoverOutcome
from router.control.blank_reopen import BlankReopen
from router.control.migration import Migrator
from router.control.opens import Opener
from router.control.registry import ReplicaRegistry
from router.control.room_wait import Landed, place_waiting
from router.control.table import ReplicaEntry, SessionState, SessionTable

log = logging.getLogger(__name__)

STORE_WAIT_S = 5.0  # how long the dead replica's checkpoint stream may take to end
# a session a stream held (its checkpoint says so) is held this long where a failover restores
# it, as by one stream lease (a moved session carries what is left of its own): its idle
# timeout may be shorter than the time the stream's gateway takes to find it there and renew
RESTORED_HOLD_S = 15.0


class Failover:
    def __init__(
        self,
        replicas: ReplicaRegistry,
        sessions: SessionTable,
        migrator: Migrator,
        opener: Opener,
        on_dead: Callable[[str, str], Awaitable[Any]],
        wait_s: float,
        checkpoint_dir: str = "",
    ) -> None:
        """``opener``: whose room the restores wait for, claimed ahead of new opens;
        ``checkpoint_dir``: where the stores also write (``CheckpointFiles``; '': nowhere)."""
        self.checkpoint_dir = checkpoint_dir
        self.replicas = replicas
        self.sessions = sessions
        self.migrator = migrator
        self.opener = opener
        self.on_dead = on_dead
        self.wait_s = wait_s
        self.blank = BlankReopen(replicas, sessions, migrator, opener, on_dead, wait_s)

    def start(self, replica_id: str) -> None:
        entry = self.replicas[replica_id]
        if entry.failover is None:
            entry.failover = asyncio.get_running_loop().create_task(self._run(replica_id, entry))

    async def outcome(self, replica_id: str) -> FailoverOutcome:
        entry = self.replicas.get(replica_id)
        if entry is None or entry.failover is None:
            return FailoverOutcome()
        return await asyncio.shield(entry.failover)

    async def _run(self, replica_id: str, entry: ReplicaEntry) -> FailoverOutcome:
        await self._fence(entry)  # first: a claim may wait for a move in flight
        claimed = await self.migrator.claims.claim(
            self.sessions.sessions_of(replica_id), replica_id
        )
        await self.opener.claim_room(replica_id, len(claimed))  # room for them before new opens
        try:
            found, answered, store_blank, released = await self._checkpoints(entry, list(claimed))
            self._released_before(replica_id, released)
            found = {sid: f for sid, f in found.items() if self._open(sid)}
            blank = {}
            if answered:
                missing = [sid for sid in claimed if sid not in found]
                blank = self.blank.select(entry, missing, store_blank)
            # the blank ones' room stays claimed while the restores wait for theirs
            restored = await self._restore(found, replica_id, len(blank)) if found else {}
            restored.update(await self.blank.reopen(blank, replica_id) if blank else {})
            closed = [sid for sid in claimed if sid not in restored and not self._open(sid)]
            if closed:  # by their clients, during the failover: neither restored nor lost
                log.info("replica %s: %d sessions closed during its failover", replica_id,
                         len(closed))  # fmt: skip
            lost = tuple(sid for sid in claimed if sid not in restored and sid not in closed)
            if lost:
                log.warning(
                    "replica %s: %d checkpoints found, store answered %s; lost %s",
                    replica_id,
                    len(found),
                    answered,
                    ", ".join(sid[:12] for sid in lost),
                )
            entry.lost += self.sessions.abort(list(lost))
            entry.migrated[MigrationReason.FAILOVER.value] += len(restored)
            log.error(
                "replica %s is dead: %d sessions restored from checkpoints, %d lost",
                replica_id,
                len(restored),
                len(lost),
            )
            return FailoverOutcome(restored, lost)
        finally:
            self.migrator.claims.release(claimed)
            await self.opener.claim_room(replica_id, 0)
            if entry.checkpoints is not None:
                try:
                    ray.kill(entry.checkpoints, no_restart=True)
                except Exception as exc:  # noqa: BLE001 - gone already
                    log.info("end of the checkpoint store of %s: %s", replica_id, exc)
            if self.checkpoint_dir:  # its sessions are elsewhere now, or lost
                await asyncio.to_thread(CheckpointFiles(self.checkpoint_dir, replica_id).remove)

    def _released_before(self, replica_id: str, released: list[str]) -> None:
        """Sessions the dead replica released (closed, idle timeout) before the router heard
        of it: they end as it ended them, neither restored nor lost."""
        for sid in released:
            if self._open(sid):
                self.sessions.released_by(sid, replica_id)
        if released:
            log.info("replica %s: %d sessions it had released before it died: %s", replica_id,
                     len(released), ", ".join(sid[:12] for sid in released))  # fmt: skip

    def _open(self, session_id: str) -> bool:
        entry = self.sessions.get(session_id)
        return entry is not None and entry.state == SessionState.OPEN

    async def _fence(self, entry: ReplicaEntry) -> None:
        """Have the dead replica's store keep what it holds now: a replica declared dead may
        be alive (stopped, then continued) and release its sessions, and their drops must not
        reach the store before this failover reads it (``CheckpointStore.fence``)."""
        if entry.checkpoints is None:
            return
        try:
            await asyncio.wait_for(entry.store.fence(), STORE_WAIT_S)
        except Exception as exc:  # noqa: BLE001 - the store died too: its files may hold them
            log.warning("fencing the checkpoint store of %s: %r", entry.desc.replica_id, exc)

    async def _checkpoints(
        self, entry: ReplicaEntry, ids: list[str]
    ) -> tuple[dict[str, Any], bool, dict[str, float], list[str]]:
        """The checkpoints of ``ids`` the dead replica's store holds, whether it answered,
        the sessions it knows to hold nothing yet (with their idle timeouts), and those of
        ``ids`` it heard the replica release (``CheckpointStore.released_of``); with
        ``checkpoint_dir``, the checkpoints it does not hold (it died too, or a replacement had
        not got them yet) from its files: each was written there before it was acknowledged."""
        if entry.checkpoints is None or not ids:
            return {}, False, {}, []
        found, answered, blank, released = {}, False, {}, []
        try:
            found = await entry.store.checkpoints(session_ids=ids, wait_s=STORE_WAIT_S)
            answered = True
            # read after ``checkpoints``, which waits for the dead replica's stream to end
            held = await entry.store.sessions()
            blank = {sid: idle for sid, (_, idle) in held.items() if idle is not None}
            unknown = [sid for sid in ids if sid not in found and sid not in blank]
            released = await entry.store.released_of(session_ids=unknown)
        except Exception as exc:  # noqa: BLE001 - the store died too: its files may hold them
            log.error("checkpoint store unreachable: %s", exc)
        missing = [sid for sid in ids if sid not in found]
        if self.checkpoint_dir and missing:
            files = CheckpointFiles(self.checkpoint_dir, entry.desc.replica_id)
            records = await asyncio.to_thread(files.load_all, missing)
            log.warning("%s: %d checkpoints read from files", entry.desc.replica_id, len(records))
            found.update((sid, (r.sessions[0], [ray.put(r)])) for sid, r in records.items())
            answered = True
        return found, answered, blank, released

    async def _restore(self, found: dict[str, Any], dead: str, later: int) -> dict[str, int]:
        """Import ``found`` (session id -> (meta, [checkpoint ref])) on live replicas, waiting
        for room ahead of new opens (and keeping ``later`` more claimed: the blank reopens that
        follow); returns the restored ones with their committed tokens."""

        async def land(groups: dict[str, list[str]]) -> Landed:
            outcomes = await asyncio.gather(
                *(self._import(tid, sids, found) for tid, sids in groups.items())
            )
            await self._hand_over(dead, [sid for landed, _ in outcomes for sid in landed])
            done = Landed({}, [], set())
            for tid, (landed, refused) in zip(groups, outcomes):
                done.sessions.update(landed)
                for sid, why in refused.items():
                    if why.code == StatusCode.RESOURCE_EXHAUSTED:
                        done.full.append(sid)
                        done.full_targets.add(tid)
                    else:
                        log.warning("%s refused session %s: %s", tid, sid[:16], why.message)
            return done

        args = (self.migrator, self.opener, self.wait_s, land)
        restored, pending = await place_waiting(list(found), dead, *args, later)
        if pending:
            log.warning("%d sessions found no room within %.0f s", len(pending), self.wait_s)
        return restored

    async def _hand_over(self, dead: str, landed: list[str]) -> None:
        """Tell the dead replica's store which sessions were restored, so that it drops them: a
        router that restarts during this failover restores only the rest (``recover``)."""
        entry = self.replicas[dead]
        if not landed or entry.checkpoints is None:
            return
        try:
            await asyncio.wait_for(entry.store.handed_over(session_ids=landed), STORE_WAIT_S)
        except Exception as exc:  # noqa: BLE001 - the store died too: its failover is this one
            log.warning("telling the checkpoint store of %s what was restored: %r", dead, exc)

    async def _import(
        self, target: str, ids: list[str], found: dict[str, Any]
    ) -> tuple[dict[str, int], dict[str, ActorError]]:
        entry = self.replicas[target]
        entry.reserved += len(ids)
        try:
            imported = await entry.replica.import_sessions(
                parts=[found[s][1][0] for s in ids],
                hold_s=RESTORED_HOLD_S,
                router=self.migrator.incarnation,
            )
        except Exception as exc:  # noqa: BLE001 - blamed on the side that failed
            if object_lost(exc):  # the checkpoints are gone, not the target: nothing to restore
                log.error("import on %s could not fetch the checkpoints: %s", target, exc)
                lost = ActorError(StatusCode.ABORTED, "the session's checkpoint was lost")
                return {}, dict.fromkeys(ids, lost)
            failure = CallFailure.of("import_sessions", f"replica {target}", exc)
            log_failure(log, failure)
            entry.call_errors[failure.method, failure.kind.value] += 1
            if failure.kind is FailureKind.DEAD:
                await self.on_dead(target, f"import_sessions failed: {failure.cause}")
            # the others are tried (this one is excluded); a live target stays in service
            again = ActorError(StatusCode.RESOURCE_EXHAUSTED, failure.message())
            return {}, dict.fromkeys(ids, again)
        finally:
            entry.reserved -= len(ids)
        if isinstance(imported, ActorError):
            return {}, dict.fromkeys(ids, imported)
        entry.take(imported.snapshot)
        landed = {info.session_id: info.committed_tokens for info in imported.opened}
        pinned = self.migrator.claims.land(list(landed), target)
        strays = await self.migrator.landing.strays([s for s in landed if s not in pinned], target)
        # declared dead as they landed: its copies go when it comes back; another is tried
        again = ActorError(StatusCode.RESOURCE_EXHAUSTED, f"{target} was declared dead")
        return {s: landed[s] for s in pinned}, {**imported.refused, **dict.fromkeys(strays, again)}
