"""The settings of ``session-router serve``: one tree, each setting declared once.

``ServeConfig`` holds the cluster-level settings and contains ``ReplicaConfig`` (which contains
the pool sizes), ``RouterConfig`` and ``GatewayConfig``. The command line is generated from these
fields (``router.flags``); ``ServeConfig.from_flags(max_sessions=8, ...)`` builds one from flag
names, which is how the demo, the benchmarks and the tests make theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replica.config import ReplicaConfig, nested, setting

NAMESPACE = "session-router"


@dataclass(frozen=True)
class RouterConfig:
    open_timeout_s: float = setting(
        10.0, "how long OpenSession waits for room before RESOURCE_EXHAUSTED"
    )
    stale_after_s: float = setting(
        5.0, "a replica whose latest snapshot is older than this is probed, then declared dead"
    )
    health_interval_s: float = setting(1.0, cli=False)
    dead_replica_retention_s: float = setting(
        300.0, "a dead replica stays listed (DEAD, replica_up 0) this long, then leaves /metrics"
    )
    drain_timeout_s: float = setting(
        300.0,
        "DrainReplica(migrate=true) and MigrateSession wait this long at most for sessions to "
        "move (a running turn ends first), then answer with how many are left",
    )

    def __post_init__(self) -> None:
        if self.open_timeout_s < 0:
            raise ValueError("--open-timeout-s must be >= 0")
        if self.stale_after_s <= 0 or self.health_interval_s <= 0:
            raise ValueError("--stale-after-s must be positive")
        if self.dead_replica_retention_s < 0:
            raise ValueError("--dead-replica-retention-s must be >= 0")
        if self.drain_timeout_s < 0:
            raise ValueError("--drain-timeout-s must be >= 0")


@dataclass(frozen=True)
class GatewayConfig:
    grpc_port: int = setting(50051, "gRPC port (0: any free port)")
    metrics_port: int = setting(9400, "Prometheus /metrics port (0: any free port)")
    host: str = setting(
        "127.0.0.1", "interface gRPC and metrics listen on (0.0.0.0: all interfaces)"
    )
    api_keys: str | None = setting(
        None, "file of 'KEY TENANT [admin]' lines; AdminService takes admin keys only"
    )
    tls_cert: str | None = setting(None, "PEM certificate chain: serve gRPC over TLS only")
    tls_key: str | None = setting(None, "PEM private key of --tls-cert")
    tls_client_ca: str | None = setting(
        None, "PEM CA bundle: clients must present a certificate it signed (mutual TLS)"
    )
    keepalive_s: float = setting(
        30.0, "ping idle gRPC connections this often; drop a peer that does not answer in as long"
    )
    shutdown_grace_s: float = setting(
        10.0,
        "on SIGTERM, running calls get this long to finish before their streams are cut "
        "(serve stops in about this plus 10 s whatever the replica count)",
    )

    def __post_init__(self) -> None:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key")
        if self.keepalive_s <= 0:
            raise ValueError("--keepalive-s must be positive")
        if self.shutdown_grace_s < 0:
            raise ValueError("--shutdown-grace-s must be >= 0")

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)


@dataclass(frozen=True)
class ServeConfig:
    address: str | None = setting(
        None, "Ray address to join ('auto'); default: an embedded local Ray"
    )
    namespace: str = setting(NAMESPACE, "Ray namespace of the cluster's named actors")
    replicas: int = setting(2, "replica actors to start")
    replica_gpus: float = setting(0.0, "GPUs per replica (0: CPU replicas)")
    replica_start_timeout_s: float = setting(
        120.0, "start-up fails, saying why, when a replica is not up after this long"
    )
    replica: ReplicaConfig = nested(ReplicaConfig)
    router: RouterConfig = nested(RouterConfig)
    gateway: GatewayConfig = nested(GatewayConfig)

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError("--replicas must be at least 1")
        if self.replica_gpus < 0:
            raise ValueError("--replica-gpus must be >= 0")
        if self.replica_start_timeout_s <= 0:
            raise ValueError("--replica-start-timeout-s must be positive")

    @classmethod
    def from_flags(cls, **flags: Any) -> ServeConfig:
        """A config from flag names (``max_sessions=8``), defaults elsewhere."""
        from router.flags import build

        return build(cls, flags)
