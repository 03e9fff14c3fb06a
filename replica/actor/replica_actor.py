"""``ReplicaActor``: the Ray actor that owns one replica's engine, pools and sessions.

It builds its parts in ``__init__`` and delegates each remote method (Ray needs them on the
class) to the part that owns it; every caller goes through ``replica.actor.client``. Refusals
come back as ``ActorError`` values, never as raised exceptions. The engine starts on the first
call that needs it (``EngineHost``); what it produces (events, releases, checkpoints, its death)
is routed here to the parts that take it. A replica whose engine loop dies is dead though its
process lives: its output and checkpoint streams end at once, the router is told (it restores
the sessions elsewhere from their checkpoints), ``ping`` answers False and every later call is
refused with ABORTED; the serve process then replaces it.
"""

from __future__ import annotations

from typing import Any

import ray

from replica import failpoints
from replica.actor.checkpoints import CheckpointCalls
from replica.actor.engine_host import EngineHost
from replica.actor.gateway_outputs import STREAM_BACKPRESSURE
from replica.actor.loaded_model import LoadedModel
from replica.actor.moves import MoveCalls
from replica.actor.output_streams import OutputStreams
from replica.actor.registration import Registration
from replica.actor.reporting import RouterReporter
from replica.actor.sessions import SessionCalls
from replica.actor.status import ReplicaStatus
from replica.actor.stream_threads import FIRST_GROUP, OUTPUT_STREAM_THREADS
from replica.actor.tasks import BackgroundTasks
from replica.actor.turns import TurnCalls
from replica.api import (
    ActorError,
    ChatPrompt,
    Closed,
    Exported,
    ForkedTurn,
    Imported,
    ModelCard,
    OpenArgs,
    Opened,
    OpenedBatch,
    OutputAddress,
    PoolSnapshot,
    ReleaseReason,
    RenderedTurn,
    ReplicaDescription,
    SamplingParams,
    SessionInfo,
    SessionStates,
    TurnArgs,
)
from replica.checkpoints.log import CheckpointBatch
from replica.config import ReplicaConfig
from replica.engine.step_outputs import StepOutputs


