"""``ReplicaActor``: the Ray actor that owns one replica's engine, pools and sessions.

Token delivery: each gateway keeps one long-lived streaming call, ``stream_outputs(gateway_id)``,
per replica. Every item is everything one engine step produced for that gateway's sessions
(tokens, finishes, errors), so a turn costs one actor call to submit and no Ray round trip per
token. A turn's events go to the gateway that submitted it (``TurnEvent.gateway_id``, taken from
the session's record when the engine emits the event).

Refusals come back as ``ActorError`` values (a gRPC status name and a message), never as raised
exceptions, so callers map them without unwrapping Ray errors. The actor pushes its
``PoolSnapshot`` (and the sessions it released on its own, e.g. idle timeouts) to the router
about every second; when the router does not know it (a restarted router), it registers again
with the sessions it holds and their tenants, so the router can rebuild its table.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import defaultdict
from typing import Any

from replica.api import (
    ActorError,
    Closed,
    Opened,
    PoolSnapshot,
    ReleaseReason,
    ReplicaDescription,
    ReplicaError,
    SamplingParams,
    SessionInfo,
    StatusCode,
    TurnEvent,
)
from replica.config import ReplicaConfig

log = logging.getLogger(__name__)


class ReplicaActor:
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
        self._outputs: dict[str, asyncio.Queue] = defaultdict(asyncio.Queue)
        self._released: list[str] = []  # released on the replica's own account, to report
        self._async = None
        self._reporter: asyncio.Task | None = None

    async def _ensure_started(self) -> None:
        if self._async is None:
            from replica.engine.async_engine import AsyncEngine

            self._async = AsyncEngine(self.engine, self._dispatch, self._note_released)
            if self.router is not None:
                self._reporter = asyncio.get_running_loop().create_task(self._report_loop())

    def _note_released(self, session_ids: list[str]) -> None:
        self._released.extend(session_ids)

    def _dispatch(self, events: list[TurnEvent]) -> None:
        by_gateway: dict[str, list[TurnEvent]] = defaultdict(list)
        for event in events:
            if event.gateway_id:
                by_gateway[event.gateway_id].append(event)
        for gateway, batch in by_gateway.items():
            self._outputs[gateway].put_nowait(batch)

    async def _call(self, fn, *args) -> Any:
        await self._ensure_started()
        if self._async.error is not None:
            return ActorError(
                StatusCode.UNAVAILABLE,
                f"replica {self.replica_id} engine failed: {self._async.error}",
            )
        try:
            return await self._async.call(fn, *args)
        except ReplicaError as exc:
            return exc.to_actor_error()

    # ----- the router's and gateways' API ---------------------------------------------------

    async def describe(self) -> ReplicaDescription:
        import ray

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

    async def open_session(
        self,
        session_id: str,
        idle_timeout_s: float = 0.0,
        gateway_id: str = "",
        tenant: str = "",
    ) -> Opened | ActorError:
        """Open a session; the reply carries the snapshot taken right after, so the router's
        view of this replica's room is never older than its own placements."""

        def open_one() -> Opened:
            info = self.engine.open_session(session_id, idle_timeout_s, tenant, gateway_id)
            return Opened(info, self.engine.snapshot())

        return await self._call(open_one)

    async def close_sessions(
        self, session_ids: list[str], reason: ReleaseReason = ReleaseReason.CLOSED
    ) -> Closed | ActorError:
        """Release sessions (idempotent); the reply carries the snapshot taken right after."""

        def close_all() -> Closed:
            was_open = tuple(self.engine.close_session(sid, reason) for sid in session_ids)
            return Closed(was_open, self.engine.snapshot())

        return await self._call(close_all)

    async def submit_turn(
        self,
        gateway_id: str,
        session_id: str,
        text: str | None,
        token_ids: list[int] | None,
        sampling: SamplingParams,
    ) -> int | ActorError:
        """Queue a turn; returns its turn id. Its events go to ``gateway_id``'s stream."""
        if text is not None and token_ids is not None:
            return ActorError(StatusCode.INVALID_ARGUMENT, "give either text or tokens, not both")
        ids = self.tokenizer.encode(text) if text is not None else list(token_ids or [])
        return await self._call(
            lambda: self.engine.submit(session_id, ids, sampling, gateway_id).rid
        )

    async def interrupt(self, session_id: str) -> bool | ActorError:
        return await self._call(self.engine.interrupt, session_id)

    async def cancel(
        self, session_id: str, why: str = "cancelled by the client", turn_id: int | None = None
    ) -> bool | ActorError:
        return await self._call(self.engine.cancel, session_id, why, turn_id)

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

    async def stream_outputs(self, gateway_id: str):
        """Long-lived stream: one item per engine step with events for ``gateway_id``."""
        await self._ensure_started()
        queue = self._outputs[gateway_id]
        while True:
            batch = await queue.get()
            while not queue.empty():  # coalesce steps the gateway has not taken yet
                batch.extend(queue.get_nowait())
            yield batch

    async def shutdown(self) -> None:
        if self._async is not None:
            await self._call(self.engine.close_all, ReleaseReason.ABORTED)
            self._async.stop()

    # ----- reporting to the router ------------------------------------------------------------

    async def _report_loop(self) -> None:
        import ray

        while True:
            if "drop_snapshots" in self.config.failpoints:
                await asyncio.sleep(self.report_interval_s)
                continue
            try:
                released, self._released = self._released, []
                try:
                    known = await self.router.report.remote(self._async.latest_snapshot, released)
                except Exception:
                    self._released = released + self._released  # tell the router next time
                    raise
                if not known:
                    await self.router.register_replica.remote(
                        self.replica_id,
                        ray.get_runtime_context().current_actor,
                        await self.describe(),
                        await self._call(self.engine.session_tenants),
                        self._async.latest_snapshot,
                    )
            except Exception as exc:  # noqa: BLE001 - the router may be restarting
                log.warning("snapshot report to the router failed: %s", exc)
            await asyncio.sleep(self.report_interval_s)
