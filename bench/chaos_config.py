"""What a chaos run makes (``ChaosConfig``: sessions, clients, faults of each kind, seed,
bounds), and the ``--quick`` run's (``QUICK``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChaosConfig:
    sessions: int = 2000
    concurrency: int = 32
    replicas: int = 2
    replica_kills: int = 4
    router_kills: int = 2
    store_kills: int = 1  # a dead store is replaced and its sessions checkpointed again
    # the other faults of partial failures: off by default until their runs heal
    # (docs/benchmarks.md)
    replica_stops: int = 0
    migration_kills: int = 0
    drain_kills: int = 0
    seed: int = 0
    heal_timeout_s: float = 120.0
    unprotected_bound_s: float = 60.0  # longest a replica may hold sessions without checkpoints

    @property
    def counts(self) -> dict[str, int]:
        """How many faults of each kind (``KINDS``) the run makes."""
        return {
            "replica": self.replica_kills,
            "router": self.router_kills,
            "store": self.store_kills,
            "stop": self.replica_stops,
            "migration": self.migration_kills,
            "drain": self.drain_kills,
        }


# ``--quick`` (and tests/test_chaos.py): every kind of fault once, in about two minutes
FAULT_COUNTS = (
    "replica_kills",
    "router_kills",
    "store_kills",
    "replica_stops",
    "migration_kills",
    "drain_kills",
)
QUICK = dict(sessions=120, concurrency=12, seed=3, **dict.fromkeys(FAULT_COUNTS, 1))
