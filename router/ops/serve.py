"""``session-router serve``: Ray, the router actor, the replica actors, the gRPC gateway and the
metrics endpoint, started in order and stopped cleanly (sessions released, Ray stopped).

Without ``address`` an embedded local Ray instance is started; ``address="auto"`` joins a
running cluster. Replica actors ask for ``replica_gpus`` GPUs each (CPU replicas when 0).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os

import ray

from replica import failpoints
from router.config import ServeConfig
from router.control.router import ROUTER_NAME, SessionRouter
from router.gateway.auth import ApiKeys
from router.gateway.gateway import Gateway
from router.gateway.metrics import build_registry, serve_metrics
from router.gateway.service import start_grpc_server

log = logging.getLogger(__name__)


def quiet_ray_start_up() -> None:
    """Ray announces at every start that it enabled its token authentication, which is what we
    want; the warning would only alarm the operator, so it is kept to errors."""
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
        logging.ERROR
    )


class Server:
    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.keys = ApiKeys.load(config.gateway.api_keys)
        self._started_ray = False
        self.router = None
        self.replicas: dict[str, object] = {}
        self.gateway: Gateway | None = None
        self.grpc = None
        self.metrics = None

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc.bound_port}"

    @property
    def metrics_url(self) -> str:
        return self.metrics.url

    async def start(self) -> None:
        cfg = self.config
        if not ray.is_initialized():
            kwargs = {
                "namespace": cfg.namespace,
                "include_dashboard": False,
                "log_to_driver": True,
                "logging_level": logging.WARNING,
            }
            if cfg.address:
                kwargs["address"] = cfg.address
            else:  # the embedded instance stays on loopback
                kwargs["_node_ip_address"] = "127.0.0.1"
            quiet_ray_start_up()
            ray.init(**kwargs)
            self._started_ray = True
        self.router = (
            ray.remote(SessionRouter)
            .options(
                name=ROUTER_NAME,
                namespace=cfg.namespace,
                num_cpus=0,
                max_restarts=-1,
                max_concurrency=10_000,
                get_if_exists=True,
            )
            .remote(cfg.router)
        )
        await self.start_replicas(cfg.replicas)
        registry, gateway_metrics = build_registry(lambda: self.gateway.cluster.views)
        self.gateway = Gateway(self.router, self.keys, gateway_metrics)
        self.gateway.start()
        host = cfg.gateway.host
        self.metrics = serve_metrics(cfg.gateway.metrics_port, registry, host)
        self.grpc = await start_grpc_server(
            self.gateway, cfg.gateway.grpc_port, "[::]" if host == "0.0.0.0" else host
        )

    def replica_threads(self) -> int:
        """Torch threads per replica: the setting, else CPU replicas share the cores (one is
        left to the gateway, the router and Ray)."""
        cfg = self.config
        if cfg.replica.threads or cfg.replica_gpus:
            return cfg.replica.threads or 1
        return max(1, ((os.cpu_count() or 1) - 1) // cfg.replicas)

    async def start_replicas(self, count: int) -> list[str]:
        from replica.actor import ReplicaActor

        cfg = self.config
        threads = self.replica_threads()
        replica_config = dataclasses.replace(
            cfg.replica, threads=threads, failpoints=cfg.replica.failpoints | failpoints.from_env()
        )
        first = len(self.replicas)
        ids = [f"replica-{i}" for i in range(first, first + count)]
        for replica_id in ids:
            handle = (
                ray.remote(ReplicaActor)
                .options(
                    name=replica_id,
                    namespace=cfg.namespace,
                    num_gpus=cfg.replica_gpus,
                    num_cpus=0 if cfg.replica_gpus else min(1, threads),
                    max_concurrency=10_000,
                    runtime_env={"env_vars": {"OMP_NUM_THREADS": str(threads)}},
                )
                .remote(replica_id, replica_config, self.router)
            )
            self.replicas[replica_id] = handle
        descs = await asyncio.gather(*(self.replicas[r].describe.remote() for r in ids))
        snaps = await asyncio.gather(*(self.replicas[r].snapshot.remote() for r in ids))
        for replica_id, desc, snap in zip(ids, descs, snaps):
            await self.router.register_replica.remote(
                replica_id, self.replicas[replica_id], desc, {}, snap
            )
        log.info("started %d replicas", count)
        return ids

    async def stop(self) -> None:
        if self.grpc is not None:
            await self.grpc.stop(grace=1.0)
        if self.gateway is not None:
            await self.gateway.stop()
        for handle in self.replicas.values():
            try:
                await asyncio.wait_for(handle.shutdown.remote(), timeout=10)
            except Exception as exc:  # noqa: BLE001 - a dead replica has nothing to release
                log.warning("replica shutdown failed: %s", exc)
        if self.metrics is not None:
            self.metrics.close()
        for handle in [*self.replicas.values(), self.router]:
            if handle is not None:
                ray.kill(handle, no_restart=True)
        self.replicas.clear()
        if self._started_ray:
            ray.shutdown()
