"""``MoveCalls``: the replica actor's half of moving sessions between replicas; the router's half
is ``router.control.migration``, the engine's ``replica.engine.moves.SessionMoves``.

- ``mark_moving(ids)``: mark sessions moving (``replica.engine.moves``); which are ready to
  export now (``Exported.exported``), still running a turn (``busy``) or not open (``missing``).
- ``wait_turns_ended(ids, wait_s)``: wait until none of them runs or queues a turn; returns
  those still busy after ``wait_s``.
- ``export_sessions(ids)``: two results (call it with ``num_returns=2``): what was exported, and
  the ``SessionStates`` record, which stays in Ray's object store for the target to fetch.
- ``finish_export(ids, moved)``: release them here (they landed) or unmark them (they did not).
- ``import_sessions(parts, router=...)``: open the sessions of records (or ObjectRefs of
  records) here; refused, before anything is opened, when ``router`` (the incarnation of the
  router that sent the move) is not the router this replica reports to now: that router died
  and its successor learned this replica's sessions without these (a copy landing now would
  be pinned nowhere; the source takes the sessions back).
Every refusal comes back as an ``ActorError``, as in the rest of the actor's API. The failpoints
``import_*`` and ``finish_export_*`` (``replica.failpoints``) fault the last two.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import ray

from replica.actor.checkpoints import CheckpointCalls
from replica.actor.engine_host import EngineHost
from replica.actor.reporting import RouterReporter
from replica.api import ActorError, Exported, Imported, PoolSnapshot, SessionStates, StatusCode
from replica.failpoints import LATE_S, CallFaults

if TYPE_CHECKING:
    from replica.engine.engine import Engine

log = logging.getLogger(__name__)

BUSY_POLL_S = 0.01


class MoveCalls:
    def __init__(
        self,
        engine: Engine,
        host: EngineHost,
        checkpoints: CheckpointCalls,
        call_faults: CallFaults,
        reporter: RouterReporter | None,
    ) -> None:
        """``reporter``: whose ``router_incarnation`` says which router's moves are taken."""
        self.engine = engine
        self.host = host
        self.checkpoints = checkpoints
        self.call_faults = call_faults  # import_* and finish_export_* (replica.failpoints)
        self.reporter = reporter

    async def mark_moving(self, session_ids: list[str]) -> Exported | ActorError:
        return await self.host.call(self.engine.moves.mark, session_ids)

    async def wait_turns_ended(
        self, session_ids: list[str], wait_s: float
    ) -> list[str] | ActorError:
        deadline = time.monotonic() + wait_s
        while True:
            busy = await self.host.call(self.engine.moves.busy, session_ids)
            if isinstance(busy, ActorError) or not busy or time.monotonic() >= deadline:
                return busy
            await asyncio.sleep(BUSY_POLL_S)

    async def export_sessions(
        self, session_ids: list[str]
    ) -> tuple[Exported | ActorError, SessionStates | None]:
        result = await self.host.call(self.engine.moves.export, session_ids)
        return (result, None) if isinstance(result, ActorError) else result

    async def finish_export(self, session_ids: list[str], moved: bool) -> PoolSnapshot | ActorError:
        if moved:  # a move that landed: the sessions are on their target and still here
            self.call_faults.raise_if("finish_export_fails", "finish_export")
            self.call_faults.crash_if("finish_export_crashes")
        return await self.host.call(self.engine.moves.finish, session_ids, moved)

    async def import_sessions(
        self, parts: list, hold_s: float = 0.0, router: str | None = None
    ) -> Imported | ActorError:
        """``parts``: ``SessionStates`` records, or ObjectRefs of them (fetched here, straight
        from the object store they are in); each session held at least ``hold_s`` seconds;
        ``router``: the incarnation of the router that sent the move (None: not checked). With
        checkpoints on, answers once the sessions' first checkpoints here are stored: the state
        is never in one replica's hands only."""
        self.call_faults.raise_if("import_fails", "import_sessions")
        records = [await part if isinstance(part, ray.ObjectRef) else part for part in parts]
        await self.call_faults.hold_if(
            "import_lands_late", lambda: self._sent_by_another(router), LATE_S
        )
        # no await between this check and the engine command: a registration with a restarted
        # router reads the sessions after ``router_incarnation`` changed, so an import either
        # lands before that read (the new router sees its copy) or is refused here
        if self._sent_by_another(router):
            why = (
                f"a move sent by router {router}, which has been replaced (by "
                f"{self.reporter.router_incarnation}): nothing imported; the sessions go on "
                "from their source"
            )
            log.warning("import of %d session(s) refused: %s", len(records), why)
            return ActorError(StatusCode.FAILED_PRECONDITION, why)
        imported = await self.host.call(self.engine.moves.import_, records, hold_s)
        self.call_faults.crash_if("import_crashes")  # dies with the sessions in its pools
        await self.call_faults.stall_if("import_stalls")  # may be declared dead meanwhile
        if not isinstance(imported, ActorError):
            await self.checkpoints.durable([info.session_id for info in imported.opened])
        return imported

    def _sent_by_another(self, router: str | None) -> bool:
        """Whether ``router`` (None: not checked) is not the router this replica reports to
        now (None until a router answered)."""
        current = None if self.reporter is None else self.reporter.router_incarnation
        return router is not None and current not in (None, router)
