"""``Autoscaler``: the number of replicas follows session pressure, within
``--min-replicas``..``--max-replicas`` (on when the two differ).

Every ``interval_s`` (a second) it reads the router's views and counts the cluster's free session
room: the new sessions its healthy replicas can still take, in GPU slots and in the host tier
(``router.control.placement.session_room``).

- Up: when the room has stayed below ``--scale-up-free-sessions`` for ``--scale-up-after-s``, no
  replica is starting and fewer than the most are live, the target grows by one and the
  ``ReplicaSupervisor`` starts the replica. A replica that no node can hold stays pending, which
  is what Ray's autoscaler acts on (KubeRay: it adds a GPU worker, the replica starts there);
  ``--replica-start-timeout-s`` bounds the wait, and a start that fails is tried again.
- Down: when more than the fewest are live, none is starting, and the room of the others has
  stayed at least twice ``--scale-up-free-sessions`` for ``--scale-down-after-s`` without an
  idle replica (one holding no session), that replica is drained (it takes no new session),
  checked empty, retired at the router (it leaves ListReplicas and /metrics, never counted
  dead) and stopped; the target shrinks by one. No session is ever cut: a replica that holds one
  is not removed (without migration between replicas, a busy replica stays until it is idle),
  and one that gained a session while it drained is resumed.

Each step is logged with why, and counted in ``session_router_scaling_steps_total{direction,
reason}``; ``session_router_replicas_desired`` and ``session_router_free_session_room`` show
what the autoscaler goes by.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import ray

from replica.api import ActorError, PoolSnapshot
from router.config import ScalingConfig
from router.control.placement import is_healthy, session_room
from router.control.views import ReplicaView
from router.gateway.router_client import RouterClient
from router.ops.periodic import Periodic
from router.ops.scaling_metrics import ScalingMetrics
from router.ops.supervisor import ReplicaSupervisor

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30.0


class Autoscaler:
    def __init__(
        self,
        config: ScalingConfig,
        bounds: tuple[int, int],
        replicas: dict[str, Any],
        starting: set[str],
        supervisor: ReplicaSupervisor,
        router: RouterClient,
        metrics: ScalingMetrics,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``bounds``: (fewest, most) replicas; ``replicas``/``starting``: the serve process's
        own map of replica handles and the ids still starting (shared with the supervisor,
        whose ``target`` this changes)."""
        self.config = config
        self.fewest, self.most = bounds
        self.replicas = replicas
        self.starting = starting
        self.supervisor = supervisor
        self.router = router
        self.metrics = metrics
        self.clock = clock
        self._low_since: float | None = None  # room below the threshold since
        self._spare_since: float | None = None  # an idle replica's room unneeded since
        self.rounds = Periodic("the autoscaler", self.step, interval_s)

    def start(self) -> None:
        self.rounds.start()

    async def stop(self) -> None:
        await self.rounds.stop()

    async def step(self) -> None:
        """One round: look at the room, and add or remove at most one replica."""
        views = await self.router.call("views", retry=False)
        if isinstance(views, ActorError):
            return  # the router is restarting
        views = [v for v in views if v.replica_id in self.replicas]
        room = sum(session_room(v) for v in views)
        self.metrics.observe(room, self.supervisor.target)
        now, threshold = self.clock(), self.config.scale_up_free_sessions
        self._low_since = (self._low_since or now) if room < threshold else None
        idle = self._idle(views, room, 2 * threshold)
        self._spare_since = (self._spare_since or now) if idle else None
        if self.starting or len(self.replicas) < self.supervisor.target:
            return  # one step at a time: a replica on its way changes the room
        live = len(self.replicas)
        if self._low_since is not None and now - self._low_since >= self.config.scale_up_after_s:
            if live < self.most:
                why = f"free session room {room} < {threshold} for {now - self._low_since:.0f}s"
                self._low_since = None
                self._scaled("up", "free_room_low", why, live + 1)
        elif idle is not None and now - self._spare_since >= self.config.scale_down_after_s:
            if live > self.fewest:
                self._spare_since = None
                await self._remove(idle, room)

    def _idle(self, views: list[ReplicaView], room: int, needed: int) -> ReplicaView | None:
        """A replica holding no session whose room the others can spare (their room is at
        least ``needed`` without it); the one with the least room, then the last by id."""
        idle = [
            v
            for v in views
            if is_healthy(v) and v.sessions_pinned == 0 and v.snapshot.open_sessions == 0
        ]
        spare = [v for v in idle if room - session_room(v) >= needed]
        return min(spare, key=lambda v: (session_room(v), v.replica_id), default=None)

    def _scaled(self, direction: str, reason: str, why: str, replicas: int) -> None:
        if direction == "up":
            self.supervisor.target += 1
        self.metrics.step(direction, reason)
        self.metrics.desired.set(self.supervisor.target)
        log.warning("autoscaler: scaling %s to %d replicas: %s", direction, replicas, why)

    async def _remove(self, view: ReplicaView, room: int) -> None:
        """Drain the idle replica, and remove it if it is still empty; else take it back."""
        replica_id = view.replica_id
        handle = self.replicas[replica_id]
        await self.router.call("drain", replica_id)
        snap: PoolSnapshot | ActorError = await handle.snapshot.remote(True)
        retired = False
        if isinstance(snap, PoolSnapshot) and snap.open_sessions == 0:
            retired = await self.router.call("retire_replica", replica_id)
        if retired is not True:
            log.info("autoscaler: %s gained a session while it drained; it stays", replica_id)
            await self.router.call("drain", replica_id, False)
            return
        del self.replicas[replica_id]
        self.supervisor.target -= 1
        others = room - session_room(view)
        why = f"{replica_id} was idle and the others' free session room is {others}"
        self._scaled("down", "idle", why, len(self.replicas))
        await stop_replica(handle)


async def stop_replica(handle: Any) -> None:
    """Shut a replica down (it releases what it holds) and end its actor."""
    call: Awaitable = handle.shutdown.remote()
    try:
        await asyncio.wait_for(call, timeout=STOP_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - it is going either way
        log.info("shutdown of a removed replica: %s", exc)
    ray.kill(handle, no_restart=True)
