"""``session-router gateway --address ADDR``: one more gateway in front of a running cluster.

It joins the cluster's Ray (the address ``serve`` prints) as a driver of its own
(``router.ops.ray_join``: Ray's token when one is at hand, a refused token said at once), finds
the router actor by name in the cluster's namespace, and serves gRPC and /metrics with the same
gateway flags as ``serve`` (host, ports, TLS, API keys). It owns no actor: when it stops or dies,
the cluster and every session go on (its Converse streams end with it, and its clients reconnect
to another gateway, which continues their sessions).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import ray

from router.config import JoinConfig
from router.control.api import ROUTER_NAME
from router.control.response_store import find_store
from router.ops import ray_join
from router.ops.gateway_server import GatewayServer

log = logging.getLogger(__name__)

LOOK_EVERY_S = 0.5


class RouterNotFound(Exception):
    """The cluster has no router actor (yet) in the namespace."""


async def find_router(namespace: str, wait_s: float) -> Any:
    """The router actor of ``namespace``; looks every ``LOOK_EVERY_S`` for up to ``wait_s``
    (a cluster whose serve is still starting), then raises ``RouterNotFound``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:  # a GCS call that blocks: off the event loop
            return await asyncio.to_thread(ray.get_actor, ROUTER_NAME, namespace)
        except ValueError:
            if time.monotonic() >= deadline:
                raise RouterNotFound(
                    f"no router actor {ROUTER_NAME!r} in Ray namespace {namespace!r} after "
                    f"{wait_s:g}s: is `session-router serve` running on this cluster (and with "
                    "this --namespace)?"
                ) from None
        await asyncio.sleep(LOOK_EVERY_S)


class JoinedGateway:
    """A ``GatewayServer`` on a cluster joined at ``config.address``."""

    def __init__(self, config: JoinConfig) -> None:
        if not config.address:
            raise ValueError(
                "--address is required: the Ray address that `session-router serve` prints"
            )
        self.config = config
        self.front = GatewayServer(config.gateway, cluster_metrics=False)
        self._joined = False  # this object connected to Ray (and leaves it on stop)

    async def start(self) -> None:
        cfg = self.config
        if not ray.is_initialized():
            ray_join.connect(
                cfg.address, cfg.namespace, log_to_driver=False, logging_level=logging.WARNING
            )
            self._joined = True
        router = await find_router(cfg.namespace, cfg.router_wait_s)
        responses = await find_store(cfg.namespace, wait_s=2.0)
        await self.front.start(router, responses)

    def listening(self) -> list[str]:
        cfg = self.config
        return [
            *self.front.listening(),
            # the address found, not "auto": what another shell passes to join the same cluster
            f"joined the cluster at {ray.get_runtime_context().gcs_address} "
            f"(router {cfg.namespace}/{ROUTER_NAME})",
            self.front.security(),
        ]

    async def undo_start(self) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Stop serving and leave Ray; the cluster goes on."""
        await self.front.stop()
        if self._joined:
            ray.shutdown()
