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
- Down: when more than the fewest are live, none is starting, and for ``--scale-down-after-s``
  some replica's sessions have fitted in the others' room with at least twice
  ``--scale-up-free-sessions`` to spare (an idle replica, or a lightly loaded one: the one
  holding the fewest sessions is chosen), that replica is drained with migration (the router's
  ``drain(migrate=True)``: it takes no new session, its idle and parked sessions move to the
  others at once, a running turn's session as soon as that turn ends; clients see no error),
  retired at the router once it holds none (it leaves ListReplicas and /metrics, never counted
  dead) and stopped, with its checkpoint store; the target shrinks by one. No session is ever
  cut: a replica whose sessions could not all move within ``--drain-timeout-s`` (no room after
  all) is resumed, keeping those left.

Each step is logged with why, and counted in its ``ScalingReport`` (served on /metrics as
``session_router_scaling_steps_total{direction,reason}``; ``session_router_replicas_desired``
and ``session_router_free_session_room`` show what the autoscaler goes by).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from replica.api import ActorError
from router.config import ScalingConfig
from router.control.api import Drained, ReplicaView, ScalingReport
from router.control.client import RouterClient
from router.control.fleet import Fleet, stop_replica
from router.control.periodic import Periodic
from router.control.placement import is_healthy, session_room
from router.control.supervisor import ReplicaSupervisor

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30.0


class Autoscaler:
    def __init__(
        self,
        config: ScalingConfig,
        bounds: tuple[int, int],
        fleet: Fleet,
        supervisor: ReplicaSupervisor,
        router: RouterClient,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``bounds``: (fewest, most) replicas; ``fleet``: the replicas it counts and removes
        (shared with the supervisor, whose ``target`` this changes)."""
        self.config = config
        self.fewest, self.most = bounds
        self.fleet = fleet
        self.supervisor = supervisor
        self.router = router
        self.report = ScalingReport(desired=supervisor.target)
        self.clock = clock
        self._low_since: float | None = None  # room below the threshold since
        self._spare_since: float | None = None  # a replica's room unneeded since
        self.rounds = Periodic("the autoscaler", self.step, interval_s)

    def start(self) -> None:
        self.rounds.start()

    async def stop(self) -> None:
        await self.rounds.stop()

    async def step(self) -> None:
        """One round: look at the room, and add or remove at most one replica."""
        views = await self.router.views(retry=False)
        if isinstance(views, ActorError):
            return  # the router is restarting
        views = [v for v in views if v.replica_id in self.fleet.replicas]
        room = sum(session_room(v) for v in views)
        self.report.room, self.report.desired = room, self.supervisor.target
        now, threshold = self.clock(), self.config.scale_up_free_sessions
        self._low_since = (self._low_since or now) if room < threshold else None
        spare = self._spare(views, room, 2 * threshold)
        self._spare_since = (self._spare_since or now) if spare else None
        if self.fleet.starting or len(self.fleet.replicas) < self.supervisor.target:
            return  # one step at a time: a replica on its way changes the room
        live = len(self.fleet.replicas)
        if self._low_since is not None and now - self._low_since >= self.config.scale_up_after_s:
            if live < self.most:
                why = f"free session room {room} < {threshold} for {now - self._low_since:.0f}s"
                self._low_since = None
                self._scaled("up", "free_room_low", why, live + 1)
        elif spare is not None and now - self._spare_since >= self.config.scale_down_after_s:
            if live > self.fewest:
                self._spare_since = None
                await self._remove(spare, room)

    def _spare(self, views: list[ReplicaView], room: int, needed: int) -> ReplicaView | None:
        """A replica the others can spare: its sessions fit in their room with at least
        ``needed`` left over. The one holding the fewest sessions (an idle one first), then the
        least room, then the first by id."""
        healthy = [v for v in views if is_healthy(v)]
        spare = [v for v in healthy if room - session_room(v) - _held(v) >= needed]
        return min(spare, key=lambda v: (_held(v), session_room(v), v.replica_id), default=None)

    def _scaled(self, direction: str, reason: str, why: str, replicas: int) -> None:
        if direction == "up":
            self.supervisor.target += 1
        steps = self.report.steps
        steps[direction, reason] = steps.get((direction, reason), 0) + 1
        self.report.desired = self.supervisor.target
        log.warning("autoscaler: scaling %s to %d replicas: %s", direction, replicas, why)

    async def _remove(self, view: ReplicaView, room: int) -> None:
        """Drain the replica with migration; once it holds no session, retire and stop it.
        Sessions left on it (no room for them within the drain's bound): it is resumed."""
        replica_id = view.replica_id
        drained = await self.router.drain(replica_id=replica_id, migrate=True)
        retired: bool | ActorError = False
        if not isinstance(drained, ActorError) and drained.sessions_left == 0:
            retired = await self.router.retire_replica(replica_id=replica_id)
        if retired is not True:
            left = drained.sessions_left if isinstance(drained, Drained) else "some"
            log.warning("autoscaler: %s kept %s sessions in its drain; it stays", replica_id, left)
            await self.router.resume(replica_id=replica_id)
            return
        handle, store = self.fleet.pop(replica_id)
        self.supervisor.target -= 1
        others = room - session_room(view)
        moved = drained.sessions_migrated
        reason = "light_load" if moved else "idle"
        why = f"{replica_id}'s {moved} sessions fitted in the others' free session room {others}"
        self._scaled("down", reason, why, len(self.fleet.replicas))
        await stop_replica(handle, store, STOP_TIMEOUT_S)


def _held(view: ReplicaView) -> int:
    """The sessions a replica holds, as far as the router knows."""
    return max(view.sessions_pinned, view.snapshot.open_sessions if view.snapshot else 0)
