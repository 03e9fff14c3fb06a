"""``OutputStreams``: the gateways' long-lived output streams of one replica.

It owns the ``GatewayOutputs`` (``replica.actor.gateway_outputs``) that the engine's outputs are
dispatched into, and serves each gateway's ``stream_outputs`` call from it. When a gateway's
stream ends (it stopped or died), the sessions its Converse streams held open are released
(reason ``stream_ended``; reported to the router as the replica's own releases): those streams
ended with it. Used on the actor's event loop only.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from replica.actor.engine_host import EngineHost
from replica.actor.gateway_outputs import GatewayOutputs, release_streams_of
from replica.actor.tasks import BackgroundTasks
from replica.api import DeliveryEntry

if TYPE_CHECKING:
    from replica.engine.engine import Engine
    from replica.engine.step_outputs import StepOutputs

log = logging.getLogger(__name__)


class OutputStreams:
    def __init__(self, engine: Engine, host: EngineHost, tasks: BackgroundTasks) -> None:
        self.engine = engine
        self.host = host
        self.tasks = tasks
        self.outputs = GatewayOutputs(on_gone=self._gateway_gone)

    def dispatch(self, outputs: list[StepOutputs]) -> None:
        """Queue the engine's outputs for the gateways they go to."""
        self.outputs.dispatch(outputs)

    async def stream(self, gateway_id: str) -> AsyncIterator[list[DeliveryEntry]]:
        """What the engine produces for ``gateway_id``: an item waits while the gateway has not
        taken the previous ones, and carries everything produced meanwhile."""
        await self.host.start()
        async for batch in self.outputs.stream(gateway_id):
            yield batch

    def fail(self, why: str) -> None:
        """The engine died: every stream ends with an error (``GatewayOutputs.fail``)."""
        self.outputs.fail(why)

    def close(self) -> None:
        """The replica shuts down: every stream ends quietly."""
        self.outputs.close()

    def _gateway_gone(self, gateway_id: str) -> None:
        self.tasks.spawn(self._release_streams_of(gateway_id))

    async def _release_streams_of(self, gateway_id: str) -> None:
        released = await self.host.release(release_streams_of, self.engine, gateway_id)
        if isinstance(released, list) and released:
            log.info("gateway %s is gone: released its %d streams", gateway_id, len(released))
