"""``GatewayServer``: one gateway in front of a running cluster: the ``Gateway`` state, its gRPC
services and its /metrics endpoint, started and stopped together.

``serve`` runs one beside the cluster's actors; ``session-router gateway --address ADDR`` runs one
alone (``router.ops.join``). Every gateway exports its own calls (``session_router_rpc_*``, time to
first token, generated tokens, refused opens): Prometheus scrapes each and sums them. Only the
gateway of ``serve`` also exports the per-replica metrics from the router's views
(``cluster_metrics``), so that N gateways do not export N copies of each replica's series.
"""

from __future__ import annotations

from typing import Any

import grpc
from prometheus_client import CollectorRegistry

from router.config import GatewayConfig
from router.control.response_store import ResponseStoreClient
from router.gateway.auth import ApiKeys
from router.gateway.gateway import Gateway
from router.gateway.metrics import MetricsServer, build_registry, serve_metrics
from router.gateway.service import start_grpc_server
from router.gateway.tls import server_credentials
from router.http.app import build_app
from router.http.front_door import FrontDoor
from router.http.metrics import HttpMetrics
from router.http.response_sweeper import ResponseSweeper
from router.http.server import HttpServer

OPEN_WAIT_S = 10.0  # how long an HTTP request waits for a replica with room

ALL_INTERFACES = ("0.0.0.0", "::", "[::]", "")


class GatewayServer:
    def __init__(self, config: GatewayConfig, cluster_metrics: bool = True) -> None:
        """Reads the API keys and TLS files now, so that a bad file fails before anything
        starts (``ValueError`` naming the flag)."""
        self.config = config
        self.cluster_metrics = cluster_metrics
        self.keys = ApiKeys.load(config.api_keys)
        self.credentials: grpc.ServerCredentials | None = server_credentials(
            config.tls_cert, config.tls_key, config.tls_client_ca
        )
        self.gateway: Gateway | None = None
        self.registry: CollectorRegistry | None = None  # /metrics: add collectors once started
        self.grpc: grpc.aio.Server | None = None
        self.metrics: MetricsServer | None = None
        self.http: HttpServer | None = None
        self.front_door: FrontDoor | None = None
        self.sweeper: ResponseSweeper | None = None

    @property
    def all_interfaces(self) -> bool:
        return self.config.host in ALL_INTERFACES

    @property
    def grpc_address(self) -> str:
        """Where a client on this machine connects."""
        host = "127.0.0.1" if self.all_interfaces else self.config.host
        return f"{host}:{self.grpc.bound_port}"

    async def start(
        self, router: Any, responses: Any = None, model_name: str | None = None
    ) -> None:
        """Serve gRPC, HTTP and /metrics in front of the cluster's ``router`` actor, with its
        ``responses`` store actor (None: the Responses API answers 503); ``model_name``: the
        served model's name when known here (else asked of a replica)."""
        cfg = self.config
        views = (lambda: self.gateway.cluster.views) if self.cluster_metrics else None
        self.registry, gateway_metrics = build_registry(views)
        self.gateway = Gateway(router, self.keys, gateway_metrics)
        await self.gateway.start()
        self.metrics = serve_metrics(cfg.metrics_port, self.registry, cfg.host)
        self.grpc = await start_grpc_server(
            self.gateway,
            cfg.grpc_port,
            "[::]" if self.all_interfaces else cfg.host,
            self.credentials,
            cfg.keepalive_s,
        )
        store = ResponseStoreClient(responses) if responses is not None else None
        self.front_door = FrontDoor(
            self.gateway,
            HttpMetrics(self.registry),
            cfg.served_model_name or model_name,
            store,
            OPEN_WAIT_S,
            cfg.response_ttl_s,
        )
        await self.front_door.start()
        if store is not None:
            registry = self.registry if self.cluster_metrics else None
            self.sweeper = ResponseSweeper(store, self.front_door.turns, registry)
            self.sweeper.start()
        tls = (cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca) if cfg.tls else None
        host = "0.0.0.0" if self.all_interfaces else cfg.host
        self.http = HttpServer(
            build_app(self.front_door), host, cfg.http_port, tls, cfg.keepalive_s
        )
        await self.http.start()

    def listening(self) -> tuple[str, str, str]:
        """Where gRPC and metrics really listen (one address per line, for scripts)."""
        host = "0.0.0.0" if self.all_interfaces else self.config.host
        scheme = "https" if self.config.tls else "http"
        return (
            f"gRPC listening on {host}:{self.grpc.bound_port}",
            f"metrics on http://{host}:{self.metrics.port}/metrics",
            f"OpenAI-compatible API on {scheme}://{host}:{self.http.port}/v1",
        )

    @property
    def http_url(self) -> str:
        """The base URL of the OpenAI-compatible API for a client on this machine."""
        host = "127.0.0.1" if self.all_interfaces else self.config.host
        scheme = "https" if self.config.tls else "http"
        return f"{scheme}://{host}:{self.http.port}/v1"

    def security(self) -> str:
        """What protects the gateway: interfaces, TLS, API keys."""
        cfg = self.config
        scope = "all interfaces" if self.all_interfaces else f"{cfg.host} only"
        tls = "plaintext gRPC (--tls-cert for TLS)"
        if cfg.tls:
            tls = "TLS with client certificates" if cfg.tls_client_ca else "TLS only"
        keys = "API keys on" if self.keys.enabled else "no API keys (--api-keys)"
        return f"security: {scope}; {tls}; {keys}"

    async def stop(self) -> None:
        """Stop taking calls, end the gateway's streams and background work, close /metrics.
        The cluster's actors are not this gateway's: they keep running."""
        if self.sweeper is not None:
            self.sweeper.stop()
        if self.http is not None:
            await self.http.stop()
        if self.grpc is not None:
            await self.grpc.stop(grace=self.config.shutdown_grace_s)
        if self.gateway is not None:
            await self.gateway.stop()
        if self.metrics is not None:
            self.metrics.close()
