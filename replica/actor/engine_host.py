"""``EngineHost``: the replica's engine as the actor's event loop sees it.

It owns the ``AsyncEngine`` (the engine on its own thread), started on first use because it
needs the running event loop; the callbacks it is built with receive what the engine produces
(``AsyncEngine``'s ``on_events``, ``on_released``, ``on_failed``, ``on_checkpoints``,
``on_rows``), and
``on_started`` is called once, on the event loop, right after the start. ``call`` runs a command
on the engine thread between steps; a refusal (``ReplicaError``) comes back as an ``ActorError``
value, never raised. Used on the actor's event loop only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from replica.api import ActorError, PoolSnapshot, ReplicaError

if TYPE_CHECKING:
    from replica.checkpoints.log import CheckpointBatch
    from replica.engine.async_engine import AsyncEngine
    from replica.engine.engine import Engine
    from replica.engine.step_outputs import StepOutputs


class EngineHost:
    def __init__(
        self,
        engine: Engine,
        on_events: Callable[[list[StepOutputs]], None],
        on_released: Callable[[list[str]], None],
        on_failed: Callable[[BaseException], None],
        on_checkpoints: Callable[[CheckpointBatch], None] | None,
        on_started: Callable[[], None],
        on_rows: Callable[[list[StepOutputs]], bool] | None = None,
    ) -> None:
        """``on_checkpoints`` None: checkpoints are off; ``on_rows``: ``AsyncEngine``'s."""
        self.engine = engine
        self._on_events = on_events
        self._on_released = on_released
        self._on_failed = on_failed
        self._on_checkpoints = on_checkpoints
        self._on_started = on_started
        self._on_rows = on_rows
        self._async: AsyncEngine | None = None

    @property
    def started(self) -> bool:
        return self._async is not None

    async def start(self) -> AsyncEngine:
        """The running ``AsyncEngine`` (started now if it was not)."""
        if self._async is None:
            from replica.engine.async_engine import AsyncEngine

            self._async = AsyncEngine(
                self.engine,
                self._on_events,
                self._on_released,
                on_failed=self._on_failed,
                on_checkpoints=self._on_checkpoints,
                on_rows=self._on_rows,
            )
            self._on_started()
        return self._async

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the engine thread: its result, or the ``ActorError`` it was refused
        with (an ``EngineFailedError`` too, once the engine has died)."""
        running = await self.start()
        try:
            return await running.call(fn, *args)
        except ReplicaError as exc:
            return exc.to_actor_error()

    async def release(self, fn: Callable[..., list[str]], *args: Any) -> list[str] | ActorError:
        """``call`` of a command that releases sessions on the replica's own account (their
        ids): they are reported as the engine's idle releases are (``on_released``)."""
        released = await self.call(fn, *args)
        if isinstance(released, list) and released:
            self._on_released(released)
        return released

    async def latest_snapshot(self) -> PoolSnapshot:
        """The snapshot the engine thread published last (no wait for a step)."""
        return (await self.start()).latest_snapshot

    async def healthy(self) -> bool:
        """Whether the engine loop runs (False for good once it has died)."""
        return (await self.start()).error is None

    def published_snapshot(self) -> PoolSnapshot:
        """``latest_snapshot`` once started (the reporter reads it only then)."""
        if self._async is None:
            raise RuntimeError("the engine has not started")
        return self._async.latest_snapshot

    def stop(self) -> None:
        if self._async is not None:
            self._async.stop()
