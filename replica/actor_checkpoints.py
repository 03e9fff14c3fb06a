"""``CheckpointsAPI``: the replica actor's side of session checkpoints (mixed into
``ReplicaActor``); see ``replica.checkpoints``.

- ``checkpoint_stream(store)``: the long-lived streaming call through which this replica's
  ``CheckpointStore`` (``store``, remembered for re-registration with a restarted router) pulls
  its checkpoints; the store owns every item.
- ``checkpoints_acked(seq, held, held_bytes)``: the store holds every item up to ``seq``.
"""

from __future__ import annotations

from typing import Any

from replica.checkpoints.outbox import CheckpointOutbox


class CheckpointsAPI:
    checkpoint_outbox: CheckpointOutbox | None
    checkpoint_store: Any

    async def _ensure_started(self) -> None:  # provided by ReplicaActor
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
