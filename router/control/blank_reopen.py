"""``BlankReopen``: a dead replica's sessions that no checkpoint holds but that held nothing a
client saw, opened again, empty, on live replicas (part of ``router.control.failover``).

A session that the dead replica's store holds as blank (a store that follows a replica is
handed every session at once, a session holding nothing as blank, and each change after), or
one opened empty (``BlankOpen``: no prefix; or named by a replica's registration as holding
nothing yet) whose dead replica's store has followed it since then, and whose turn's end
never went out without a checkpoint (``CheckpointStats.let_go`` in the replica's last snapshot:
holds given up, and sessions whose committed state no connected store held, since a store went
or while none followed), committed nothing a client saw: a turn's end waits for its checkpoint.
It is opened again with the same id, tenant and idle timeout, at 0 committed tokens, waiting
for room as restores do.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from replica.api import ActorError, StatusCode
from router.call_errors import CallFailure, FailureKind, log_failure
from router.control.migration import Migrator
from router.control.opens import Opener
from router.control.registry import ReplicaRegistry
from router.control.room_wait import Landed, place_waiting
from router.control.table import (
    BlankOpen,
    ReplicaEntry,
    SessionEntry,
    SessionState,
    SessionTable,
)

log = logging.getLogger(__name__)


class BlankReopen:
    def __init__(
        self,
        replicas: ReplicaRegistry,
        sessions: SessionTable,
        migrator: Migrator,
        opener: Opener,
        on_dead: Callable[[str, str], Awaitable[Any]],
        wait_s: float,
    ) -> None:
        """``opener``: whose room the reopens wait for, claimed ahead of new opens."""
        self.replicas = replicas
        self.sessions = sessions
        self.migrator = migrator
        self.opener = opener
        self.on_dead = on_dead
        self.wait_s = wait_s

    def select(
        self, dead: ReplicaEntry, ids: list[str], store_blank: dict[str, float]
    ) -> dict[str, SessionEntry]:
        """Those of ``ids`` (no checkpoint found) opened empty since the store that answered
        followed the dead replica, or that this store holds as blank (``store_blank``: session
        id -> idle timeout; a store that follows a replica is handed every session it holds at
        once, as a checkpoint or, holding nothing, as blank, so a blank one there committed
        nothing since, whenever or however it came): they committed nothing a client saw (a
        turn's end waits for its checkpoint), so they open again; except those whose turn's
        end the replica's last snapshot says went out without one (``let_go``). One selected
        by the store's word is marked ``BlankOpen`` at the dead replica's store epoch, so that
        it stays blank where it opens again (``MovingSessions.land``). Logs why each is or is
        not."""
        let_go = dead.snapshot.checkpoints.let_go if dead.snapshot is not None else frozenset()
        blank, why_not = {}, {}
        for sid in ids:
            session = self.sessions.get(sid)
            if not session or session.state != SessionState.OPEN:
                why_not[sid] = "closed meanwhile (not lost)"
            elif sid in store_blank and sid not in let_go:
                session.blank = BlankOpen(store_blank[sid], dead.store_epoch)
                blank[sid] = session
            elif not session.blank:
                why_not[sid] = "moved, forked or opened with a prefix"
            elif session.blank.store_epoch != dead.store_epoch:
                why_not[sid] = (
                    f"opened at store epoch {session.blank.store_epoch}, "
                    f"before the store that answered ({dead.store_epoch})"
                )
            elif sid in let_go:
                why_not[sid] = "a turn of it ended without a checkpoint"
            else:
                blank[sid] = session
        replica_id = dead.desc.replica_id
        if blank:
            log.warning(
                "%s: %d sessions without a checkpoint open again empty (opened empty at store "
                "epoch %d, no turn's end let go without a checkpoint): %s",
                replica_id,
                len(blank),
                dead.store_epoch,
                ", ".join(sid[:12] for sid in blank),
            )
        by_reason: dict[str, list[str]] = {}
        for sid, why in why_not.items():
            by_reason.setdefault(why, []).append(sid[:12])
        for why, sids in by_reason.items():
            log.warning("%s: %d sessions have no checkpoint and cannot open again empty: %s: %s",
                        replica_id, len(sids), why, ", ".join(sids))  # fmt: skip
        return blank

    async def reopen(self, blank: dict[str, SessionEntry], dead: str) -> dict[str, int]:
        """Open ``blank`` again, empty, on live replicas with room (same id, tenant and idle
        timeout), waiting for room as restores do; returns those opened, each at 0 committed
        tokens."""

        async def land(groups: dict[str, list[str]]) -> Landed:
            done = Landed({}, [], set())
            for target, ids in groups.items():
                landed, full = await self._open_empty(target, [blank[s] for s in ids])
                done.sessions.update(dict.fromkeys(landed, 0))
                done.full.extend(full)
                if full:
                    done.full_targets.add(target)
            return done

        args = (self.migrator, self.opener, self.wait_s, land)
        reopened, pending = await place_waiting(list(blank), dead, *args)
        if pending:
            log.warning("%d sessions found no room to open again in time", len(pending))
        return reopened

    async def _open_empty(
        self, target: str, sessions: list[SessionEntry]
    ) -> tuple[list[str], list[str]]:
        """Open ``sessions`` empty on ``target``; returns (opened, refused for want of room)."""
        entry = self.replicas[target]
        requests = [(s.session_id, s.blank.idle_timeout_s, "", s.tenant, 0.0) for s in sessions]
        ids = [s.session_id for s in sessions]
        epoch = entry.store_epoch  # the store that follows them there from their open
        entry.reserved += len(ids)
        try:
            opened = await entry.replica.open_sessions(requests=requests)
        except Exception as exc:  # noqa: BLE001 - blamed on the target; the others are tried
            failure = CallFailure.of("open_sessions", f"replica {target}", exc)
            log_failure(log, failure)
            entry.call_errors[failure.method, failure.kind.value] += 1
            if failure.kind is FailureKind.DEAD:
                await self.on_dead(target, f"open_sessions failed: {failure.cause}")
            return [], ids
        finally:
            entry.reserved -= len(ids)
        if isinstance(opened, ActorError):
            log.warning("%s refused to open sessions again: %s", target, opened.message)
            return [], ids
        entry.take(opened.snapshot)
        landed, full = [], []
        for sid, result in zip(ids, opened.results):
            if not isinstance(result, ActorError):
                landed.append(sid)
            elif result.code == StatusCode.RESOURCE_EXHAUSTED:
                full.append(sid)
            else:
                log.warning("%s refused to open %s again: %s", target, sid[:16], result.message)
        pinned = self.migrator.claims.land(landed, target, blank_epoch=epoch)
        strays = await self.migrator.landing.strays([s for s in landed if s not in pinned], target)
        return pinned, full + strays  # a target declared dead meanwhile: another is tried
