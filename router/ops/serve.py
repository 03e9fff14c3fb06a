"""``session-router serve``: Ray, the cluster's actors (the router, the controller, which starts
and supervises the replicas) and one gateway (gRPC, HTTP and /metrics,
``router.ops.gateway_server``), started in order and stopped cleanly (sessions released, Ray
stopped).

The actors belong to the cluster, not to this process: they are detached named actors of
``--namespace``. More gateways join with ``session-router gateway --address ADDR`` (the Ray
address serve prints, ``router.ops.join``), any gateway serves any session, and a gateway's death
loses no session; a ``serve`` that crashed ends nothing (the ``Controller`` goes on replacing dead
replicas and autoscaling), and the next one attaches to the deployment it finds. SIGINT or
SIGTERM stops the deployment: every session released, every actor ended.

Without ``address`` a new embedded local Ray instance is started, every port on loopback;
``address="auto"`` or ``HOST:PORT`` joins a running cluster (``router.ops.ray_join``).
Start-up fails with a report rather than waiting forever for replicas that cannot be scheduled
(``router.control.scheduling``). gRPC and metrics listen on ``--host`` (loopback by default);
with ``--tls-cert`` gRPC serves TLS only.
"""

from __future__ import annotations

import asyncio
import logging
import os

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from replica import failpoints
from router.config import ServeConfig
from router.control.api import CONTROLLER_NAME, ROUTER_NAME
from router.control.controller import Controller
from router.control.controller_client import ControllerClient
from router.control.fleet import Fleet, kill
from router.control.periodic import Periodic
from router.control.response_store import RESPONSES_NAME, ResponseStore
from router.control.router import SessionRouter
from router.control.scaling_metrics import ScalingMetrics
from router.gateway.gateway import Gateway
from router.ops import ray_join
from router.ops.gateway_server import GatewayServer

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
        self.front = GatewayServer(config.gateway, cluster_metrics=True)
        self._started_ray = False
        self.router = None
        self.responses = None  # the cluster's stored responses (the HTTP Responses API)
        self.controller: ControllerClient | None = None
        self.attached = False  # found a deployment in the namespace instead of making one
        self._scaling: Periodic | None = None  # the controller's figures copied to /metrics

    @property
    def gateway(self) -> Gateway | None:
        return self.front.gateway

    @property
    def grpc(self):
        return self.front.grpc

    @property
    def metrics(self):
        return self.front.metrics

    @property
    def grpc_address(self) -> str:
        """Where a client on this machine connects."""
        return self.front.grpc_address

    @property
    def metrics_url(self) -> str:
        return self.front.metrics.url

    @property
    def ray_address(self) -> str:
        """The address another gateway joins with (``session-router gateway --address``)."""
        return ray.get_runtime_context().gcs_address

    def listening(self) -> list[str]:
        """What ``serve`` prints once ready: where gRPC, metrics and Ray really listen (one
        address per line, for scripts), then what protects them."""
        ray_kind = "joined" if self.config.address else "embedded"
        return [
            *self.front.listening(),
            f"Ray at {self.ray_address} ({ray_kind}; more gateways: session-router gateway "
            f"--address {self.ray_address})",
            self.front.security(),
        ]

    async def start(self) -> None:
        cfg = self.config
        if cfg.router.checkpoint_dir:
            try:
                os.makedirs(cfg.router.checkpoint_dir, exist_ok=True)
            except OSError as exc:
                raise RuntimeError(f"--checkpoint-dir cannot be used: {exc}") from exc
        if not ray.is_initialized():
            quiet_ray_start_up()
            ray_join.connect(
                cfg.address,
                cfg.namespace,
                include_dashboard=False,
                log_to_driver=True,
                logging_level=logging.WARNING,
            )
            self._started_ray = True
        await self.attach_or_deploy()
        await self.front.start(self.router, self.responses, cfg.replica.model_name)
        scaling_metrics = ScalingMetrics(self.front.registry, cfg.replicas)
        controller = self.controller

        async def show_scaling() -> None:
            scaling_metrics.show(await controller.scaling())

        self._scaling = Periodic("reading the autoscaler's figures", show_scaling, 1.0)
        self._scaling.start()

    async def attach_or_deploy(self) -> None:
        """Attach to the deployment in ``--namespace`` when there is one (a ``serve`` that
        crashed left it running: every session continues), else deploy one: the router, the
        response store and the controller (which starts ``--replicas`` replicas), all detached,
        so that no process's death but their own ends them. Raises ``ValueError`` when the
        deployment found serves another model or other pool sizes (saying what differs and how
        to stop it), ``ReplicaStartError`` when replicas this serve asks for do not start."""
        cfg = self.config
        self.router = await named_actor(ROUTER_NAME, cfg.namespace)
        self.attached = self.router is not None
        if self.attached:
            log.warning("attached to the deployment in namespace %s", cfg.namespace)
        else:
            self.router = self._detached(SessionRouter, ROUTER_NAME, max_restarts=-1,
                                         max_concurrency=10_000).remote(cfg.router)  # fmt: skip
        # restarted by Ray when its node dies (a head restart), empty: stored responses are a
        # cache of the HTTP Responses API, not a session's state
        self.responses = self._detached(ResponseStore, RESPONSES_NAME, max_restarts=-1).remote(
            cfg.gateway.max_stored_responses, cfg.gateway.response_ttl_s
        )
        # the failpoints of this environment go to the replicas this start brings up: the
        # controller's environment is not ours
        env_failpoints = failpoints.from_env()
        handle = self._detached(Controller, CONTROLLER_NAME, max_restarts=-1).remote(
            cfg, self.router, env_failpoints
        )
        self.controller = ControllerClient(handle)
        await self.controller.attach(cfg, env_failpoints)
        if self.attached:
            view = await self.controller.fleet_view()
            log.warning("the deployment has %d replica(s) with their sessions", len(view.replicas))

    def _detached(self, cls, name: str, **options):
        """``cls`` as a detached named actor of the namespace (the one there if it exists),
        beside serve: not on a node that only hosts a gateway (it offers no CPU, and a zero-CPU
        actor could land there and die with that gateway)."""
        return ray.remote(cls).options(
            name=name,
            namespace=self.config.namespace,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(
                ray.get_runtime_context().get_node_id(), soft=True
            ),
            **options,
        )

    async def undo_start(self) -> None:
        """After a start that failed: remove what this start made and nothing more. A
        deployment it attached to keeps serving its sessions (replicas this start added were
        removed by the controller); one it made is stopped whole."""
        if not self.attached:
            await self.stop()
            return
        if self._scaling is not None:
            await self._scaling.stop()
        await self.front.stop()
        if self._started_ray:
            ray.shutdown()  # leaves the cluster: its detached actors go on

    async def stop(self) -> int:
        """Stop serving, release every replica's sessions, end the deployment's actors (and an
        embedded Ray); returns how many sessions the replicas released."""
        if self._scaling is not None:
            await self._scaling.stop()
        await self.front.stop()
        released = await stop_deployment(self.config, self.router, self.controller)
        self.controller = None
        if self._started_ray:
            ray.shutdown()
        return released


async def named_actor(name: str, namespace: str):
    """The live actor named ``name`` in ``namespace``, or None."""
    try:
        return await asyncio.to_thread(ray.get_actor, name, namespace)
    except ValueError:
        return None


async def stop_deployment(config: ServeConfig, router, controller: ControllerClient | None) -> int:
    """The clean stop of a deployment: the controller releases every session and ends the
    replicas and stores (without a controller, they are taken over here and stopped the same
    way), then the controller, the response store and the router end. Returns the sessions
    released."""
    released = 0
    if controller is not None:
        try:
            released = await controller.stop()
        except Exception as exc:  # noqa: BLE001 - a dead controller: its replicas are stopped here
            log.warning("the controller did not stop the replicas: %s", exc)
            controller = None
    if controller is None and router is not None:
        fleet = Fleet(config, router)
        await fleet.adopt()
        released = await fleet.stop()
    namespace = config.namespace
    for name in (CONTROLLER_NAME, RESPONSES_NAME):
        handle = await named_actor(name, namespace)
        if handle is not None:
            kill(handle)
    if router is not None:
        kill(router)
    return released
