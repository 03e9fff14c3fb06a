"""``OutputStreams``: the gateways' long-lived output streams of one replica.

It owns the ``GatewayOutputs`` (``replica.actor.gateway_outputs``) that the engine's outputs are
dispatched into on the event loop, and the ``StreamThreads`` its streams run on. A gateway asks
for a thread (``reserve``) and then streams on it (``stream``, a plain generator on that thread,
which gives the thread back when it ends), or on the event loop when none was free
(``stream_async``). With a socket host it also builds the ``OutputServer`` a gateway may read
its stream from instead (``replica.actor.output_server``; ``address``), each stream on that
server's thread for the connection. When a gateway's stream ends (it stopped or died), the
sessions its Converse streams held open are released (reason ``stream_ended``; reported to the
router as the replica's own releases): those streams ended with it. Built on the event loop,
whose loop it keeps for the stream threads' calls back to it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

from replica.actor.engine_host import EngineHost
from replica.actor.gateway_outputs import GatewayOutputs, release_streams_of
from replica.actor.output_server import OutputServer
from replica.actor.stream_threads import StreamThreads
from replica.actor.tasks import BackgroundTasks
from replica.api import DeliveryEntry, OutputAddress

if TYPE_CHECKING:
    from replica.engine.engine import Engine
    from replica.engine.step_outputs import StepOutputs

log = logging.getLogger(__name__)


class OutputStreams:
    def __init__(
        self,
        engine: Engine,
        host: EngineHost,
        tasks: BackgroundTasks,
        threads: int,
        socket_host: str | None = None,
    ) -> None:
        """``threads``: the actor's output stream groups (``stream_threads.concurrency_groups``);
        ``socket_host``: the address the output server listens on (None: no server)."""
        self.engine = engine
        self.host = host
        self.tasks = tasks
        self.loop = asyncio.get_running_loop()
        self.threads = StreamThreads(threads)
        self.outputs = GatewayOutputs(on_gone=self._gateway_gone)
        self.server = OutputServer(self._stream_here, socket_host) if socket_host else None

    @property
    def address(self) -> OutputAddress | None:
        """Where a gateway reads its outputs over a socket (None: only the Ray stream)."""
        return self.server.address if self.server is not None else None

    def dispatch(self, outputs: list[StepOutputs]) -> None:
        """Queue the engine's outputs for the gateways they go to (on the event loop)."""
        self.outputs.dispatch(outputs)

    def reserve(self, gateway_id: str) -> str:
        """The concurrency group ``gateway_id``'s next stream runs in ("": none is free, it
        streams from the event loop)."""
        return self.threads.reserve(gateway_id)

    def stream(self, gateway_id: str, group: str) -> Iterator[list[DeliveryEntry]]:
        """On the thread of ``group``: what the engine produces for ``gateway_id``; an item
        waits while the gateway has not taken the previous ones, and carries everything
        produced meanwhile. The engine is started first (on the event loop)."""
        self.threads.started(group, gateway_id)
        try:
            yield from self._stream_here(gateway_id)
        finally:
            self.threads.release(group, gateway_id)

    def _stream_here(self, gateway_id: str) -> Iterator[list[DeliveryEntry]]:
        """``stream`` on the calling thread, whichever it is."""
        if not self.host.started:
            asyncio.run_coroutine_threadsafe(self.host.start(), self.loop).result()
        yield from self.outputs.stream(gateway_id)

    async def stream_async(self, gateway_id: str) -> AsyncIterator[list[DeliveryEntry]]:
        """``stream`` on the event loop."""
        await self.host.start()
        async for batch in self.outputs.stream_async(gateway_id):
            yield batch

    def fail(self, why: str) -> None:
        """The engine died: every stream ends with an error (``GatewayOutputs.fail``)."""
        self._stop_server()
        self.outputs.fail(why)

    def close(self) -> None:
        """The replica shuts down: every stream ends quietly."""
        self._stop_server()
        self.outputs.close()

    def _stop_server(self) -> None:
        if self.server is not None:
            self.server.close()

    def _gateway_gone(self, gateway_id: str) -> None:
        """Where the ended stream ran (its thread, or the loop)."""
        self.loop.call_soon_threadsafe(self._release_streams_of, gateway_id)

    def _release_streams_of(self, gateway_id: str) -> None:
        self.tasks.spawn(self._released_streams_of(gateway_id))

    async def _released_streams_of(self, gateway_id: str) -> None:
        released = await self.host.release(release_streams_of, self.engine, gateway_id)
        if isinstance(released, list) and released:
            log.info("gateway %s is gone: released its %d streams", gateway_id, len(released))
