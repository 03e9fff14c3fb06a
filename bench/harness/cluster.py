"""A local cluster for a benchmark: embedded Ray, the router actor, the replica actors and the
gateway (in this process, on loopback, any free ports), started by ``router.ops.serve.Server``
from ``ServeConfig.from_flags`` exactly as ``session-router serve`` starts them. Threads per
replica come from the ``threads`` setting (0: what serve gives a CPU replica by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from bench.harness.grpc_driver import GrpcDriver
from bench.harness.profile import GatewayProfile
from replica.config import ReplicaConfig
from router.config import ServeConfig
from router.control.fleet import replica_threads
from router.ops.serve import Server


class LocalCluster:
    """A started ``Server`` and what benchmarks need of it; one gRPC client process is started
    on first use of ``grpc()`` and shared by the benchmarks that run on this cluster."""

    def __init__(self, server: Server, profile: GatewayProfile) -> None:
        self.server = server
        self.profile = profile
        self.replicas: dict[str, Any] = {}  # id -> handle, as the controller started them
        self._grpc: GrpcDriver | None = None

    @property
    def config(self) -> ServeConfig:
        return self.server.config

    @property
    def handles(self) -> list[Any]:
        """The replica actors, in replica id order."""
        return [self.replicas[r] for r in sorted(self.replicas)]

    @property
    def threads(self) -> int:
        """Torch threads each replica runs with (the setting, or serve's default)."""
        return replica_threads(self.config)

    @property
    def replica_config(self) -> ReplicaConfig:
        """The replicas' config as they got it: an in-process engine built from it matches."""
        return dataclasses.replace(self.config.replica, threads=self.threads)

    async def grpc(self) -> GrpcDriver:
        """The workloads through the gateway, from a client in a child process."""
        if self._grpc is None:
            self._grpc = await GrpcDriver.start(self.server.grpc_address, self.profile)
        return self._grpc

    @contextlib.asynccontextmanager
    async def on_first_replica(self) -> AsyncIterator[None]:
        """While inside, the router places new sessions on the first replica only (the others
        are draining)."""
        others = sorted(self.replicas)[1:]
        for replica_id in others:
            await self.server.router.drain.remote(replica_id)
        try:
            yield
        finally:
            for replica_id in others:
                await self.server.router.resume.remote(replica_id)

    def print_setup(self, started_in_s: float) -> None:
        cfg, cpus = self.config, os.cpu_count() or 1
        how = "the --threads setting" if cfg.replica.threads else "serve's default"
        print(
            f"started {cfg.replicas} replica(s) in {started_in_s:.1f}s; "
            f"max_sessions={cfg.replica.pools.max_sessions}/replica; torch threads per replica "
            f"and in-process: {self.threads} ({how}); cpus: {cpus}"
        )
        if self.threads * cfg.replicas >= cpus:
            print(
                "note: the replicas' torch threads take every core, so the gateway, router, "
                "client and Ray compete with their OpenMP barriers (try --threads 1)"
            )
        load = os.getloadavg()[0]
        if load > cpus:
            print(
                f"note: the machine is busy (load average {load:.1f} on {cpus} cpus): absolute "
                "figures are noisy; the side-by-side ratios less so"
            )

    def stop_clients(self) -> None:
        if self._grpc is not None:
            self._grpc.stop()
            self._grpc = None


@contextlib.asynccontextmanager
async def local_cluster(
    profile: GatewayProfile | None = None, **flags: Any
) -> AsyncIterator[LocalCluster]:
    """A started ``LocalCluster`` from serve's flags (``replicas=1, max_sessions=512, threads=1``,
    ...; ports and host are set here); stopped, with Ray, on exit."""
    config = ServeConfig.from_flags(
        grpc_port=0, metrics_port=0, http_port=0, host="127.0.0.1", **flags
    )
    server = Server(config)
    cluster = LocalCluster(server, profile or GatewayProfile(None))
    t0 = time.perf_counter()
    try:
        await server.start()
        cluster.replicas = (await server.controller.fleet_view()).replicas
        await asyncio.gather(*(handle.ping.remote() for handle in cluster.handles))
        cluster.print_setup(time.perf_counter() - t0)
        yield cluster
    finally:
        cluster.stop_clients()
        await server.stop()
