"""``AsyncEngine``: the engine on its own thread, driven from asyncio.

The engine is single-threaded by contract, so this wrapper gives it one thread that owns it.
Callers on the event loop send commands (``call``) that the engine thread runs between steps, and
receive the steps' ``StepOutputs`` through the ``on_events`` callback, called on the event loop
(preceded by ``on_checkpoints`` with what a step left to checkpoint, when checkpoints are on):
the steps that end while the loop is busy are handed over together, in one wake-up of the loop
(one per step would cost a wake-up and a callback per step, and contend for the GIL with the
engine thread). A step with token rows only (no event, nothing to checkpoint) skips the loop when
nothing handed over before is still on its way there: ``on_rows(outputs)``, called on the engine
thread, takes it straight on when it can (True) or leaves it to the loop (False), so the outputs
keep the engine's order. The engine thread never blocks on the event loop, and the event loop
never waits for a step.
Between steps the thread also releases (and, with ``park_after_idle_s``, parks) idle sessions about
every second, and publishes a fresh ``PoolSnapshot`` (``latest_snapshot``) about every
``snapshot_interval_s``, so readers never touch the pools.

If the engine loop dies (an error no turn owns), ``error`` is set, every command queued or sent
later fails with ``EngineFailedError``, and ``on_failed(error)`` is called once on the event loop:
the engine is dead for good, and the replica with it.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from replica.api import PoolSnapshot, ReplicaError, StatusCode
from replica.checkpoints.log import CheckpointBatch
from replica.engine.engine import Engine
from replica.engine.step_outputs import StepOutputs

log = logging.getLogger(__name__)

IDLE_TICK_S = 0.05


class EngineFailedError(ReplicaError):
    """The engine loop died: the replica's sessions and their state are gone."""

    code = StatusCode.ABORTED


class AsyncEngine:
    def __init__(
        self,
        engine: Engine,
        on_events: Callable[[list[StepOutputs]], None],
        on_released: Callable[[list[str]], None] | None = None,
        snapshot_interval_s: float = 0.25,
        on_failed: Callable[[BaseException], None] | None = None,
        on_checkpoints: Callable[[CheckpointBatch], None] | None = None,
        on_rows: Callable[[list[StepOutputs]], bool] | None = None,
    ) -> None:
        self.engine = engine
        self._on_rows = on_rows
        self._on_events = on_events
        self._on_checkpoints = on_checkpoints
        self._on_released = on_released
        self._on_failed = on_failed
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._loop = asyncio.get_running_loop()
        self._stop = threading.Event()
        self._snapshot_interval_s = snapshot_interval_s
        self.latest_snapshot: PoolSnapshot = engine.snapshot()
        self.error: BaseException | None = None
        self._handoff: list[StepOutputs] = []  # outputs the event loop has not taken yet
        self._handoff_checkpoints: list[CheckpointBatch] = []  # and checkpoints
        self._handoff_due = False  # a wake-up of the event loop is on its way
        self._delivering = False  # the event loop is handing over what it took
        self._handoff_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the engine thread between steps; returns or raises its result
        (``EngineFailedError`` once the engine loop has died)."""
        if self.error is not None:
            raise self._failure()
        future = self._loop.create_future()
        self._commands.put((fn, args, future))
        return await future

    def _run(self) -> None:
        next_snapshot = next_idle_check = 0.0
        try:
            while not self._stop.is_set():
                self._apply_commands(block=not self.engine.has_work)
                if self.engine.has_work:
                    # what the commands produced (an interrupted turn's end, a refusal) goes out
                    # now, not one step later with the step's own events
                    self._hand_over_taken(self.engine.take_events())
                    events = self.engine.step()
                else:
                    events = self.engine.take_events()
                self._hand_over_taken(events)
                now = time.monotonic()
                if now >= next_idle_check:
                    next_idle_check = now + 1.0
                    released = self.engine.release_idle()
                    self.engine.session_ops.park_idle()
                    if released and self._on_released:
                        self._loop.call_soon_threadsafe(self._on_released, released)
                if now >= next_snapshot or not self.engine.has_work:
                    next_snapshot = now + self._snapshot_interval_s
                    self.latest_snapshot = self.engine.snapshot()
        except BaseException as exc:  # noqa: BLE001 - reported to the actor, which goes unhealthy
            log.exception("engine thread died")
            self.error = exc
            self._loop.call_soon_threadsafe(self._failed)

    def _hand_over_taken(self, events: StepOutputs) -> None:
        """On the engine thread: hand over ``events`` with the checkpoints left so far."""
        checkpoints = self.engine.session_ops.take_checkpoints()
        if not (checkpoints and self._on_checkpoints):
            checkpoints = None
        if events or checkpoints:
            self._hand_over(events, checkpoints)

    def _hand_over(self, events: StepOutputs, checkpoints: CheckpointBatch | None) -> None:
        """On the engine thread: queue a step's events and checkpoints; wake the event loop
        unless a wake-up is already on its way (it will take these too)."""
        with self._handoff_lock:
            if (
                self._on_rows is not None
                and checkpoints is None
                and not events.events
                and not (self._handoff_due or self._delivering)
                and self._on_rows([events])
            ):
                return
            if events:
                self._handoff.append(events)
            if checkpoints:
                self._handoff_checkpoints.append(checkpoints)
            if self._handoff_due:
                return
            self._handoff_due = True
        self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        """On the event loop: every checkpoint, then every event handed over since the last
        wake-up, in order (checkpoints first: they hold back the turn endings they cover)."""
        with self._handoff_lock:
            events, self._handoff = self._handoff, []
            checkpoints, self._handoff_checkpoints = self._handoff_checkpoints, []
            self._handoff_due = False
            self._delivering = True
        try:
            for batch in checkpoints:
                self._on_checkpoints(batch)
            if events:
                self._on_events(events)
        finally:
            with self._handoff_lock:
                self._delivering = False

    def _failure(self) -> EngineFailedError:
        return EngineFailedError(
            f"replica {self.engine.replica_id}: the engine loop failed ({self.error!r}); "
            "its sessions are gone: open a new session"
        )

    def _failed(self) -> None:
        """On the event loop, once the engine loop has died: fail the commands it will never
        run (``call`` refuses new ones from now on), then tell the owner."""
        while True:
            try:
                _, _, future = self._commands.get_nowait()
            except queue.Empty:
                break
            _set_exception(future, self._failure())
        if self._on_failed is not None:
            self._on_failed(self.error)

    def _apply_commands(self, block: bool) -> None:
        try:
            item = self._commands.get(timeout=IDLE_TICK_S) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            fn, args, future = item
            try:
                result = fn(*args)
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                self._loop.call_soon_threadsafe(_set_exception, future, exc)
            else:
                self._loop.call_soon_threadsafe(_set_result, future, result)
            try:
                item = self._commands.get_nowait()
            except queue.Empty:
                return

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)


def _set_result(future: asyncio.Future, result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _set_exception(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
