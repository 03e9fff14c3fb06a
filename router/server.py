"""``session-router serve``: Ray, the router actor, the replica actors, the gRPC gateway and the
metrics endpoint, started in order and stopped cleanly (sessions released, Ray stopped).

Without ``address`` an embedded local Ray instance is started; ``address="auto"`` joins a
running cluster. Replica actors ask for ``replica_gpus`` GPUs each (CPU replicas when 0).
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass

import ray

from replica.config import PoolConfig, ReplicaConfig
from router.actor import ROUTER_NAME, SessionRouter
from router.auth import ApiKeys
from router.cluster import Cluster
from router.gateway import Gateway, start_grpc_server
from router.metrics import build_registry, serve_metrics

log = logging.getLogger(__name__)

NAMESPACE = "session-router"


@dataclass(frozen=True)
class ServeConfig:
    address: str | None = None
    replicas: int = 2
    model: str = "tiny-bamba"
    model_path: str | None = None
    max_sessions: int = 64
    kv_tokens: int = 65536
    max_context: int = 4096
    page_size: int = 16
    mamba_track_buffers: int = 1
    session_idle_timeout_s: float = 300.0
    open_timeout_s: float = 10.0
    grpc_port: int = 50051
    metrics_port: int = 9400
    host: str = "0.0.0.0"
    replica_gpus: float = 0.0
    api_keys: str | None = None
    strict: bool = False
    stale_after_s: float = 5.0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError("--replicas must be at least 1")
        if self.open_timeout_s < 0:
            raise ValueError("--open-timeout-s must be >= 0")
        if self.replica_gpus < 0:
            raise ValueError("--replica-gpus must be >= 0")

    def replica_config(self) -> ReplicaConfig:
        pools = PoolConfig(
            max_sessions=self.max_sessions,
            kv_tokens=self.kv_tokens,
            max_context=self.max_context,
            page_size=self.page_size,
            mamba_track_buffers=self.mamba_track_buffers,
        )
        return ReplicaConfig(
            pools=pools, session_idle_timeout_s=self.session_idle_timeout_s, strict=self.strict
        )


class Server:
    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.replica_config = config.replica_config()  # validates the pool flags up front
        self.keys = ApiKeys.load(config.api_keys)
        self._started_ray = False
        self.router = None
        self.replicas: dict[str, object] = {}
        self.cluster: Cluster | None = None
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
            kwargs = {"namespace": NAMESPACE, "include_dashboard": False, "log_to_driver": True}
            if cfg.address:
                kwargs["address"] = cfg.address
            else:  # the embedded instance stays on loopback
                kwargs["_node_ip_address"] = "127.0.0.1"
            ray.init(**kwargs)
            self._started_ray = True
        self.router = (
            ray.remote(SessionRouter)
            .options(
                name=ROUTER_NAME,
                namespace=NAMESPACE,
                num_cpus=0,
                max_restarts=-1,
                max_concurrency=10_000,
                get_if_exists=True,
            )
            .remote(cfg.open_timeout_s, cfg.stale_after_s)
        )
        await self.start_replicas(cfg.replicas)
        self.cluster = Cluster(self.router)
        self.cluster.start()
        registry, gateway_metrics = build_registry(lambda: self.cluster.cached_views)
        self.metrics = serve_metrics(cfg.metrics_port, registry, cfg.host)
        gateway = Gateway(self.cluster, self.keys, gateway_metrics)
        self.grpc = await start_grpc_server(
            gateway, cfg.grpc_port, "[::]" if cfg.host == "0.0.0.0" else cfg.host
        )

    async def start_replicas(self, count: int) -> list[str]:
        from replica.actor import ReplicaActor

        cfg = self.config
        # CPU replicas share the cores; one is left to the gateway, the router and Ray.
        threads = max(1, ((os.cpu_count() or 1) - 1) // count) if cfg.replica_gpus == 0 else 1
        first = len(self.replicas)
        ids = [f"replica-{i}" for i in range(first, first + count)]
        for replica_id in ids:
            handle = (
                ray.remote(ReplicaActor)
                .options(
                    name=f"{replica_id}",
                    namespace=NAMESPACE,
                    num_gpus=cfg.replica_gpus,
                    num_cpus=0 if cfg.replica_gpus else min(1, threads),
                    max_concurrency=10_000,
                    runtime_env={"env_vars": {"OMP_NUM_THREADS": str(threads)}},
                )
                .remote(replica_id, self.replica_config, cfg.model, cfg.model_path, ROUTER_NAME)
            )
            self.replicas[replica_id] = handle
        descs = await asyncio.gather(*(self.replicas[r].describe.remote() for r in ids))
        snaps = await asyncio.gather(*(self.replicas[r].snapshot.remote() for r in ids))
        for replica_id, desc, snap in zip(ids, descs, snaps):
            await self.router.register_replica.remote(
                replica_id, self.replicas[replica_id], desc, (), snap
            )
        log.info("started %d replicas", count)
        return ids

    async def stop(self) -> None:
        if self.grpc is not None:
            await self.grpc.stop(grace=1.0)
        if self.cluster is not None:
            await self.cluster.stop()
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
