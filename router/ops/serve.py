"""``session-router serve``: Ray, the cluster's actors (the router, the replicas) and one gateway
(gRPC and /metrics, ``router.ops.gateway_server``), started in order and stopped cleanly (sessions
released, Ray stopped).

The actors belong to the cluster, not to the gateway: more gateways join with ``session-router
gateway --address ADDR`` (the Ray address serve prints, ``router.ops.join``), any gateway serves
any session, and a gateway's death loses no session. This process owns the actors: it starts
them, replaces dead replicas and stops them on SIGINT or SIGTERM.

Without ``address`` a new embedded local Ray instance is started, every port on loopback;
``address="auto"`` or ``HOST:PORT`` joins a running cluster (``router.ops.ray_join``).
Replica actors ask for ``replica_gpus`` GPUs each, or CPU replicas for a share of the cluster's
CPUs (``router.ops.scheduling``); start-up fails with a report rather than waiting forever for
replicas that cannot be scheduled. Once up, ``ReplicaSupervisor`` replaces dead replicas (and
its ``StoreKeeper`` dead checkpoint stores). gRPC and
metrics listen on ``--host`` (loopback by default); with ``--tls-cert`` gRPC serves TLS only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from replica.actor.client import ReplicaClient
from replica.actor.router_reports import RouterReports
from replica.api import ActorError
from router.config import ServeConfig
from router.control.api import ROUTER_NAME
from router.control.autoscaler import Autoscaler
from router.control.checkpoint_stores import start_store
from router.control.client import RouterClient
from router.control.response_store import RESPONSES_NAME, ResponseStore
from router.control.router import SessionRouter
from router.control.scaling_metrics import ScalingMetrics
from router.control.store_keeper import StoreKeeper
from router.control.supervisor import ReplicaSupervisor
from router.gateway.gateway import Gateway
from router.ops import ray_join
from router.ops.gateway_server import GatewayServer
from router.ops.reattach import known_replicas
from router.ops.scheduling import replica_resources, wait_until_up

log = logging.getLogger(__name__)


def quiet_ray_start_up() -> None:
    """Ray announces at every start that it enabled its token authentication, which is what we
    want; the warning would only alarm the operator, so it is kept to errors."""
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
        logging.ERROR
    )


REPLICA_SHUTDOWN_TIMEOUT_S = 10.0


async def stop_replicas(handles: list) -> int:
    """Release every replica's sessions, all replicas at once, within one bound: shutdown takes
    ``REPLICA_SHUTDOWN_TIMEOUT_S`` at most whatever the replica count (one at a time it took up
    to that bound per replica, past a pod's grace period with a few hung replicas). Returns how
    many sessions they released; a replica that is dead or does not answer in time counts 0."""

    async def stop_one(handle) -> int:
        try:
            return await asyncio.wait_for(
                ReplicaClient(handle).shutdown(), REPLICA_SHUTDOWN_TIMEOUT_S
            )
        except Exception as exc:  # noqa: BLE001 - a dead replica has nothing to release
            log.warning("replica shutdown failed: %s", exc)
            return 0

    return sum(await asyncio.gather(*(stop_one(handle) for handle in handles)))


class Server:
    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.front = GatewayServer(config.gateway, cluster_metrics=True)
        self._started_ray = False
        self.router = None
        self.responses = None  # the cluster's stored responses (the HTTP Responses API)
        self.attached = False  # found a deployment in the namespace instead of making one
        self.replicas: dict[str, object] = {}
        self.stores: dict[str, object] = {}  # each replica's checkpoint store
        self.starting: set[str] = set()
        self._replica_ids = itertools.count()
        self.supervisor: ReplicaSupervisor | None = None
        self.autoscaler: Autoscaler | None = None

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
        self.supervisor = ReplicaSupervisor(
            self.replicas,
            self.starting,
            lambda: self.gateway.router.views(retry=False),
            self.start_replicas,
            cfg.replicas,
            stores=StoreKeeper(
                self.replicas,
                self.stores,
                self.starting,
                RouterClient(self.router),
                cfg.namespace,
                cfg.router.checkpoint_dir,
            )
            if cfg.replica.session_checkpoints
            else None,
        )
        self.supervisor.start()
        scaling_metrics = ScalingMetrics(self.front.registry, cfg.replicas)
        if cfg.autoscaling:
            self.autoscaler = Autoscaler(
                cfg.scaling,
                (cfg.fewest_replicas, cfg.most_replicas),
                self.replicas,
                self.stores,
                self.starting,
                self.supervisor,
                RouterClient(self.router),
                scaling_metrics,
            )
            self.autoscaler.start()

    async def attach_or_deploy(self) -> None:
        """Attach to the deployment in ``--namespace`` when there is one (a ``serve`` that
        crashed left it running: every session continues), else deploy one: the router, the
        response store and ``--replicas`` replicas, all detached, so that no process's death but
        their own ends them. Raises ``ValueError`` when the deployment found serves another
        model or other pool sizes (saying what differs and how to stop it)."""
        cfg = self.config
        try:
            self.router = await asyncio.to_thread(ray.get_actor, ROUTER_NAME, cfg.namespace)
        except ValueError:
            self.router = None
        if self.router is not None:
            await self._attach()
        else:
            self.router = self._detached(SessionRouter, ROUTER_NAME, max_restarts=-1,
                                         max_concurrency=10_000).remote(cfg.router)  # fmt: skip
        # restarted by Ray when its node dies (a head restart), empty: stored responses are a
        # cache of the HTTP Responses API, not a session's state
        self.responses = self._detached(ResponseStore, RESPONSES_NAME, max_restarts=-1).remote(
            cfg.gateway.max_stored_responses, cfg.gateway.response_ttl_s
        )
        missing = cfg.replicas - len(self.replicas)
        if missing > 0:
            await self.start_replicas(missing)

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

    async def _attach(self) -> None:
        await self.adopt(self.router)
        for replica_id, handle in self.replicas.items():
            await self._check_same(replica_id, handle)
        log.warning(
            "attached to the deployment in namespace %s: %d replica(s) with their sessions",
            self.config.namespace,
            len(self.replicas),
        )

    async def adopt(self, router) -> None:
        """Take over the deployment of ``router``: its replicas, their checkpoint stores and
        the response store, as if this process had started them (supervision, stop)."""
        namespace = self.config.namespace

        async def named(name: str):
            try:
                return await asyncio.to_thread(ray.get_actor, name, namespace)
            except ValueError:
                return None

        self.router = router
        self.replicas = await known_replicas(router, namespace)
        stores = await RouterClient(router).checkpoint_stores()
        if isinstance(stores, ActorError):
            raise ValueError(f"the deployment's router did not answer: {stores.message}")
        # the router's are the current ones (a replacement has a name of its own); none for a
        # replica: checkpoints off, or its store is gone (the keeper replaces it)
        self.stores.update((rid, store) for rid, store in stores.items() if rid in self.replicas)
        self.responses = await named(RESPONSES_NAME)
        numbers = [int(r.rsplit("-", 1)[1]) for r in self.replicas if r.rsplit("-", 1)[1].isdigit()]
        self._replica_ids = itertools.count(max(numbers, default=-1) + 1)
        self.attached = True

    async def _check_same(self, replica_id: str, handle) -> None:
        """Raises ``ValueError`` when the replica serves another model or other pool sizes
        than this serve's flags ask for."""
        cfg, pools = self.config, self.config.replica.pools
        replica = ReplicaClient(handle)
        card, desc = await replica.model_card(), await replica.describe()
        theirs = (card.name, desc.max_context, desc.mamba_slots_per_session,
                  desc.kv_tokens_per_session)  # fmt: skip
        ours = (cfg.replica.model_name, pools.max_context, pools.mamba_slots_per_seq,
                pools.kv_tokens_per_session)  # fmt: skip
        if theirs != ours:
            raise ValueError(
                f"namespace {cfg.namespace!r} already runs a deployment whose {replica_id} "
                f"serves {theirs[0]} (context, mamba slots and KV tokens per session: "
                f"{theirs[1:]}); this serve asks for {ours[0]} ({ours[1:]}): start it with "
                "the same settings, or stop that deployment first (session-router stop)"
            )

    def replica_threads(self) -> int:
        """Torch threads per replica: the setting, else CPU replicas share the cores (one is
        left to the gateway, the router and Ray)."""
        cfg = self.config
        if cfg.replica.threads or cfg.replica_gpus:
            return cfg.replica.threads or 1
        return max(1, ((os.cpu_count() or 1) - 1) // cfg.most_replicas)

    async def start_replicas(self, count: int) -> list[str]:
        """Start ``count`` replicas with fresh ids and register them with the router; raises
        ``ReplicaStartError`` (saying why) when they are not up within the start-up bound."""
        from replica.actor import ReplicaActor

        cfg = self.config
        threads = self.replica_threads()
        replica_config = dataclasses.replace(cfg.replica.with_env_failpoints(), threads=threads)
        ask = replica_resources(cfg.replica_gpus, cfg.most_replicas)
        ids = [f"replica-{next(self._replica_ids)}" for _ in range(count)]
        self.starting.update(ids)
        try:
            for replica_id in ids:
                self.replicas[replica_id] = (
                    ray.remote(ReplicaActor)
                    .options(
                        name=replica_id,
                        namespace=cfg.namespace,
                        lifetime="detached",
                        num_gpus=ask["GPU"],
                        num_cpus=ask["CPU"],
                        max_concurrency=10_000,
                        runtime_env={"env_vars": {"OMP_NUM_THREADS": str(threads)}},
                    )
                    .remote(replica_id, replica_config, self.router)
                )
            descs = await wait_until_up(
                {r: ReplicaClient(self.replicas[r]).describe() for r in ids},
                ask,
                cfg.replica_start_timeout_s,
            )
            if cfg.replica.session_checkpoints:  # all at once: each is a process to start
                stores = await asyncio.gather(*(
                    start_store(r, self.replicas[r], descs[r].node_id, cfg.namespace, 0,
                                cfg.router.checkpoint_dir) for r in ids
                ), return_exceptions=True)  # fmt: skip
                self.stores.update(
                    (r, store)
                    for r, store in zip(ids, stores)
                    if not isinstance(store, BaseException)
                )  # kept so that a failure below removes them too
                for store in stores:
                    if isinstance(store, BaseException):
                        raise store
            snaps = await asyncio.gather(*(ReplicaClient(self.replicas[r]).snapshot() for r in ids))
            for replica_id, snap in zip(ids, snaps):
                await RouterReports(self.router).register_replica(
                    replica_id=replica_id,
                    handle=self.replicas[replica_id],
                    desc=descs[replica_id],
                    tenants={},
                    snapshot=snap,
                    checkpoints=self.stores.get(replica_id),
                )
        except BaseException:
            for replica_id in ids:  # none of them half-started: they would hold resources
                for handles in (self.replicas, self.stores):
                    handle = handles.pop(replica_id, None)
                    if handle is not None:
                        ray.kill(handle, no_restart=True)
            raise
        finally:
            self.starting.difference_update(ids)
        log.info("started %d replicas", count)
        return ids

    async def undo_start(self) -> None:
        """After a start that failed: remove what this start made and nothing more. A
        deployment it attached to keeps serving its sessions (the replicas this start added were
        removed by ``start_replicas``); one it made is stopped whole."""
        if not self.attached:
            await self.stop()
            return
        await self.front.stop()
        if self._started_ray:
            ray.shutdown()  # leaves the cluster: its detached actors go on

    async def stop(self) -> int:
        """Stop serving, release every replica's sessions, stop the actors (and an embedded
        Ray); returns how many sessions the replicas released."""
        if self.autoscaler is not None:
            await self.autoscaler.stop()
        if self.supervisor is not None:
            await self.supervisor.stop()
        await self.front.stop()
        released = await stop_replicas(list(self.replicas.values()))
        for handle in [*self.replicas.values(), *self.stores.values(), self.router,
                       self.responses]:  # fmt: skip
            if handle is not None:
                try:
                    ray.kill(handle, no_restart=True)
                except Exception as exc:  # noqa: BLE001 - a store its failover ended already
                    log.info("kill at shutdown: %s", exc)
        self.replicas.clear()
        self.stores.clear()
        if self._started_ray:
            ray.shutdown()
        return released
