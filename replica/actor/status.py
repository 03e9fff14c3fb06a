"""``ReplicaStatus``: the replica actor's calls about the replica as a whole: what it is
(``describe``, ``model_card``), its pools (``snapshot``, ``check_invariant``), draining, health
(``ping``) and shutdown, and the chat prompts of its model.

A replica whose engine loop has died answers ``ping`` with False; every call that needs the
engine is refused with ABORTED from then on (``EngineHost.call``).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import ray

from replica.actor.engine_host import EngineHost
from replica.actor.output_streams import OutputStreams
from replica.api import (
    ActorError,
    ChatPrompt,
    InvalidRequestError,
    ModelCard,
    PoolSnapshot,
    ReleaseReason,
    ReplicaDescription,
)
from replica.config import ReplicaConfig

if TYPE_CHECKING:
    from replica.engine.engine import Engine
    from replica.generation.chat_prompts import ChatPrompts


class ReplicaStatus:
    def __init__(
        self,
        replica_id: str,
        config: ReplicaConfig,
        engine: Engine,
        host: EngineHost,
        chat_prompts: ChatPrompts,
        outputs: OutputStreams,
    ) -> None:
        self.replica_id = replica_id
        self.config = config
        self.engine = engine
        self.host = host
        self.chat_prompts = chat_prompts
        self.outputs = outputs
        self.loaded_at = int(time.time())

    async def describe(self) -> ReplicaDescription:
        await self.host.start()
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
            return await self.host.call(self.engine.snapshot)
        return await self.host.latest_snapshot()

    async def check_invariant(self) -> PoolSnapshot | ActorError:
        return await self.host.call(self.engine.check_invariant)

    async def drain(self, draining: bool = True) -> PoolSnapshot | ActorError:
        """Drain (or resume) the replica; returns the snapshot taken right after, which says
        so, for the router to place by at once."""

        def set_draining() -> PoolSnapshot:
            self.engine.session_ops.draining = draining
            return self.engine.snapshot()

        return await self.host.call(set_draining)

    async def ping(self) -> bool:
        return await self.host.healthy()

    async def shutdown(self) -> int:
        """Release every session (reason ``aborted``) and stop the engine; returns how many
        sessions it released."""
        if not self.host.started:
            return 0

        def release_all() -> int:
            count = len(self.engine.sessions)
            self.engine.session_ops.close_all(ReleaseReason.ABORTED)
            return count

        released = await self.host.call(release_all)
        self.outputs.close()
        self.host.stop()
        return released if isinstance(released, int) else 0
