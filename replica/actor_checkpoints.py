"""``CheckpointsAPI``: the replica actor's side of session checkpoints (mixed into
``ReplicaActor``); see ``replica.checkpoints``.

- ``checkpoint_stream(store)``: the long-lived streaming call through which this replica's
  ``CheckpointStore`` (``store``, remembered for re-registration with a restarted router) pulls
  its checkpoints; the store owns every item. A new store's call replaces the one before, and
  every session the replica holds is checkpointed again at once (``recheckpointed_total``).
- ``checkpoints_acked(seq, held, held_bytes)``: the store holds every item up to ``seq``.

The store's watch, on the actor's event loop: every ``WATCH_INTERVAL_S`` it releases turn
endings held past their bound, and ends the stream of a store that died (a probe fails with
Ray's actor-died error) or acknowledged nothing for ``stall_s`` (a hung store's stream once it
answers again); the serve process's ``StoreKeeper`` replaces a dead store with a new one, or has
a live one whose stream ended follow again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray

from replica.checkpoints.outbox import CheckpointOutbox
from replica.checkpoints.store_client import CheckpointStoreClient

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.25
PROBE_TIMEOUT_S = 2.0  # a store that answers no probe in this long is slow, not known dead


class CheckpointsAPI:
    checkpoint_outbox: CheckpointOutbox | None
    checkpoint_store: Any
    engine: Any

    async def _ensure_started(self) -> None:  # provided by ReplicaActor
        raise NotImplementedError

    async def _call(self, fn, *args) -> Any:  # provided by ReplicaActor
        raise NotImplementedError

    def _spawn(self, coro) -> None:  # provided by ReplicaActor
        raise NotImplementedError

    async def checkpoint_stream(self, store: Any):
        await self._ensure_started()
        if self.checkpoint_outbox is None:
            return
        self.checkpoint_store = store
        async for item in self.checkpoint_outbox.stream():
            yield item

    async def checkpoints_acked(self, seq: int, held: int, held_bytes: int) -> None:
        if self.checkpoint_outbox is not None:
            self.checkpoint_outbox.acked(seq, held, held_bytes)

    def _checkpoints_connected(self, connected: bool) -> None:
        """A store follows (or stopped following): the engine exports while one does."""
        self.engine.checkpoints.enabled = connected
        if connected:
            self._spawn(self._checkpoint_all())

    async def _checkpoint_all(self) -> None:
        count = await self._call(self.engine.checkpoint_all)
        if isinstance(count, int) and count:
            self.checkpoint_outbox.recheckpointed_total += count
            log.warning("a new checkpoint store follows: %d sessions checkpointed again", count)

    async def _watch_checkpoint_store(self) -> None:
        outbox = self.checkpoint_outbox
        probe: asyncio.Task | None = None  # one probe at a time, beside the bounds' checks
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            outbox.holds.release_overdue()
            if not (outbox.connected or outbox.abandoned):
                continue
            late = outbox.unacked_s()
            outbox.acks_late = late > outbox.holds.hold_s
            if late > outbox.stall_s:
                outbox.disconnect(f"it acknowledged nothing for {late:.0f} s", end_stream=False)
            elif probe is None or probe.done():
                probe = asyncio.get_running_loop().create_task(self._probe_store())

    async def _probe_store(self) -> None:
        """Disconnect the store when it is known dead (Ray's actor-died error); end the stream
        of a hung store once it answers again."""
        store, outbox = self.checkpoint_store, self.checkpoint_outbox
        if store is None:
            return
        try:
            await asyncio.wait_for(CheckpointStoreClient(store).stats(), PROBE_TIMEOUT_S)
        except ray.exceptions.ActorDiedError:
            if store is self.checkpoint_store:  # not replaced meanwhile
                outbox.disconnect("it died")
                outbox.end_abandoned()
            return
        except Exception:  # noqa: BLE001 - slow or unreachable for now: the stall bound decides
            return
        if store is self.checkpoint_store:
            outbox.end_abandoned()
