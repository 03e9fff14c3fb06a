"""``RouterClient``: the typed calls of gateways and the serve process to the ``SessionRouter``.

One method per remote method of the router (keyword arguments, the router's own result types).
Ray restarts the router when it dies (``max_restarts=-1``); while it is away, a call made with
``retry`` (the default: every call here is idempotent, an open carries its session id) is made
again for up to ``retry_s``, then answered UNAVAILABLE as an ``ActorError``, like a refusal;
without ``retry`` the first such failure is answered so at once. What the replicas themselves
tell the router (snapshots, registration, their death) goes through
``replica.actor.router_reports.RouterReports`` instead: a replica may not import the router.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ray.exceptions import ActorUnavailableError, RayActorError

from replica.api import ActorError, PoolSnapshot, ReplicaDescription, StatusCode
from router.control.api import Drained, FailoverOutcome, ReplicaView, Route

T = TypeVar("T")

ROUTER_RETRY_S = 15.0


class RouterClient:
    def __init__(self, handle: Any, retry_s: float = ROUTER_RETRY_S) -> None:
        self.handle = handle
        self.retry_s = retry_s

    async def _call(self, make: Callable[[], Awaitable[T]], retry: bool) -> T | ActorError:
        """``await make()``; made again while the router restarts when ``retry``."""
        deadline = time.monotonic() + (self.retry_s if retry else 0.0)
        while True:
            try:
                return await make()
            except (ActorUnavailableError, RayActorError) as exc:
                if time.monotonic() >= deadline:
                    return ActorError(
                        StatusCode.UNAVAILABLE,
                        "the session router is restarting or down "
                        f"({type(exc).__name__}); retry shortly",
                    )
                await asyncio.sleep(0.2)

    # ----- sessions -----------------------------------------------------------------------

    async def open_session(
        self,
        *,
        idle_timeout_s: float,
        tenant: str,
        gateway_id: str,
        session_id: str,
        wait_s: float | None,
        lease_s: float,
        prefix: str | list[int] | None = None,
        retry: bool = True,
    ) -> Route | ActorError:
        open_ = self.handle.open_session
        return await self._call(
            lambda: open_.remote(
                idle_timeout_s, tenant, gateway_id, session_id, wait_s, lease_s, prefix
            ),
            retry,
        )

    async def fork_session(
        self,
        *,
        parent_id: str,
        child_id: str,
        tenant: str,
        gateway_id: str,
        wait_s: float | None,
        retry: bool = True,
    ) -> Route | ActorError:
        fork = self.handle.fork_session
        return await self._call(
            lambda: fork.remote(parent_id, child_id, tenant, gateway_id, wait_s), retry
        )

    async def abandon_open(self, *, session_id: str, retry: bool = True) -> None | ActorError:
        return await self._call(lambda: self.handle.abandon_open.remote(session_id), retry)

    async def route(
        self, *, session_id: str, tenant: str | None, retry: bool = True
    ) -> Route | ActorError:
        """``tenant`` None: an admin's route, to any tenant's session."""
        return await self._call(lambda: self.handle.route.remote(session_id, tenant), retry)

    async def forget(
        self,
        *,
        session_ids: list[str],
        snapshot: PoolSnapshot | None = None,
        replica_id: str | None = None,
        retry: bool = True,
    ) -> None | ActorError:
        return await self._call(
            lambda: self.handle.forget.remote(session_ids, snapshot, replica_id), retry
        )

    async def update_sessions(
        self,
        *,
        pins: list[tuple[str, str, str, float | None]],
        forgets: list[tuple[str, str]],
        snapshots: list[PoolSnapshot],
        retry: bool = True,
    ) -> list[bool] | ActorError:
        return await self._call(
            lambda: self.handle.update_sessions.remote(pins, forgets, snapshots), retry
        )

    async def session_count(self, *, retry: bool = True) -> int | ActorError:
        return await self._call(lambda: self.handle.session_count.remote(), retry)

    async def pinned_sessions(
        self, *, replica_id: str, retry: bool = True
    ) -> list[str] | ActorError:
        return await self._call(lambda: self.handle.pinned_sessions.remote(replica_id), retry)

    # ----- replicas -----------------------------------------------------------------------

    async def views(self, *, retry: bool = True) -> list[ReplicaView] | ActorError:
        return await self._call(lambda: self.handle.views.remote(), retry)

    async def replica_handles(self, *, retry: bool = True) -> dict[str, Any] | ActorError:
        return await self._call(lambda: self.handle.replica_handles.remote(), retry)

    async def checkpoint_stores(self, *, retry: bool = True) -> dict[str, Any] | ActorError:
        return await self._call(lambda: self.handle.checkpoint_stores.remote(), retry)

    async def replica_failed(
        self, *, replica_id: str, why: str, wait: bool = True, retry: bool = True
    ) -> FailoverOutcome | ActorError:
        return await self._call(
            lambda: self.handle.replica_failed.remote(replica_id, why, wait), retry
        )

    async def recover_replica(
        self,
        *,
        replica_id: str,
        desc: ReplicaDescription,
        checkpoints: Any,
        why: str,
        retry: bool = True,
    ) -> int | ActorError:
        return await self._call(
            lambda: self.handle.recover_replica.remote(replica_id, desc, checkpoints, why), retry
        )

    async def replicas_accounted(self, *, retry: bool = True) -> None | ActorError:
        return await self._call(lambda: self.handle.replicas_accounted.remote(), retry)

    async def replace_checkpoint_store(
        self, *, replica_id: str, store: Any, retry: bool = True
    ) -> bool | ActorError:
        return await self._call(
            lambda: self.handle.replace_checkpoint_store.remote(replica_id, store), retry
        )

    async def retire_replica(self, *, replica_id: str, retry: bool = True) -> bool | ActorError:
        return await self._call(lambda: self.handle.retire_replica.remote(replica_id), retry)

    # ----- administration -----------------------------------------------------------------

    async def drain(
        self,
        *,
        replica_id: str,
        migrate: bool = False,
        timeout_s: float | None = None,
        retry: bool = True,
    ) -> Drained | ActorError:
        return await self._call(
            lambda: self.handle.drain.remote(replica_id, migrate, timeout_s), retry
        )

    async def resume(self, *, replica_id: str, retry: bool = True) -> ReplicaView | ActorError:
        return await self._call(lambda: self.handle.resume.remote(replica_id), retry)

    async def migrate_session(
        self,
        *,
        session_id: str,
        target_replica_id: str = "",
        wait_s: float | None = None,
        retry: bool = True,
    ) -> Route | ActorError:
        return await self._call(
            lambda: self.handle.migrate_session.remote(session_id, target_replica_id, wait_s),
            retry,
        )
