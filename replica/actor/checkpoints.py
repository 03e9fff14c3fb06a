"""``CheckpointCalls``: the replica actor's side of session checkpoints (``replica.checkpoints``).

With ``--session-checkpoints`` it owns the replica's ``CheckpointOutbox``, built with the
dispatch the engine's events go on to (turn endings wait there for their checkpoints), and
connects it to the engine's checkpoint accounting.

- ``open_socket(store, confirm_on_ack)``: where this replica's ``CheckpointStore`` (``store``,
  remembered for re-registration with a restarted router) reads its checkpoints from a socket
  (``CheckpointSocket``; None: no socket host, it reads ``stream``).
- ``stream(store, confirm_on_ack)``: the long-lived stream of those checkpoints, over that
  socket or as Ray's streaming call; the store has an item when the next can go. A new store's
  stream replaces the one before, and every session the replica holds is checkpointed again
  at once (``recheckpointed_total``).
- ``acked(seq, held, held_bytes)``: the store's counts after every entry up to ``seq``.

The store's watch (``start``), on the actor's event loop: every ``WATCH_INTERVAL_S`` it releases
turn endings held past their bound, and ends the stream of a store that died (a probe fails with
Ray's actor-died error: every ``LIVE_PROBE_S`` while the store keeps up, every watch once an
item waits longer than ``LATE_S``) or acknowledged nothing for ``stall_s`` (a hung store's
stream once it answers again); the controller's ``StoreKeeper`` replaces a dead store with a new
one, or has a live one whose stream ended follow again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import ray

from replica.actor.checkpoint_socket import CheckpointSocket
from replica.actor.engine_host import EngineHost
from replica.actor.tasks import BackgroundTasks
from replica.api import OutputAddress
from replica.checkpoints.entries import CheckpointEntry
from replica.checkpoints.log import CheckpointBatch
from replica.checkpoints.outbox import CheckpointOutbox
from replica.checkpoints.store_client import CheckpointStoreClient
from replica.failpoints import CallFaults

if TYPE_CHECKING:
    from replica.engine.engine import Engine
    from replica.engine.step_outputs import StepOutputs

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.25
PROBE_TIMEOUT_S = 2.0  # a store that answers no probe in this long is slow, not known dead
# a store whose items are taken and acknowledged on time is probed this seldom (each probe is an
# actor call on both sides); one that lets an item wait longer than ``LATE_S``, at every watch
LIVE_PROBE_S = 2.0
LATE_S = 1.0


class CheckpointCalls:
    def __init__(
        self,
        engine: Engine,
        host: EngineHost,
        tasks: BackgroundTasks,
        dispatch: Callable[[list[StepOutputs]], None],
        enabled: bool,
        faults: CallFaults,
        socket_host: str | None = None,
    ) -> None:
        """``dispatch``: where the engine's events go on to; ``enabled``: checkpoints are on
        (else every call here is a no-op, and events go straight on); ``faults``: the replica's
        (``checkpoint_ack_fails``); ``socket_host``: where a store's socket listens (None: the
        store reads the Ray stream)."""
        self.engine = engine
        self.host = host
        self.tasks = tasks
        self._send = dispatch
        self.call_faults = faults
        self.store: Any = None  # the handle of the store that follows (or followed) last
        self.outbox: CheckpointOutbox | None = None
        self.socket: CheckpointSocket | None = None
        if enabled and socket_host:
            self.socket = CheckpointSocket(socket_host, tasks)
        if enabled:
            self.outbox = CheckpointOutbox(
                dispatch, engine.config.pools.max_open_sessions, self._connected
            )
            engine.checkpoint_accounting.connect(self.outbox)

    def dispatch(self, events: list[StepOutputs]) -> None:
        """The engine's outputs, those of sessions whose checkpoint is on its way held back."""
        (self.outbox.dispatch if self.outbox is not None else self._send)(events)

    def send_rows(self, outputs: list[StepOutputs]) -> bool:
        """On the engine thread: a step's token rows (no event), sent straight on when nothing
        is held or waits for a checkpoint (True); else False, and they go by the event loop."""
        if self.outbox is not None and not self.outbox.outputs.idle:
            return False
        self._send(outputs)
        return True

    def push(self, batch: CheckpointBatch) -> None:
        """What one engine step left to checkpoint (before that step's events)."""
        if self.outbox is not None:
            self.outbox.push(batch)

    def start(self) -> None:
        """Start the store's watch (the engine has just started)."""
        if self.outbox is not None:
            self.tasks.spawn(self._watch_store())

    def close(self) -> None:
        """The engine died: end the store's stream (it keeps what it has)."""
        if self.socket is not None:
            self.socket.close()
        if self.outbox is not None:
            self.outbox.close()

    async def durable(self, session_ids: list[str]) -> None:
        """Wait (up to the outbox's bound) until the sessions' first checkpoints are stored."""
        if self.outbox is not None:
            await self.outbox.durable(session_ids)

    def open_socket(self, store: Any, confirm_on_ack: bool) -> OutputAddress | None:
        if self.socket is None or self.outbox is None:
            return None
        return self.socket.open(lambda: self.stream(store, confirm_on_ack))

    async def stream(
        self, store: Any, confirm_on_ack: bool
    ) -> AsyncIterator[list[CheckpointEntry]]:
        await self.host.start()
        if self.outbox is None:
            return
        self.store = store
        # closed with this stream, not when collected: its end tells the outbox the store left
        async with contextlib.aclosing(self.outbox.stream(confirm_on_ack)) as items:
            async for item in items:
                yield item

    def acked(self, seq: int, held: int, held_bytes: int) -> None:
        self.call_faults.raise_if("checkpoint_ack_fails", "checkpoints_acked")
        if self.outbox is not None:
            self.outbox.acked(seq, held, held_bytes)

    def _connected(self, connected: bool) -> None:
        """A store follows (or stopped following): the engine exports while one does."""
        self.engine.checkpoints.enabled = connected
        if connected:
            self.tasks.spawn(self._checkpoint_all())

    async def _checkpoint_all(self) -> None:
        count = await self.host.call(self.engine.session_ops.checkpoint_all)
        if isinstance(count, int) and count:
            self.outbox.counts.recheckpointed_total += count
            log.warning("a new checkpoint store follows: %d sessions checkpointed again", count)

    async def _watch_store(self) -> None:
        outbox = self.outbox
        probe: asyncio.Task | None = None  # one probe at a time, beside the bounds' checks
        probed_at = 0.0
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            outbox.outputs.holds.release_overdue()
            if not (outbox.connected or outbox.abandoned):
                continue
            late = outbox.unacked_s()
            outbox.acks_late = late > outbox.outputs.holds.hold_s
            if late > outbox.stall_s:
                outbox.disconnect(f"it acknowledged nothing for {late:.0f} s", end_stream=False)
            elif (probe is None or probe.done()) and (
                late > LATE_S or time.monotonic() - probed_at > LIVE_PROBE_S
            ):
                probed_at = time.monotonic()
                probe = asyncio.get_running_loop().create_task(self._probe_store())

    async def _probe_store(self) -> None:
        """Disconnect the store when it is known dead (Ray's actor-died error); end the stream
        of a hung store once it answers again."""
        store, outbox = self.store, self.outbox
        if store is None:
            return
        try:
            await asyncio.wait_for(CheckpointStoreClient(store).stats(), PROBE_TIMEOUT_S)
        except ray.exceptions.ActorDiedError:
            if store is self.store:  # not replaced meanwhile
                outbox.disconnect("it died")
                outbox.end_abandoned()
            return
        except Exception:  # noqa: BLE001 - slow or unreachable for now: the stall bound decides
            return
        if store is self.store:
            outbox.end_abandoned()