class ReplicaActor:
    def __init__(
        self,
        replica_id: str,
        config: ReplicaConfig,
        router: Any = None,
        report_interval_s: float = 1.0,
        stream_threads: int = OUTPUT_STREAM_THREADS,
    ) -> None:
        """``router``: the ``SessionRouter``'s handle (None: report to no router);
        ``stream_threads``: the class's output stream groups (``remote_replica_actor``)."""
        from replica.engine.engine import Engine

        model = LoadedModel.load(config)
        config = model.config
        self.engine = Engine(
            config, model.net, model.tokenizer, replica_id, generation=model.generation
        )
        self.tasks = BackgroundTasks()
        self.host = EngineHost(
            self.engine,
            on_events=self._engine_events,
            on_released=self._engine_released,
            on_failed=self._engine_failed,
            on_checkpoints=self._engine_checkpoints if config.session_checkpoints else None,
            on_started=self._engine_started,
            on_rows=self._engine_rows,
        )
        faults = failpoints.CallFaults(config.failpoints)
        socket_host = ray.util.get_node_ip_address() if config.output_socket else None
        self.outputs = OutputStreams(
            self.engine, self.host, self.tasks, stream_threads, socket_host
        )
        self.checkpoints = CheckpointCalls(
            self.engine,
            self.host,
            self.tasks,
            self.outputs.dispatch,
            config.session_checkpoints,
            faults,
            socket_host,
        )
        self.status = ReplicaStatus(
            replica_id, config, self.engine, self.host, model.chat_prompts, self.outputs
        )
        self.sessions = SessionCalls(self.engine, self.host, faults)
        self.turns = TurnCalls(self.engine, self.host, model.tokenizer, model.chat_prompts, faults)
        registration = Registration(self.status, self.sessions, self.host, self.checkpoints)
        self.reporter: RouterReporter | None = None
        if router is not None:
            self.reporter = RouterReporter(
                replica_id,
                router,
                self.host.published_snapshot,
                registration.arguments,
                report_interval_s,
                "drop_snapshots" in config.failpoints,
            )
        self.moves = MoveCalls(self.engine, self.host, self.checkpoints, faults, self.reporter)

    # ----- what the engine produces, routed to the parts that take it; then the remote methods

    def _engine_started(self) -> None:
        if self.reporter is not None:
            self.tasks.spawn(self.reporter.run())
        self.checkpoints.start()

    def _engine_events(self, events: list[StepOutputs]) -> None:
        self.checkpoints.dispatch(events)

    def _engine_rows(self, rows: list[StepOutputs]) -> bool:
        return self.checkpoints.send_rows(rows)  # on the engine thread

    def _engine_checkpoints(self, batch: CheckpointBatch) -> None:
        self.checkpoints.push(batch)

    def _engine_released(self, session_ids: list[str]) -> None:
        if self.reporter is not None:
            self.reporter.note_released(session_ids)

    def _engine_failed(self, error: BaseException) -> None:
        """The engine loop died: end the output and checkpoint streams now, tell the router."""
        why = f"engine loop failed: {type(error).__name__}: {error}"
        self.outputs.fail(why)
        self.checkpoints.close()
        if self.reporter is not None:
            self.tasks.spawn(self.reporter.report_death(why))

    async def describe(self) -> ReplicaDescription:
        return await self.status.describe()

    async def model_card(self) -> ModelCard:
        return await self.status.model_card()

    async def chat_prompt(
        self, messages: list[dict], prior_ids: list[int] | None = None
    ) -> ChatPrompt | ActorError:
        return await self.status.chat_prompt(messages, prior_ids)

    async def snapshot(self, exact: bool = True) -> PoolSnapshot | ActorError:
        return await self.status.snapshot(exact)

    async def check_invariant(self) -> PoolSnapshot | ActorError:
        return await self.status.check_invariant()

    async def drain(self, draining: bool = True) -> PoolSnapshot | ActorError:
        return await self.status.drain(draining)

    async def ping(self) -> bool:
        return await self.status.ping()

    async def shutdown(self) -> int:
        return await self.status.shutdown()

    async def open_sessions(self, requests: list[OpenArgs]) -> OpenedBatch | ActorError:
        return await self.sessions.open_sessions(requests)

    async def open_session(
        self,
        session_id: str,
        idle_timeout_s: float = 0.0,
        gateway_id: str = "",
        tenant: str = "",
        lease_s: float = 0.0,
        prefix: str | list[int] | None = None,
    ) -> Opened | ActorError:
        return await self.sessions.open_session(
            session_id, idle_timeout_s, gateway_id, tenant, lease_s, prefix
        )

    async def fork_session(
        self, parent_id: str, child_id: str, gateway_id: str = ""
    ) -> Opened | ActorError:
        return await self.sessions.fork_session(parent_id, child_id, gateway_id)

    async def close_sessions(
        self, session_ids: list[str], reason: ReleaseReason = ReleaseReason.CLOSED
    ) -> Closed | ActorError:
        return await self.sessions.close_sessions(session_ids, reason)

    async def get_session(self, session_id: str) -> SessionInfo | ActorError:
        return await self.sessions.get_session(session_id)

    async def list_sessions(self) -> dict[str, str] | ActorError:
        return await self.sessions.list_sessions()

    async def submit_turns(
        self, gateway_id: str, turns: list[TurnArgs]
    ) -> list[int | ForkedTurn | RenderedTurn | ActorError] | ActorError:
        return await self.turns.submit_turns(gateway_id, turns)

    async def submit_turn(
        self,
        gateway_id: str,
        session_id: str,
        text: str | None,
        token_ids: list[int] | None,
        sampling: SamplingParams,
    ) -> int | ActorError:
        return await self.turns.submit_turn(gateway_id, session_id, text, token_ids, sampling)

    async def hold_sessions(self, session_ids: list[str], lease_s: float) -> list[str] | ActorError:
        return await self.turns.hold_sessions(session_ids, lease_s)

    async def interrupt(self, session_id: str) -> bool | ActorError:
        return await self.turns.interrupt(session_id)

    async def cancel(
        self, session_id: str, why: str = "cancelled by the client", turn_id: int | None = None
    ) -> bool | ActorError:
        return await self.turns.cancel(session_id, why, turn_id)

    async def output_address(self) -> OutputAddress | None:
        return self.outputs.address

    async def output_stream_group(self, gateway_id: str) -> str:
        return self.outputs.reserve(gateway_id)

    @ray.method(
        concurrency_group=FIRST_GROUP, _generator_backpressure_num_objects=STREAM_BACKPRESSURE
    )
    def stream_outputs(self, gateway_id: str, group: str):
        yield from self.outputs.stream(gateway_id, group)

    @ray.method(_generator_backpressure_num_objects=STREAM_BACKPRESSURE)
    async def stream_outputs_async(self, gateway_id: str):
        async for batch in self.outputs.stream_async(gateway_id):
            yield batch

    async def mark_moving(self, session_ids: list[str]) -> Exported | ActorError:
        return await self.moves.mark_moving(session_ids)

    async def wait_turns_ended(
        self, session_ids: list[str], wait_s: float
    ) -> list[str] | ActorError:
        return await self.moves.wait_turns_ended(session_ids, wait_s)

    async def export_sessions(
        self, session_ids: list[str]
    ) -> tuple[Exported | ActorError, SessionStates | None]:
        return await self.moves.export_sessions(session_ids)

    async def finish_export(self, session_ids: list[str], moved: bool) -> PoolSnapshot | ActorError:
        return await self.moves.finish_export(session_ids, moved)

    async def import_sessions(
        self, parts: list, hold_s: float = 0.0, router: str | None = None
    ) -> Imported | ActorError:
        return await self.moves.import_sessions(parts, hold_s, router)

    async def checkpoint_socket(self, store: Any, confirm_on_ack: bool) -> OutputAddress | None:
        return self.checkpoints.open_socket(store, confirm_on_ack)

    async def checkpoint_stream(self, store: Any, confirm_on_ack: bool):
        async for item in self.checkpoints.stream(store, confirm_on_ack):
            yield item

    async def checkpoints_acked(self, seq: int, held: int, held_bytes: int) -> None:
        self.checkpoints.acked(seq, held, held_bytes)
