"""``ResponseStore``: the cluster's stored responses (``ResponseRecords``) in one named actor,
so that a response made through one gateway is continued, read or deleted through any other,
and outlives the gateway that made it. ``ResponseStoreClient`` is how gateways call it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from router.control.response_records import (
    Release,
    ResponseRecords,
    StoredCounts,
    StoredResponse,
)

RESPONSES_NAME = "session-router-responses"


class ResponseStore:
    """The Ray actor; every method is one step of ``ResponseRecords``."""

    def __init__(self, max_states_per_replica: int, ttl_s: float) -> None:
        self.records = ResponseRecords(max_states_per_replica, ttl_s)

    def put(self, record: StoredResponse) -> Release:
        return self.records.put(record)

    def get(self, response_id: str, tenant: str) -> StoredResponse | None:
        return self.records.get(response_id, tenant)

    def delete(self, response_id: str, tenant: str) -> tuple[bool, Release]:
        return self.records.delete(response_id, tenant)

    def forget_state(self, response_id: str) -> None:
        self.records.forget_state(response_id)

    def sweep(self) -> Release:
        return self.records.sweep()

    def ids(self, tenant: str) -> list[str]:
        return self.records.ids(tenant)

    def stats(self) -> StoredCounts:
        return self.records.stats()


class ResponseStoreClient:
    """Typed calls to the ``ResponseStore`` actor ``handle``: one method per remote method,
    keyword arguments, the store's own result types."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def put(self, *, record: StoredResponse) -> Release:
        return await self.handle.put.remote(record=record)

    async def get(self, *, response_id: str, tenant: str) -> StoredResponse | None:
        return await self.handle.get.remote(response_id=response_id, tenant=tenant)

    async def delete(self, *, response_id: str, tenant: str) -> tuple[bool, Release]:
        return await self.handle.delete.remote(response_id=response_id, tenant=tenant)

    async def forget_state(self, *, response_id: str) -> None:
        await self.handle.forget_state.remote(response_id=response_id)

    async def sweep(self) -> Release:
        return await self.handle.sweep.remote()

    async def ids(self, *, tenant: str) -> list[str]:
        return await self.handle.ids.remote(tenant=tenant)

    async def stats(self) -> StoredCounts:
        return await self.handle.stats.remote()


async def find_store(namespace: str, wait_s: float) -> Any:
    """The store actor of ``namespace``; None if none appears within ``wait_s`` (a cluster
    whose serve predates the front door: the Responses API then answers 503)."""
    import ray

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return await asyncio.to_thread(ray.get_actor, RESPONSES_NAME, namespace)
        except ValueError:
            if time.monotonic() >= deadline:
                return None
        await asyncio.sleep(0.5)
