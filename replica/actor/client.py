"""``ReplicaClient``: the typed calls to one ``ReplicaActor``, the only way anything calls it.

One method per remote method of the actor, with keyword arguments and the actor's own result
types (``replica.api``): refusals come back as ``ActorError`` values; a call that fails in Ray
(the actor died, is restarting, or raised) raises Ray's error from the awaited method, for the
caller to read with its own retry and classification policy. The client holds nothing but the
handle: it is cheap to make, and travels across Ray inside a ``Route``.

A gateway reads its outputs with ``read_outputs``: over the replica's output socket
(``replica.actor.output_server``) when it has one and a connection is made, else from the Ray
stream; a checkpoint store reads its checkpoints with ``checkpoint_items``, over a socket the
same way. Two calls are not plain coroutines, because their callers need the object references:
the streaming calls (``stream_outputs``, ``checkpoint_stream``) answer their items' references,
whose items the caller owns (``checkpoint_stream``'s each read so that a read Ray leaves asleep
costs at most a recheck: ``replica.actor.stream_reads``); ``export_sessions`` answers the
references of its two results, so the exported state can go to its target without passing
through the caller.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray import ObjectRef, ObjectRefGenerator

from replica.actor.output_reader import SocketNotTaken, read_socket_outputs
from replica.actor.stream_reads import refs
from replica.api import (
    ActorError,
    ChatPrompt,
    Closed,
    DeliveryEntry,
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
from replica.checkpoints.entries import CheckpointEntry
from replica.checkpoints.socket_reader import CheckpointSocketReader

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReplicaClient:
    handle: Any  # the ReplicaActor's handle

    # ----- the replica as a whole ---------------------------------------------------------

    async def describe(self) -> ReplicaDescription:
        return await self.handle.describe.remote()

    async def snapshot(self, *, exact: bool = True) -> PoolSnapshot | ActorError:
        return await self.handle.snapshot.remote(exact)

    async def check_invariant(self) -> PoolSnapshot | ActorError:
        return await self.handle.check_invariant.remote()

    async def drain(self, *, draining: bool = True) -> PoolSnapshot | ActorError:
        return await self.handle.drain.remote(draining)

    async def ping(self) -> bool:
        return await self.handle.ping.remote()

    async def shutdown(self) -> int:
        return await self.handle.shutdown.remote()

    async def model_card(self) -> ModelCard:
        return await self.handle.model_card.remote()

    async def chat_prompt(
        self, *, messages: list[dict], prior_ids: list[int] | None = None
    ) -> ChatPrompt | ActorError:
        return await self.handle.chat_prompt.remote(messages, prior_ids)

    # ----- sessions -----------------------------------------------------------------------

    async def open_sessions(self, *, requests: list[OpenArgs]) -> OpenedBatch | ActorError:
        return await self.handle.open_sessions.remote(requests)

    async def open_session(
        self,
        *,
        session_id: str,
        idle_timeout_s: float = 0.0,
        gateway_id: str = "",
        tenant: str = "",
        lease_s: float = 0.0,
        prefix: str | list[int] | None = None,
    ) -> Opened | ActorError:
        return await self.handle.open_session.remote(
            session_id, idle_timeout_s, gateway_id, tenant, lease_s, prefix
        )

    async def fork_session(
        self, *, parent_id: str, child_id: str, gateway_id: str = ""
    ) -> Opened | ActorError:
        return await self.handle.fork_session.remote(parent_id, child_id, gateway_id)

    async def close_sessions(
        self, *, session_ids: list[str], reason: ReleaseReason = ReleaseReason.CLOSED
    ) -> Closed | ActorError:
        return await self.handle.close_sessions.remote(session_ids, reason)

    async def get_session(self, *, session_id: str) -> SessionInfo | ActorError:
        return await self.handle.get_session.remote(session_id)

    async def list_sessions(self) -> dict[str, str] | ActorError:
        return await self.handle.list_sessions.remote()

    # ----- turns and leases ---------------------------------------------------------------

    async def submit_turns(
        self, *, gateway_id: str, turns: list[TurnArgs]
    ) -> list[int | ForkedTurn | RenderedTurn | ActorError] | ActorError:
        return await self.handle.submit_turns.remote(gateway_id, turns)

    async def submit_turn(
        self,
        *,
        gateway_id: str,
        session_id: str,
        text: str | None,
        token_ids: list[int] | None,
        sampling: SamplingParams,
    ) -> int | ActorError:
        return await self.handle.submit_turn.remote(
            gateway_id, session_id, text, token_ids, sampling
        )

    async def hold_sessions(
        self, *, session_ids: list[str], lease_s: float
    ) -> list[str] | ActorError:
        return await self.handle.hold_sessions.remote(session_ids, lease_s)

    async def interrupt(self, *, session_id: str) -> bool | ActorError:
        return await self.handle.interrupt.remote(session_id)

    async def cancel(
        self,
        *,
        session_id: str,
        why: str = "cancelled by the client",
        turn_id: int | None = None,
    ) -> bool | ActorError:
        return await self.handle.cancel.remote(session_id, why, turn_id)

    async def output_address(self) -> OutputAddress | None:
        return await self.handle.output_address.remote()

    async def read_outputs(
        self,
        *,
        gateway_id: str,
        on_entries: Callable[[list[DeliveryEntry]], None],
        use_socket: bool = True,
    ) -> None:
        """Hand each item of ``gateway_id``'s outputs to ``on_entries`` until the replica ends
        the stream (returns) or it breaks (raises: Ray's error, or ``ReplicaStreamError``).
        Over the replica's output socket when it has one and it connects (and ``use_socket``),
        else, from the start, over the Ray stream."""
        address = await self.output_address() if use_socket else None
        if address is not None:
            try:
                await read_socket_outputs(address, gateway_id, on_entries)
                return
            except SocketNotTaken as exc:
                log.warning("no output socket (%s): reading the Ray stream", exc)
        async for ref in await self.stream_outputs(gateway_id=gateway_id):
            # the read hands out an item once it is ready, which Ray defines as "its get
            # returns at once" (the items are a step's tokens and events, inlined in the
            # stream's reports): no future and loop hop of an ``await`` per item
            on_entries(ray.get(ref))

    async def stream_outputs(self, *, gateway_id: str) -> ObjectRefGenerator:
        """The long-lived stream of ``gateway_id``'s outputs: references to lists of
        ``replica.api.DeliveryEntry`` (an empty one now and then while nothing comes). It runs
        on a thread of the replica's own when one is free (one call first reserves it), else on
        the replica's event loop. Read as Ray gives it, without ``refs``' rechecks: those cost a
        gateway about 4 % more CPU per token (a task and a timed wait per item; four alternating
        runs of 64 streams), and Ray's missed wake-up was seen on checkpoint streams only."""
        group = await self.handle.output_stream_group.remote(gateway_id)
        if not group:
            return self.handle.stream_outputs_async.remote(gateway_id)
        stream = self.handle.stream_outputs.options(concurrency_group=group)
        return stream.remote(gateway_id, group)

    # ----- moving sessions ----------------------------------------------------------------

    async def mark_moving(self, *, session_ids: list[str]) -> Exported | ActorError:
        return await self.handle.mark_moving.remote(session_ids)

    async def wait_turns_ended(
        self, *, session_ids: list[str], wait_s: float
    ) -> list[str] | ActorError:
        return await self.handle.wait_turns_ended.remote(session_ids, wait_s)

    def export_sessions(
        self, *, session_ids: list[str]
    ) -> tuple[ObjectRef[Exported | ActorError], ObjectRef[SessionStates | None]]:
        """The references of what was exported and of the ``SessionStates`` record (it stays
        in the replica's object store for the target's ``import_sessions`` to fetch)."""
        return self.handle.export_sessions.options(num_returns=2).remote(session_ids)

    async def finish_export(
        self, *, session_ids: list[str], moved: bool
    ) -> PoolSnapshot | ActorError:
        return await self.handle.finish_export.remote(session_ids, moved)

    async def import_sessions(
        self, *, parts: list, hold_s: float = 0.0, router: str | None = None
    ) -> Imported | ActorError:
        """``parts``: ``SessionStates`` records or references to them; each session is held
        (as by a stream lease) at least ``hold_s`` seconds. ``router``: the incarnation of the
        router sending the move; refused when the replica reports to another one now."""
        return await self.handle.import_sessions.remote(parts, hold_s, router)

    # ----- checkpoints --------------------------------------------------------------------

    async def checkpoint_socket(self, *, store: Any, confirm_on_ack: bool) -> OutputAddress | None:
        """Where the store ``store`` (its handle) reads the replica's checkpoints from a socket
        of its own, for one connection (None: the replica has no socket host)."""
        return await self.handle.checkpoint_socket.remote(store, confirm_on_ack)

    async def checkpoint_items(
        self, *, store: Any, confirm_on_ack: bool
    ) -> tuple[AsyncIterator[list[CheckpointEntry]], bool]:
        """The checkpoint items the store ``store`` follows, and whether they come over the
        replica's checkpoint socket (each read into the caller's memory) rather than the Ray
        stream (each an object the caller owns, in the replica's node's object store): the
        socket when the replica has one and it connects."""
        address = await self.checkpoint_socket(store=store, confirm_on_ack=confirm_on_ack)
        if address is not None:
            try:
                return (await CheckpointSocketReader.connect(address)).items(), True
            except SocketNotTaken as exc:
                log.warning("no checkpoint socket (%s): reading the Ray stream", exc)
        return _entries(self.checkpoint_stream(store=store, confirm_on_ack=confirm_on_ack)), False

    def checkpoint_stream(self, *, store: Any, confirm_on_ack: bool) -> AsyncIterator[ObjectRef]:
        """The long-lived stream the checkpoint store ``store`` (its handle) pulls from, with a
        backpressure of one item: the replica learns that the store has an item when its next
        one can go (``CheckpointOutbox.stream``)."""
        call = self.handle.checkpoint_stream.options(_generator_backpressure_num_objects=1)
        return refs(call.remote(store, confirm_on_ack))

    async def checkpoints_acked(self, *, seq: int, held: int, held_bytes: int) -> None:
        await self.handle.checkpoints_acked.remote(seq, held, held_bytes)


async def _entries(stream: AsyncIterator[ObjectRef]) -> AsyncIterator[list[CheckpointEntry]]:
    async for ref in stream:
        yield await ref
