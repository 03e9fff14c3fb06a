"""``ReplicaActor``: the Ray actor that owns one replica's engine, pools and sessions.

Turns and their token streams are ``replica.actor_turns.TurnCalls``'s; opens come one by one
from the router or in batches from gateways (``replica.batch_calls``).

Refusals come back as ``ActorError`` values (a gRPC status name and a message), never as raised
exceptions, so callers map them without unwrapping Ray errors. The actor pushes its
``PoolSnapshot`` to the router about every second (``replica.reporting``).

A replica whose engine loop dies is dead even though its process lives: it ends every session's
call with ABORTED at once (an event to each session's gateway), tells the router (which marks it
DEAD and stops placing on it), stops reporting snapshots and answers ``ping`` with False; every
later call is refused with ABORTED. The serve process then kills it and starts a replacement.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import ray

from replica.actor_turns import TurnCalls
from replica.api import (
    ActorError,
    Closed,
    OpenArgs,
    Opened,
    OpenedBatch,
    PoolSnapshot,
    ReleaseReason,
    ReplicaDescription,
    ReplicaError,
    SessionInfo,
)
from replica.batch_calls import open_batch
from replica.config import ReplicaConfig
from replica.gateway_outputs import GatewayOutputs
from replica.reporting import RouterReporter

log = logging.getLogger(__name__)


class ReplicaActor(TurnCalls):
    def __init__(
        self,
        replica_id: str,
        config: ReplicaConfig,
        router: Any = None,
        report_interval_s: float = 1.0,
    ) -> None:
        import torch

        from replica.engine.engine import Engine
        from replica.model import load

        if config.threads:
            torch.set_num_threads(config.threads)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.replica_id = replica_id
        _, net, tokenizer = load(config.model, config.model_path, device=device)
        pools = dataclasses.replace(config.pools, device=device)
        self.config = dataclasses.replace(config, pools=pools)
        self.tokenizer = tokenizer
        self.engine = Engine(self.config, net, tokenizer, replica_id)
        self.router = router
        self.report_interval_s = report_interval_s
        self.outputs = GatewayOutputs(on_gone=self._gateway_gone)
        self._async = None
        self._reporter: RouterReporter | None = None
        self._tasks: set[asyncio.Task] = set()  # the report loop, the death report

    async def _ensure_started(self) -> None:
        if self._async is None:
            from replica.engine.async_engine import AsyncEngine

            self._async = AsyncEngine(
                self.engine,
                self.outputs.dispatch,
                self._note_released,
                on_failed=self._engine_failed,
            )
            if self.router is not None:
                self._reporter = RouterReporter(
                    self.replica_id,
                    self.router,
                    lambda: self._async.latest_snapshot,
                    self._registration,
                    self.report_interval_s,
                    "drop_snapshots" in self.config.failpoints,
                )
                self._spawn(self._reporter.run())

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _registration(self) -> tuple:
        return (
            ray.get_runtime_context().current_actor,
            await self.describe(),
            await self._call(self.engine.session_tenants),
            self._async.latest_snapshot,
        )

    def _note_released(self, session_ids: list[str]) -> None:
        if self._reporter is not None:
            self._reporter.note_released(session_ids)

    def _engine_failed(self, error: BaseException) -> None:
        """The engine loop died: end every session's call now, and tell the router."""
        sessions = self.engine.sessions.sessions  # the engine thread is gone: safe to read
        self.outputs.abort_sessions({sid: slot.gateway_id for sid, slot in sessions.items()})
        if self._reporter is not None:
            why = f"engine loop failed: {type(error).__name__}: {error}"
            self._spawn(self._reporter.report_death(why))

    async def _call(self, fn, *args) -> Any:
        await self._ensure_started()
        try:
            return await self._async.call(fn, *args)
        except ReplicaError as exc:
            return exc.to_actor_error()

    # ----- the router's and gateways' API ---------------------------------------------------

    async def describe(self) -> ReplicaDescription:
        await self._ensure_started()
        pools = self.config.pools
        return ReplicaDescription(
            self.replica_id,
            ray.get_runtime_context().get_node_id(),
            self.engine.incarnation,
            pools.mamba_slots_per_seq,
            pools.kv_tokens_per_session,
            pools.max_context,
            self.engine.model_config.vocab_size,
        )

    async def open_sessions(self, requests: list[OpenArgs]) -> OpenedBatch | ActorError:
        """Open sessions, each ``(session_id, idle_timeout_s, gateway_id, tenant, lease_s)``
        (``lease_s`` > 0: a stream holds it open, see ``hold_sessions``); each is opened or
        refused on its own. The reply carries the snapshot taken after the last, so the caller's
        view of this replica's room is never older than its own placements."""
        return await self._call(open_batch, self.engine, requests)

    async def open_session(
        self,
        session_id: str,
        idle_timeout_s: float = 0.0,
        gateway_id: str = "",
        tenant: str = "",
        lease_s: float = 0.0,
    ) -> Opened | ActorError:
        """``open_sessions`` of one session."""
        batch = await self.open_sessions(
            [(session_id, idle_timeout_s, gateway_id, tenant, lease_s)]
        )
        if isinstance(batch, ActorError) or isinstance(batch.results[0], ActorError):
            return batch if isinstance(batch, ActorError) else batch.results[0]
        return Opened(batch.results[0], batch.snapshot)

    async def close_sessions(
        self, session_ids: list[str], reason: ReleaseReason = ReleaseReason.CLOSED
    ) -> Closed | ActorError:
        """Release sessions (idempotent); the reply carries the snapshot taken right after."""

        def close_all() -> Closed:
            was_open = tuple(self.engine.close_session(sid, reason) for sid in session_ids)
            return Closed(was_open, self.engine.snapshot())

        return await self._call(close_all)

    async def get_session(self, session_id: str) -> SessionInfo | ActorError:
        return await self._call(self.engine.session_info, session_id)

    async def list_sessions(self) -> dict[str, str] | ActorError:
        """Every session the replica holds, with its tenant."""
        return await self._call(self.engine.session_tenants)

    async def snapshot(self, exact: bool = True) -> PoolSnapshot | ActorError:
        """A consistent snapshot: ``exact`` takes it between two steps, else the latest one."""
        if exact:
            return await self._call(self.engine.snapshot)
        await self._ensure_started()
        return self._async.latest_snapshot

    async def check_invariant(self) -> PoolSnapshot | ActorError:
        return await self._call(self.engine.check_invariant)

    async def drain(self, draining: bool = True) -> None:
        def set_draining() -> None:
            self.engine.draining = draining

        await self._call(set_draining)

    async def ping(self) -> bool:
        await self._ensure_started()
        return self._async.error is None

    async def shutdown(self) -> None:
        if self._async is not None:
            await self._call(self.engine.close_all, ReleaseReason.ABORTED)
            self.outputs.close()
            self._async.stop()
