"""``ControllerClient``: the typed calls of ``serve``, ``stop`` and the tests to the ``Controller``.

Its errors come back as values and are raised here with their own types, so a caller catches a
``ReplicaStartError`` or ``ValueError`` as if the work had run in its process.
"""

from __future__ import annotations

from typing import Any

from router.config import ServeConfig
from router.control.api import FleetView, ScalingReport


class ControllerClient:
    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def attach(self, config: ServeConfig, failpoints: frozenset[str] = frozenset()) -> None:
        """Raises ``ValueError`` (the deployment serves another model or other pool sizes) or
        ``ReplicaStartError`` (a replica ``config`` asks for did not start)."""
        error = await self.handle.attach.remote(config, failpoints)
        if error is not None:
            raise error

    async def fleet_view(self) -> FleetView:
        return await self.handle.fleet_view.remote()

    async def scaling(self) -> ScalingReport:
        return await self.handle.scaling.remote()

    async def start_replicas(
        self, count: int, failpoints: frozenset[str] = frozenset()
    ) -> list[str]:
        return await self.handle.start_replicas.remote(count, failpoints)

    async def stop(self) -> int:
        return await self.handle.stop.remote()
