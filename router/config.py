"""The settings of ``session-router serve``: one tree, each setting declared once.

``ServeConfig`` holds the cluster-level settings and contains ``ReplicaConfig`` (which contains
the pool sizes), ``RouterConfig`` and ``GatewayConfig``; ``JoinConfig`` (``session-router
gateway``) holds the Ray address to join and a ``GatewayConfig``. The command line is generated
from these fields (``router.flags``); ``ServeConfig.from_flags(max_sessions=8, ...)`` builds one
from flag names, which is how the demo, the benchmarks and the tests make theirs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from replica.config import ReplicaConfig
from replica.settings import nested, setting

NAMESPACE = "session-router"


@dataclass(frozen=True)
class RouterConfig:
    open_timeout_s: float = setting(
        10.0, "how long OpenSession waits for room before RESOURCE_EXHAUSTED"
    )
    stale_after_s: float = setting(
        5.0, "a replica whose latest snapshot is older than this is probed, then declared dead"
    )
    failover_wait_s: float = setting(
        120.0,
        "a dead replica's sessions wait this long for room on live replicas (the replacement "
        "joins empty), then those without room end ABORTED",
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
    checkpoint_dir: str = setting(
        "",
        "with session checkpoints: a directory on a volume every node mounts and that outlives "
        "pods; checkpoint stores also write there (versioned, checksummed), and a failover "
        "whose store is gone reads it ('': memory only)",
    )

    def __post_init__(self) -> None:
        if self.open_timeout_s < 0:
            raise ValueError("--open-timeout-s must be >= 0")
        if self.failover_wait_s < 0:
            raise ValueError("--failover-wait-s must be >= 0")
        if self.stale_after_s <= 0 or self.health_interval_s <= 0:
            raise ValueError("--stale-after-s must be positive")
        if self.dead_replica_retention_s < 0:
            raise ValueError("--dead-replica-retention-s must be >= 0")
        if self.drain_timeout_s < 0:
            raise ValueError("--drain-timeout-s must be >= 0")
        if self.checkpoint_dir:  # the stores' and the router's working directories differ
            object.__setattr__(self, "checkpoint_dir", os.path.abspath(self.checkpoint_dir))


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
    tls_cert: str | None = setting(
        None, "PEM certificate chain: serve gRPC and HTTP (HTTPS, wss://) over TLS only"
    )
    tls_key: str | None = setting(None, "PEM private key of --tls-cert")
    tls_client_ca: str | None = setting(
        None, "PEM CA bundle: clients must present a certificate it signed (mutual TLS)"
    )
    keepalive_s: float = setting(
        30.0,
        "ping idle gRPC connections and WebSockets this often; drop a peer that does not answer "
        "in as long",
    )
    shutdown_grace_s: float = setting(
        10.0,
        "on SIGTERM, running calls get this long to finish before their streams are cut "
        "(serve stops in about this plus 10 s whatever the replica count)",
    )

    http_port: int = setting(
        8000, "port of the OpenAI-compatible HTTP API, same host and TLS (0: any free port)"
    )
    served_model_name: str | None = setting(
        None, "the model's name in the HTTP API (default: what --model names)"
    )
    max_stored_responses: int = setting(
        64,
        "stored Responses-API responses that keep their conversation state, per replica "
        "(older ones are continued by replaying their conversation)",
    )
    response_ttl_s: float = setting(
        3600.0, "stored responses are deleted after this long, with their state"
    )

    def __post_init__(self) -> None:
        if self.max_stored_responses < 0:
            raise ValueError("--max-stored-responses must be >= 0")
        if self.response_ttl_s <= 0:
            raise ValueError("--response-ttl-s must be positive")
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
class ScalingConfig:
    """When the autoscaler adds and removes replicas (it is on when --max-replicas exceeds
    --min-replicas): up when the cluster's free session room stays low, down when a replica's
    sessions have fitted in the others' room (it is drained with migration)."""

    scale_up_free_sessions: int = setting(
        4, "add a replica when the cluster's free session room (GPU and host) stays below this"
    )
    scale_up_after_s: float = setting(5.0, "... for this long")
    scale_down_after_s: float = setting(
        60.0,
        "remove a replica (draining it with migration) once its sessions have fitted in the "
        "others' free room with twice --scale-up-free-sessions to spare for this long",
    )

    def __post_init__(self) -> None:
        if self.scale_up_free_sessions < 1:
            raise ValueError("--scale-up-free-sessions must be at least 1")
        if self.scale_up_after_s < 0 or self.scale_down_after_s < 0:
            raise ValueError("--scale-up-after-s and --scale-down-after-s must be >= 0")


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
    min_replicas: int = setting(0, "autoscaling: the fewest replicas (0: --replicas)")
    max_replicas: int = setting(
        0, "autoscaling: the most replicas (0: --replicas); above --min-replicas turns it on"
    )
    replica: ReplicaConfig = nested(ReplicaConfig)
    router: RouterConfig = nested(RouterConfig)
    gateway: GatewayConfig = nested(GatewayConfig)
    scaling: ScalingConfig = nested(ScalingConfig)

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError("--replicas must be at least 1")
        if not self.fewest_replicas <= self.replicas <= self.most_replicas:
            raise ValueError(
                f"--replicas ({self.replicas}) must lie within --min-replicas..--max-replicas "
                f"({self.fewest_replicas}..{self.most_replicas}; 0 means --replicas)"
            )
        if self.replica_gpus < 0:
            raise ValueError("--replica-gpus must be >= 0")
        if self.replica_start_timeout_s <= 0:
            raise ValueError("--replica-start-timeout-s must be positive")
        if self.router.checkpoint_dir and not self.replica.session_checkpoints:
            raise ValueError("--checkpoint-dir needs --session-checkpoints")

    @property
    def fewest_replicas(self) -> int:
        return self.min_replicas or self.replicas

    @property
    def most_replicas(self) -> int:
        return self.max_replicas or self.replicas

    @property
    def autoscaling(self) -> bool:
        return self.most_replicas > self.fewest_replicas

    @classmethod
    def from_flags(cls, **flags: Any) -> ServeConfig:
        """A config from flag names (``max_sessions=8``), defaults elsewhere."""
        from router.flags import build

        return build(cls, flags)


@dataclass(frozen=True)
class JoinConfig:
    """The settings of ``session-router gateway``: one more gateway in front of a running cluster
    (``--address`` is required; checked when the command runs, so that the defaults build)."""

    address: str | None = setting(
        None, "Ray address of the running cluster, as serve prints it ('Ray at ADDR')"
    )
    namespace: str = setting(NAMESPACE, "Ray namespace of the cluster's named actors")
    router_wait_s: float = setting(
        60.0, "how long to wait for the cluster's router actor to appear before giving up"
    )
    gateway: GatewayConfig = nested(GatewayConfig)

    def __post_init__(self) -> None:
        if self.router_wait_s < 0:
            raise ValueError("--router-wait-s must be >= 0")
