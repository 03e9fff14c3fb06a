"""``ReplicaActor``: the Ray actor that owns one replica's engine, pools and sessions.

Refusals come back as ``ActorError`` values (a gRPC status name and a message), never as raised
exceptions, so callers map them without unwrapping Ray errors. The actor pushes its
``PoolSnapshot`` to the router about every second (``replica.reporting``).

A replica whose engine loop dies is dead even though its process lives: it ends every gateway's
output stream and its checkpoint stream at once, as the death of its process would, tells the
router (which marks it DEAD, restores its sessions elsewhere from their checkpoints and stops
placing on it), stops reporting snapshots and answers ``ping`` with False; every later call is
refused with ABORTED. The serve process then kills it and starts a replacement.

The calls about sessions (opens, one by one from the router or batched from gateways; closes;
lookups) are ``SessionsAPI``'s; turns, leases and their token streams ``TurnCalls``'s; moving
sessions to and from other replicas is ``SessionMovesAPI``'s; checkpoints are
``CheckpointsAPI``'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

import ray

from replica import failpoints
from replica.actor_checkpoints import CheckpointsAPI
from replica.actor_moves import SessionMovesAPI
from replica.actor_sessions import SessionsAPI
from replica.actor_turns import TurnCalls
from replica.api import (
    ActorError,
    ChatPrompt,
    InvalidRequestError,
    ModelCard,
    PoolSnapshot,
    ReleaseReason,
    ReplicaDescription,
    ReplicaError,
)
from replica.checkpoints.outbox import CheckpointOutbox
from replica.checkpoints.store import CheckpointStore
from replica.config import ReplicaConfig
from replica.gateway_outputs import GatewayOutputs
from replica.reporting import RouterReporter

log = logging.getLogger(__name__)

__all__ = ["CheckpointStore", "ReplicaActor"]  # the serve process starts a store per replica


class ReplicaActor(SessionsAPI, TurnCalls, SessionMovesAPI, CheckpointsAPI):
    def __init__(
        self,
        replica_id: str,
        config: ReplicaConfig,
        router: Any = None,
        report_interval_s: float = 1.0,
    ) -> None:
        import torch

        from replica.engine.engine import Engine
        from replica.generation import GenerationDefaults
        from replica.generation.chat_prompts import ChatPrompts
        from replica.model import load
        from replica.model.factory import BUILTINS
        from replica.model.source import resolve

        if config.threads:
            torch.set_num_threads(config.threads)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.replica_id = replica_id
        # The hub id (if --model is one) resolves here, in this node's cache (replica.model.source)
        source = resolve(config.model_name, frozenset(BUILTINS), config.revision)
        _, net, tokenizer = load(
            source.path or source.builtin, device=device, dtype=config.weights_dtype
        )
        pools = dataclasses.replace(config.pools, device=device)
        self.config = dataclasses.replace(config, pools=pools)
        self.tokenizer = tokenizer
        generation = GenerationDefaults.from_checkpoint(source.path)
        self.chat_prompts = ChatPrompts(source.path, tokenizer)
        self.loaded_at = int(time.time())
        self.call_faults = failpoints.CallFaults(config.failpoints)
        self.engine = Engine(self.config, net, tokenizer, replica_id, generation=generation)
        self.router = router
        self.report_interval_s = report_interval_s
        self.outputs = GatewayOutputs(on_gone=self._gateway_gone)
        self.checkpoint_outbox: CheckpointOutbox | None = None
        self.checkpoint_store: Any = None  # set when the store follows this replica
        self._async = None
        self._reporter: RouterReporter | None = None
        self._tasks: set[asyncio.Task] = set()  # the report loop, the death report

    async def _ensure_started(self) -> None:
        if self._async is None:
            from replica.engine.async_engine import AsyncEngine

            dispatch = self.outputs.dispatch
            if self.config.session_checkpoints:
                outbox = self.checkpoint_outbox = CheckpointOutbox(
                    dispatch, self.config.pools.max_open_sessions, self._checkpoints_connected
                )
                open_slots = self.engine.sessions.sessions  # read on the engine thread
                noted = self.engine.checkpoints.noted

                def covered(sid: str) -> bool:
                    """Its checkpoint is on its way, or it holds nothing yet: a failover
                    opens it again, empty (``router.control.failover``)."""
                    slot = open_slots.get(sid)
                    return noted(sid) or (slot is not None and slot.committed_tokens == 0)

                self.engine.checkpoint_accounting = lambda: (
                    outbox.pool_stats(),
                    outbox.stats(open_slots, covered),
                )
                dispatch = outbox.dispatch
            self._async = AsyncEngine(
                self.engine,
                dispatch,
                self._note_released,
                on_failed=self._engine_failed,
                on_checkpoints=self.checkpoint_outbox and self.checkpoint_outbox.push,
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
            if self.checkpoint_outbox is not None:
                self._spawn(self._watch_checkpoint_store())

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
            self.checkpoint_store,
            await self._call(self.engine.blank_sessions),
        )

    def _note_released(self, session_ids: list[str]) -> None:
        if self._reporter is not None:
            self._reporter.note_released(session_ids)

    def _engine_failed(self, error: BaseException) -> None:
        """The engine loop died: end the output and checkpoint streams now, tell the router."""
        why = f"engine loop failed: {type(error).__name__}: {error}"
        self.outputs.fail(why)
        if self.checkpoint_outbox is not None:
            self.checkpoint_outbox.close()
        if self._reporter is not None:
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

    async def model_card(self) -> ModelCard:
        return ModelCard(
            self.config.model_name,
            self.config.pools.max_context,
            self.chat_prompts.template is not None,
            self.loaded_at,
        )

    async def chat_prompt(
        self, messages: list[dict], prior_ids: list[int] | None = None
    ) -> ChatPrompt | ActorError:
        """The prompt tokens of a chat turn (``replica.generation.chat_prompts``), rendered on a
        worker thread (a long conversation must not hold up the event loop); a conversation
        the template cannot render is INVALID_ARGUMENT."""
        try:
            return await asyncio.to_thread(self.chat_prompts.prompt, messages, prior_ids)
        except InvalidRequestError as exc:
            return exc.to_actor_error()

    async def snapshot(self, exact: bool = True) -> PoolSnapshot | ActorError:
        """A consistent snapshot: ``exact`` takes it between two steps, else the latest one."""
        if exact:
            return await self._call(self.engine.snapshot)
        await self._ensure_started()
        return self._async.latest_snapshot

    async def check_invariant(self) -> PoolSnapshot | ActorError:
        return await self._call(self.engine.check_invariant)

    async def drain(self, draining: bool = True) -> PoolSnapshot | ActorError:
        """Drain (or resume) the replica; returns the snapshot taken right after, which says
        so, for the router to place by at once."""

        def set_draining() -> PoolSnapshot:
            self.engine.draining = draining
            return self.engine.snapshot()

        return await self._call(set_draining)

    async def ping(self) -> bool:
        await self._ensure_started()
        return self._async.error is None

    async def shutdown(self) -> int:
        """Release every session (reason ``aborted``) and stop the engine; returns how many
        sessions it released."""
        if self._async is None:
            return 0

        def release_all() -> int:
            count = len(self.engine.sessions)
            self.engine.close_all(ReleaseReason.ABORTED)
            return count

        released = await self._call(release_all)
        self.outputs.close()
        self._async.stop()
        return released if isinstance(released, int) else 0
