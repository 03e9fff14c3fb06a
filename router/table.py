"""The router's tables: what it keeps per replica and per session, and the ``Route`` it hands to
gateways. Owned by the ``SessionRouter`` actor; gateways see only ``Route`` and ``ReplicaView``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from replica.outputs import ReplicaDescription, SessionInfo
from replica.pools.accounting import PoolSnapshot
from router.views import ReplicaHealth, ReplicaView


@dataclass(slots=True, eq=False)
class ReplicaEntry:
    handle: Any
    desc: ReplicaDescription
    health: ReplicaHealth = ReplicaHealth.HEALTHY
    snapshot: PoolSnapshot | None = None
    reported_at: float = field(default_factory=time.monotonic)
    pinned: set[str] = field(default_factory=set)
    reserved: int = 0  # sessions placed since the latest snapshot
    lost: int = 0  # sessions lost when the replica died

    def view(self, replica_id: str) -> ReplicaView:
        """What the router hands out about this replica (placement, metrics, ListReplicas)."""
        age = time.monotonic() - self.reported_at if self.snapshot else 0.0
        return ReplicaView(
            replica_id,
            self.desc.node_id,
            self.health,
            self.snapshot,
            age,
            len(self.pinned),
            self.desc.mamba_slots_per_session,
            self.desc.kv_tokens_per_session,
            self.lost,
        )


@dataclass(slots=True)
class SessionEntry:
    replica_id: str
    tenant: str
    last_active: float


@dataclass(frozen=True, slots=True)
class Route:
    session_id: str
    replica_id: str
    handle: Any
    info: SessionInfo | None = None
    tenant: str = ""  # the owner; a cached route is only used for this tenant
