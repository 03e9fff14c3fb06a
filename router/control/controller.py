"""``Controller``: the deployment's supervision and autoscaling, as a detached named actor of the
namespace (``CONTROLLER_NAME``), so that they go on while no ``serve`` runs.

It builds and owns the ``Fleet`` (the replica actors and their checkpoint stores), the
``ReplicaSupervisor`` (a dead replica is replaced; with checkpoints on, its ``StoreKeeper``
replaces dead stores) and, with ``--min-replicas`` below ``--max-replicas``, the ``Autoscaler``.
At start it takes over the replicas the router knows (a controller Ray restarted after its node
died finds them all) and starts the missing ones; then its rounds run until ``stop``.

``serve`` makes it (or finds it) and calls ``attach`` with its own settings; ``stop`` (a clean
stop of ``serve``, or ``session-router stop``) releases every session and ends every replica and
store; the caller then ends the controller and the router. A crash of ``serve`` ends nothing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from router.config import ServeConfig
from router.control.api import FleetView, ScalingReport
from router.control.autoscaler import Autoscaler
from router.control.client import RouterClient
from router.control.fleet import Fleet
from router.control.reattach import known_replicas
from router.control.scheduling import ReplicaStartError
from router.control.store_keeper import StoreKeeper
from router.control.supervisor import ReplicaSupervisor

log = logging.getLogger(__name__)


class Controller:
    def __init__(
        self, config: ServeConfig, router: Any, failpoints: frozenset[str] = frozenset()
    ) -> None:
        """``config``: the deployment's settings; ``failpoints``: those of the deploying
        environment (this actor's is not the operator's), switched on in the replicas this start
        brings up, never in later replacements (a replica a failpoint kills is replaced by a
        healthy one, not by another that dies the same way)."""
        self.config = config
        self._start_failpoints = failpoints
        self.fleet = Fleet(config, router)
        router_client = RouterClient(router)
        checkpoints = config.replica.session_checkpoints
        keeper = StoreKeeper(self.fleet, router_client) if checkpoints else None
        self.supervisor = ReplicaSupervisor(
            self.fleet, lambda: router_client.views(retry=False), config.replicas, stores=keeper
        )
        self.autoscaler = (
            Autoscaler(
                config.scaling,
                (config.fewest_replicas, config.most_replicas),
                self.fleet,
                self.supervisor,
                router_client,
            )
            if config.autoscaling
            else None
        )
        self._began = asyncio.get_running_loop().create_task(self._begin())

    async def _begin(self) -> Exception | None:
        """Take over the router's replicas, start the missing ones, then run the rounds (even
        when the start failed: the supervisor tries again, unless the caller stops it all).
        Returns why the start failed, or None."""
        error: Exception | None = None
        try:
            await self.fleet.adopt()
            known = len(self.fleet.replicas)
            if known:  # a restarted controller keeps the count it kept, within the bounds
                cfg = self.config
                self.supervisor.target = min(max(known, cfg.fewest_replicas), cfg.most_replicas)
                log.warning("took over %d replica(s) with their sessions", known)
            missing = self.supervisor.target - known
            if missing > 0:
                await self.fleet.start(missing, failpoints=self._start_failpoints)
        except (ReplicaStartError, ValueError) as exc:
            error = exc
        self.supervisor.start()
        if self.autoscaler is not None:
            self.autoscaler.start()
        return error

    async def attach(
        self, config: ServeConfig, failpoints: frozenset[str] = frozenset()
    ) -> Exception | None:
        """A ``serve`` with ``config`` joins this deployment: None once the deployment serves
        it (the router knows every replica named in the namespace: a restarted router would
        answer NOT_FOUND for the sessions of one it has not heard from yet; more replicas
        started when it asks for more, with ``failpoints``; a failure removes only those), else
        the error to end it with (``ValueError``: another model or other pool sizes;
        ``ReplicaStartError``: a replica it asked for did not start)."""
        error = await asyncio.shield(self._began)
        if error is not None:
            return error
        try:  # a router Ray restarted (a head restart) learns its replicas again first
            await known_replicas(self.fleet.router, self.config.namespace)
        except ValueError as exc:
            return exc
        ours, theirs = self.config, config
        mine = (ours.replica.model_name, *pool_sizes(ours))
        asked = (theirs.replica.model_name, *pool_sizes(theirs))
        if mine != asked:
            return ValueError(
                f"namespace {ours.namespace!r} already runs a deployment that serves {mine[0]} "
                f"(context, mamba slots and KV tokens per session: {mine[1:]}); this serve asks "
                f"for {asked[0]} ({asked[1:]}): start it with the same settings, or stop that "
                "deployment first (session-router stop)"
            )
        missing = theirs.replicas - len(self.fleet.replicas)
        if missing > 0 and theirs.replicas > self.supervisor.target:
            try:
                await self.fleet.start(missing, theirs.replica_gpus, theirs.replica_start_timeout_s)
            except ReplicaStartError as exc:
                return exc
            self.supervisor.target = theirs.replicas
        return None

    async def fleet_view(self) -> FleetView:
        fleet = self.fleet
        return FleetView(
            replicas=dict(fleet.replicas),
            stores=dict(fleet.stores),
            starting=frozenset(fleet.starting),
            target=self.supervisor.target,
            replicas_replaced=self.supervisor.replaced,
            stores_replaced=keeper.replaced if (keeper := self.supervisor.stores) else 0,
        )

    async def scaling(self) -> ScalingReport:
        if self.autoscaler is not None:
            return self.autoscaler.report
        return ScalingReport(desired=self.supervisor.target)

    async def start_replicas(
        self, count: int, failpoints: frozenset[str] = frozenset()
    ) -> list[str]:
        """``count`` more replicas beyond the kept count (the supervisor leaves extra ones
        alone), with ``failpoints`` on in them (tests and chaos runs); raises
        ``ReplicaStartError`` when they do not start."""
        await asyncio.shield(self._began)
        return await self.fleet.start(count, failpoints=failpoints)

    async def stop(self) -> int:
        """End the rounds, release every session and end every replica and store; returns how
        many sessions the replicas released. Idempotent (a second stop releases 0)."""
        await asyncio.shield(self._began)
        if self.autoscaler is not None:
            await self.autoscaler.stop()
        await self.supervisor.stop()
        return await self.fleet.stop()


def pool_sizes(config: ServeConfig) -> tuple[int, int, int]:
    """What a session's state is shaped by: context, mamba slots and KV tokens per session."""
    pools = config.replica.pools
    return pools.max_context, pools.mamba_slots_per_seq, pools.kv_tokens_per_session
