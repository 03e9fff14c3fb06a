"""``CheckpointStoreClient``: the typed calls to one replica's ``CheckpointStore`` actor.

One method per remote method of the store, with keyword arguments and its own result types; a
call that fails in Ray raises Ray's error from the awaited method, for the caller to read. The
client holds nothing but the handle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ray import ObjectRef

from replica.api import SessionMeta


@dataclass(frozen=True, slots=True)
class CheckpointStoreClient:
    handle: Any  # the CheckpointStore's handle

    async def follow(self, *, replica: Any, replica_node: str) -> None:
        """Start pulling the checkpoints of ``replica`` (its handle), on node ``replica_node``."""
        await self.handle.follow.remote(replica, replica_node)

    async def fence(self) -> None:
        """The replica was declared dead: the store keeps what it holds for the failover."""
        await self.handle.fence.remote()

    async def checkpoints(
        self, *, session_ids: list[str], wait_s: float
    ) -> dict[str, tuple[SessionMeta, list[ObjectRef]]]:
        """The latest checkpoint of each of ``session_ids`` the store holds: its meta and its
        reference, in a list so that Ray hands the reference over as it is."""
        return await self.handle.checkpoints.remote(session_ids, wait_s)

    async def following(self) -> bool:
        """Whether its stream from the replica is open."""
        return await self.handle.following.remote()

    async def stats(self) -> tuple[int, int]:
        """Checkpoints held, and their bytes."""
        return await self.handle.stats.remote()

    async def sessions(self) -> dict[str, tuple[str, float | None]]:
        """The sessions it holds a checkpoint of, or knows to hold nothing yet: session id ->
        tenant, and a blank one's idle timeout (None: it has a checkpoint)."""
        return await self.handle.sessions.remote()

    async def released_of(self, *, session_ids: list[str]) -> list[str]:
        """Those of ``session_ids`` the replica released before it was declared dead."""
        return await self.handle.released_of.remote(session_ids)

    async def handed_over(self, *, session_ids: list[str]) -> None:
        """A failover restored ``session_ids`` elsewhere: the store drops their checkpoints."""
        await self.handle.handed_over.remote(session_ids)
