"""The types the gateways (and the serve process) share with the control plane: what the router
answers across Ray. ``Route``: where a session lives (its replica, with the typed calls to it);
``ReplicaView``: what the router knows of a replica, never pool internals; ``Drained`` and
``FailoverOutcome``: the answers of a drain and of a replica's death; ``ScalingReport`` and
``FleetView``: what the controller answers. Frozen values, made by the
router and read by everyone else; nothing here reaches into the router's tables.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from replica.actor.client import ReplicaClient
from replica.api import PoolSnapshot, SessionInfo

ROUTER_NAME = "session-router"  # the router actor's name in serve's Ray namespace
CONTROLLER_NAME = "session-router-controller"  # supervision and autoscaling, same namespace


class ReplicaHealth(enum.IntEnum):
    """Values match ``session_router.v1.ReplicaState``."""

    UNSPECIFIED = 0
    HEALTHY = 1
    DRAINING = 2  # keeps its sessions, takes no new ones
    DEAD = 3


@dataclass(frozen=True, slots=True)
class ReplicaView:
    replica_id: str
    node_id: str
    health: ReplicaHealth
    snapshot: PoolSnapshot | None  # the latest one the replica pushed
    snapshot_age_s: float
    sessions_pinned: int  # sessions the router's table pins to this replica
    mamba_slots_per_session: int  # 1 + mamba track buffers
    kv_tokens_per_session: int  # KV budget a new session is expected to need (placement)
    sessions_lost: int = 0  # sessions the router released because this replica died
    sessions_migrated: dict[str, int] = field(default_factory=dict)  # moved away, by reason
    sessions_moving: int = 0  # sessions moving away from it now (migration, failover)
    # the router's calls to it that raised, by (method, kind): router.call_errors
    call_errors: dict[tuple[str, str], int] = field(default_factory=dict)

    def _free(self, pool: str) -> int:
        """Slots of ``pool`` a new session can take in the latest snapshot: the free ones and
        those cached states hold (the replica evicts them for any session that needs room); 0
        without a snapshot or without that pool."""
        if self.snapshot is None:
            return 0
        try:
            stats = self.snapshot.pool(pool)
        except KeyError:
            return 0
        return stats.free + stats.cached

    @property
    def free_mamba(self) -> int:
        return self._free("mamba")

    @property
    def free_req(self) -> int:
        return self._free("req")

    @property
    def free_kv_tokens(self) -> int:
        return self._free("kv_tokens")

    @property
    def parks(self) -> bool:
        """Whether the replica has a host tier to park sessions in."""
        return self.snapshot is not None and any(
            stats.pool == "host_mamba" for stats in self.snapshot.pools
        )

    @property
    def free_host_mamba(self) -> int:
        """Sessions the replica can still park (0 on a replica without parking)."""
        return self._free("host_mamba")


@dataclass(frozen=True, slots=True)
class Route:
    session_id: str
    replica_id: str
    handle: Any
    info: SessionInfo | None = None
    tenant: str = ""  # the owner; a cached route is only used for this tenant

    @property
    def replica(self) -> ReplicaClient:
        """The typed calls to the replica holding the session."""
        return ReplicaClient(self.handle)


@dataclass(frozen=True, slots=True)
class Drained:
    """A drain's answer: the replica as it is now, sessions moved off it, sessions left on it."""

    replica: ReplicaView
    sessions_migrated: int = 0
    sessions_left: int = 0


@dataclass(frozen=True, slots=True)
class FailoverOutcome:
    """What became of a dead replica's sessions: ``restored`` (session id -> the committed
    tokens it continues at, on a live replica) and ``lost`` (their state is gone)."""

    restored: dict[str, int] = field(default_factory=dict)
    lost: tuple[str, ...] = ()


@dataclass(slots=True)
class ScalingReport:
    """What the autoscaler goes by and what it did: the replicas the cluster should have, the
    free session room it last counted, and its steps so far by (direction, reason)."""

    desired: int
    room: int = 0
    steps: dict[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FleetView:
    """The controller's replicas (id -> handle) and their checkpoint stores, the ids still
    starting, the replica count it keeps, and how many replicas and stores it replaced."""

    replicas: dict[str, Any]
    stores: dict[str, Any]
    starting: frozenset[str]
    target: int
    replicas_replaced: int
    stores_replaced: int
